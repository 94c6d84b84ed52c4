"""Padding-free batches, hidden states offloaded to the host, --calib-seq-len capped at the model's positions."""

from __future__ import annotations

import json

import pytest
import torch

from quantize_cli.calibration import calibrate, forward, hooks, offload_decision
from quantize_cli.checkpoint.source import open_source
from quantize_cli.errors import UsageError
from quantize_cli.modules.recipe import load_recipe
from tests.calibration import builders

# two lengths: the three 10-token samples share a batch, the two 6-token ones another, the 4-token one runs alone
SAMPLES = [[5, 17, 99, 3, 250, 7, 8, 9, 310, 1], [42, 43, 44, 45, 46, 47], [1, 2, 3, 200, 100, 50, 25, 12, 6, 3],
           [9, 8, 7, 6, 5, 4, 3, 2, 1, 0], [300, 301, 302, 303, 304, 305], [11, 22, 33, 44]]


def _jsonl(path, samples=SAMPLES) -> str:
    with open(path, "w") as f:
        for s in samples:
            f.write(json.dumps({"input_ids": s}) + "\n")
    return str(path)


def _calibrate(folder, data, **kw):
    src = open_source(folder)
    return calibrate(src, load_recipe(None, src.config.get("model_type")), data, samples=16, seq_len=64, **kw)


def test_batches_are_padding_free():
    groups = forward.batches(SAMPLES, batch_tokens=20)
    assert [[len(s) for s in g] for g in groups] == [[10, 10], [10], [6, 6], [4]]
    assert sorted(map(tuple, (s for g in groups for s in g))) == sorted(map(tuple, SAMPLES))  # each sample once
    assert forward.batches(SAMPLES, batch_tokens=1) == [[s] for s in SAMPLES[:1] + SAMPLES[2:4] + SAMPLES[1:2] + SAMPLES[4:]]


@pytest.mark.parametrize("build, prefix", [(builders.llama, "model"), (builders.qwen3_moe, "model"), (builders.bert, "")])
def test_batched_streamed_equals_whole_model_same_batches(tmp_path, build, prefix):
    """Batched layer streaming records exactly what hooks record in whole-model forwards of the same batches."""
    from transformers import AutoModel

    folder = build(str(tmp_path / "src"))
    doc = _calibrate(folder, _jsonl(tmp_path / "c.jsonl"))
    assert doc.run["batches"] == 3
    hooks.register()
    model = AutoModel.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation=hooks.IMPL).eval()
    for mod in model.modules():
        if hasattr(getattr(mod, "config", None), "_experts_implementation"):
            mod.config._experts_implementation = hooks.IMPL
    ref = hooks.Recorder()
    hooks.attach(ref, model, prefix, {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"})
    with hooks.active(ref), torch.no_grad():
        for group in forward.batches(SAMPLES):
            model(input_ids=torch.tensor(group))
    assert set(doc.modules) == set(ref.inputs)
    for name, stat in ref.inputs.items():
        assert doc.modules[name] == {"amax": stat.amax, "tokens": stat.tokens}, name
    assert {k: (v["k_amax"], v["v_amax"], v["tokens"]) for k, v in doc.kv.items()} == \
        {k: (v["k"].amax, v["v"].amax, v["k"].tokens) for k, v in ref.kv.items()}


def test_batched_close_to_one_at_a_time(tmp_path):
    """Batching changes only bf16 kernel rounding: every amax within 2% of batch 1, the same token counts."""
    folder = builders.llama(str(tmp_path / "src"))
    data = _jsonl(tmp_path / "c.jsonl")
    batched, single = _calibrate(folder, data), _calibrate(folder, data, batch_tokens=1)
    assert single.run["batches"] == len(SAMPLES) and batched.run["batches"] == 3
    for name, e in single.modules.items():
        assert batched.modules[name]["tokens"] == e["tokens"] == sum(map(len, SAMPLES)), name
        assert batched.modules[name]["amax"] == pytest.approx(e["amax"], rel=0.02), name


@pytest.mark.parametrize("build", [builders.llama, builders.qwen3_moe, builders.bert])
def test_offloaded_hidden_states_give_identical_scales(tmp_path, build):
    """The offload path (hidden states in host memory between blocks, one batch on the device) is taken
    and changes no amax: on the CPU the arithmetic is the same; on a GPU see test_gpu.py."""
    folder = build(str(tmp_path / "src"))
    data = _jsonl(tmp_path / "c.jsonl")
    kept, moved = _calibrate(folder, data, offload=False), _calibrate(folder, data, offload=True)
    assert moved.run["activations_on"] == "host"
    assert moved.modules == kept.modules and moved.kv == kept.kv


def test_offload_decision_and_budget():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert offload_decision(cpu, 10**6, 10**7, None) is False  # the CPU's states are host memory already
    assert offload_decision(gpu, 10**9, None, True) is True  # forced (no GPU call when told)
    with pytest.raises(UsageError, match=r"--memory-budget 1000000: .* offloaded from cuda to host memory"):
        offload_decision(gpu, 10**9, 10**6, True)
    with pytest.raises(UsageError, match=r"--memory-budget 1000000: .* on the CPU; raise --memory-budget"):
        offload_decision(cpu, 10**9, 10**6, None)
    assert offload_decision(gpu, 10**9, 10**6, False) is False  # states on the device: not host memory


def test_seq_len_capped_at_max_positions(tmp_path):
    """BERT has 128 positions: --calib-seq-len 4096 calibrates at 128 (recorded) instead of failing in the forward."""
    folder = builders.bert(str(tmp_path / "src"))
    long = [list(range(1, 300))]
    doc = _calibrate(folder, _jsonl(tmp_path / "c.jsonl", long))
    assert doc.data["seq_len"] == 64  # the asked 64 is below 128: kept
    src = open_source(folder)
    doc = calibrate(src, load_recipe(None, "bert"), _jsonl(tmp_path / "c.jsonl", long), samples=4, seq_len=4096)
    assert doc.data["seq_len"] == 128 and doc.data["tokens"] == 128
