"""Per-channel E[x_j^2] of every Linear input (the scale search's weights), recorded in the streamed
calibration forward, and SCALES.json version 2 that keeps them in a sidecar safetensors file."""

from __future__ import annotations

import json
import os

import pytest
import torch

from quantize_cli.calibration import hooks, load, stats
from quantize_cli.calibration.channels import sidecar_name
from quantize_cli.calibration.document import ScalesDoc
from quantize_cli.errors import CalibrationError
from tests.calibration import builders
from tests.calibration.test_streamed import SAMPLES, _jsonl, _streamed


def test_channel_energy_sums_every_token_in_chunks():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 1500, 40, generator=g).bfloat16(), torch.randn(700, 40, generator=g) * 1e3  # > CHUNK_TOKENS
    e = stats.ChannelEnergy()
    e.add("m", a)
    e.add("m", b)
    ref = a.double().reshape(-1, 40).square().sum(0) + b.double().square().sum(0)
    assert e.tokens["m"] == 3 * 1500 + 700
    torch.testing.assert_close(e.sums["m"], ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(e.mean_squares()["m"], (ref / 5200).float(), rtol=1e-6, atol=0)
    assert torch.equal(a, a.clone()) and b.abs().max() > 1  # the inputs are untouched
    with pytest.raises(ValueError, match="width 8 after inputs of width 40"):
        e.add("m", torch.ones(2, 8))


def _whole_model_energy(folder: str, prefix: str, samples) -> stats.ChannelEnergy:
    """The same observer on every Linear / expert of the full transformers model (one forward per sample)."""
    from transformers import AutoModel

    hooks.register()
    model = AutoModel.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation=hooks.IMPL).eval()
    for mod in model.modules():
        if hasattr(getattr(mod, "config", None), "_experts_implementation"):
            mod.config._experts_implementation = hooks.IMPL
    energy = stats.ChannelEnergy()
    rec = hooks.Recorder(observers=[energy])
    hooks.attach(rec, model, prefix, {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"})
    with hooks.active(rec), torch.no_grad():
        for s in samples:
            model(input_ids=torch.tensor([s]))
    return energy


@pytest.mark.parametrize("build, prefix", [(builders.llama, "model"), (builders.qwen3_moe, "model"), (builders.bert, "")])
def test_streamed_energy_equals_whole_model(tmp_path, build, prefix):
    """Every Linear (per expert: its routed tokens; BERT's pooler in the tail pass), bit for bit."""
    folder = build(str(tmp_path / "src"))
    doc = _streamed(folder, _jsonl(tmp_path / "c.jsonl"))
    ref = _whole_model_energy(folder, prefix, SAMPLES).mean_squares()
    assert set(doc.channels) == set(ref) and ref
    for name, e in ref.items():
        assert torch.equal(doc.channels[name], e), name
        assert doc.modules[name]["tokens"] > 0 and e.dtype == torch.float32 and e.dim() == 1
    if build is builders.qwen3_moe:  # experts see only their routed tokens: their statistics differ
        a, b = (doc.channels[f"model.layers.0.mlp.experts.{e}.gate_proj"] for e in (0, 1))
        assert not torch.equal(a, b)


def test_scales_file_round_trip_shares_and_checks(tmp_path):
    folder = builders.llama(str(tmp_path / "src"))
    doc = _streamed(folder, _jsonl(tmp_path / "c.jsonl"))
    path = str(tmp_path / "SCALES.json")
    doc.save(path)
    raw = json.load(open(path))
    side = tmp_path / sidecar_name(path)
    assert raw["version"] == 2 and raw["channels"]["file"] == "SCALES.channels.safetensors" and side.is_file()
    q, k, v = (raw["modules"][f"model.layers.1.self_attn.{p}_proj"]["channels"] for p in "qkv")
    assert q == k == v  # one input, stored once
    back = load(path)
    assert back.has_channels and set(back.modules) == set(doc.modules)
    for name in doc.channels:
        assert torch.equal(back.channel_energy(name), doc.channels[name]), name
    from quantize_cli.checkpoint.safetensors_header import read_header

    assert len(read_header(str(side)).tensors) == len({e["channels"] for e in raw["modules"].values()}) < len(raw["modules"])


def _broken(tmp_path, edit) -> str:
    folder = builders.llama(str(tmp_path / "src"))
    path = str(tmp_path / "SCALES.json")
    _streamed(folder, _jsonl(tmp_path / "c.jsonl")).save(path)
    raw = json.load(open(path))
    edit(raw, tmp_path)
    with open(path, "w") as f:
        json.dump(raw, f)
    return path


@pytest.mark.parametrize("edit, rule", [
    (lambda raw, d: (d / "SCALES.channels.safetensors").write_bytes((d / "SCALES.channels.safetensors").read_bytes()[:-4] + b"\0\0\0\0"),
     "not the file it was written with"),
    (lambda raw, d: raw["channels"].update(file="../elsewhere.safetensors"), "must be a file name beside the JSON"),
    (lambda raw, d: raw["channels"].update(statistic="hessian"), "holds 'hessian'"),
    (lambda raw, d: raw["modules"]["model.layers.0.mlp.down_proj"].update(channels="nope"), "down_proj.channels = 'nope' names no tensor"),
    (lambda raw, d: raw.pop("channels"), "there is no \"channels\" file"),
    (lambda raw, d: raw.update(version=3), "version 3 is not supported"),
])
def test_broken_scales_files_are_one_line_errors(tmp_path, edit, rule):
    path = _broken(tmp_path, edit)
    with pytest.raises(CalibrationError, match=rule) as exc:
        load(path)
    assert "SCALES.json" in exc.value.message and "\n" not in exc.value.message


def test_a_missing_sidecar_loads_the_amax_alone(tmp_path):
    """Only the weighted --scale-search reads the channel statistics, and it is refused before torch
    without them (plan/preflight.check_calibration); FP8 / NVFP4 input scales need the amax alone."""
    path = _broken(tmp_path, lambda raw, d: os.remove(d / "SCALES.channels.safetensors"))
    doc = load(path)
    assert not doc.has_channels and doc.channel_energy("model.layers.0.mlp.down_proj") is None
    assert doc.input_amax("model.layers.0.mlp.down_proj") is not None


def test_version_1_is_read_without_channels(tmp_path):
    path = str(tmp_path / "v1.json")
    ScalesDoc({"label": "x", "layout_sha256": "0"}, {}, {}, {"a.q_proj": {"amax": 2.0, "tokens": 3}}, {}).save(path)
    raw = json.load(open(path))
    assert raw["version"] == 2 and "channels" not in raw  # nothing to store: no sidecar
    raw["version"] = 1
    json.dump(raw, open(path, "w"))
    doc = load(path)
    assert not doc.has_channels and doc.channel_energy("a.q_proj") is None and doc.input_amax("a.q_proj") == (2.0, 3)
    assert not os.path.exists(tmp_path / "v1.channels.safetensors")
