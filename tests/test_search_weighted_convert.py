"""--scale-search mse with calibration data, end to end: every module's search is weighted by its own
inputs' E[x_j^2] (fused members share it), --calib-data equals --act-scales, the weighting is
recorded, the data-free search warns, a version-1 scales file makes it data-free, resume sees it."""

from __future__ import annotations

import json
import os

import pytest
import torch

from quantize_cli import api
from quantize_cli.calibration import load
from quantize_cli.errors import PlanError
from quantize_cli.schemes import SCHEMES
from quantize_cli.schemes.searched import with_scale_search
from tests.calibration import builders
from tests.conftest import convert, load_all, output_files

FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """(tiny Llama folder with a tokenizer, its SCALES.json calibrated on the default text)."""
    root = tmp_path_factory.mktemp("weighted")
    src = builders.llama(str(root / "src"), seed=3)
    scales = str(root / "SCALES.json")
    api.calibrate(src, calib_data="default", output=scales, device="cpu", quiet=True)
    return src, scales


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _group_amax(src_tensors: dict, module: str) -> torch.Tensor:
    """The fused group's global amax (q/k/v, gate/up share one weight_scale_2)."""
    prefix, _, leaf = module.rpartition(".")
    members = [f"{prefix}.{m}" for m, g in FUSED.items() if g == FUSED.get(leaf)] or [module]
    return torch.stack([src_tensors[f"{m}.weight"].float().abs().amax() for m in members]).amax()


@pytest.mark.parametrize("algo", ["W4A16_NVFP4", "NVFP4"])
def test_each_module_is_searched_with_its_own_inputs(calibrated, tmp_path, algo):
    """The written bytes are the reference's with that module's E[x_j^2] (q/k/v and gate/up: one
    shared vector), and differ from the data-free search's."""
    src, scales = calibrated
    out = load_all(convert(src, str(tmp_path / "w"), algo=algo, device="cpu", quiet=True, scale_search="mse",
                               act_scales=scales).dst)
    free = load_all(convert(src, str(tmp_path / "f"), algo=algo, device="cpu", quiet=True, scale_search="mse",
                                ).dst)
    doc, source = load(scales), load_all(src)
    searched = with_scale_search(SCHEMES[algo], "mse")
    modules = sorted(n[: -len(".weight_scale_2")] for n in out if n.endswith(".weight_scale_2"))
    assert len(modules) == 21
    moved = 0
    for m in modules:
        cw = doc.channel_energy(m)
        assert cw is not None and cw.numel() == source[f"{m}.weight"].shape[1]
        ref = searched.quantize(source[f"{m}.weight"], _group_amax(source, m), cw)
        for key in ("weight", "weight_scale", "weight_scale_2"):
            assert _bytes(out[f"{m}.{key}"]) == _bytes(ref[key]), (m, key)
        moved += _bytes(out[f"{m}.weight_scale"]) != _bytes(free[f"{m}.weight_scale"])
    assert moved >= len(modules) // 2, f"the weights changed the search of only {moved} modules"
    for leaf in ("k_proj", "v_proj"):  # one input, one vector
        assert torch.equal(doc.channel_energy(f"model.layers.1.self_attn.{leaf}"), doc.channel_energy("model.layers.1.self_attn.q_proj"))


def test_calib_data_equals_act_scales_and_records_the_weighting(calibrated, tmp_path):
    src, scales = calibrated
    a = convert(src, str(tmp_path / "a"), algo="W4A16_NVFP4", device="cpu", quiet=True, scale_search="mse", calib_data="default")
    b = convert(src, str(tmp_path / "b"), algo="W4A16_NVFP4", device="cpu", quiet=True, scale_search="mse", act_scales=scales)
    assert output_files(a.dst) == output_files(b.dst)
    conv = json.load(open(os.path.join(a.dst, "hf_quant_config.json")))["converter"]
    assert conv["scale_search"] == "mse" and conv["scale_search_weights"] == "activations"
    assert not any("search" in w and "calibration data" in w for w in a.report["warnings"])
    assert a.report["options"]["calibration"].startswith("+search:")  # the weights are in the resume fingerprint


def test_data_free_search_warns_and_records_it(calibrated, tmp_path):
    src, _ = calibrated
    res = convert(src, str(tmp_path / "f"), algo="W4A16_NVFP4", device="cpu", quiet=True, scale_search="mse")
    conv = json.load(open(os.path.join(res.dst, "hf_quant_config.json")))["converter"]
    assert conv["scale_search_weights"] == "none"
    warned = [w for w in res.report["warnings"] if w.startswith("--scale-search mse without calibration data")]
    assert len(warned) == 1 and "--calib-data default" in warned[0] and "docs/accuracy.md" in warned[0]
    plain = convert(src, str(tmp_path / "p"), algo="W4A16_NVFP4", device="cpu", quiet=True)
    assert not any("--scale-search" in w for w in plain.report["warnings"])


def test_version_1_file_is_the_data_free_search(calibrated, tmp_path):
    src, scales = calibrated
    raw = json.load(open(scales))
    raw["version"] = 1
    raw.pop("channels")
    for e in raw["modules"].values():
        e.pop("channels")
    v1 = str(tmp_path / "v1.json")
    json.dump(raw, open(v1, "w"))
    a = convert(src, str(tmp_path / "a"), algo="NVFP4", device="cpu", quiet=True, scale_search="mse", act_scales=v1)
    b = convert(src, str(tmp_path / "b"), algo="NVFP4", device="cpu", quiet=True, scale_search="mse", act_scales=scales)
    wa, wb = load_all(a.dst), load_all(b.dst)
    assert any("version-1 scales file" in w for w in a.report["warnings"])
    name = "model.layers.0.mlp.down_proj"
    assert torch.equal(wa[f"{name}.input_scale"], wb[f"{name}.input_scale"])  # the input scales are calibrated all the same
    assert _bytes(wa[f"{name}.weight_scale"]) != _bytes(wb[f"{name}.weight_scale"])
    assert json.load(open(os.path.join(a.dst, "hf_quant_config.json")))["converter"]["scale_search_weights"] == "none"


def test_module_without_statistics_is_refused_before_reading(calibrated, tmp_path):
    src, scales = calibrated
    raw = json.load(open(scales))
    del raw["modules"]["model.layers.2.mlp.down_proj"]["channels"]
    bad = str(tmp_path / "SCALES.json")
    json.dump(raw, open(bad, "w"))
    side = os.path.join(os.path.dirname(scales), "SCALES.channels.safetensors")
    open(os.path.join(tmp_path, "SCALES.channels.safetensors"), "wb").write(open(side, "rb").read())
    with pytest.raises(PlanError) as exc:
        convert(src, str(tmp_path / "o"), algo="W4A16_NVFP4", device="cpu", quiet=True, scale_search="mse", act_scales=bad)
    assert any("model.layers.2.mlp.down_proj: --scale-search mse weights the search" in d and "--exclude" in d
               for d in exc.value.details + [exc.value.message])
    assert not os.path.exists(tmp_path / "o")


def test_without_search_the_data_is_still_ignored_for_w4a16(calibrated, tmp_path):
    src, scales = calibrated
    res = convert(src, str(tmp_path / "o"), algo="W4A16_NVFP4", device="cpu", quiet=True, act_scales=scales)
    assert res.plan.search_weights is None and res.report["options"]["calibration"] is None
    assert json.load(open(os.path.join(res.dst, "hf_quant_config.json")))["converter"].get("scale_search") is None


def synthetic_scales(src: str, path: str, seed: int = 0, no_tokens: tuple[str, ...] = ()) -> str:
    """A version-2 SCALES.json for `src` without a forward: every 2-D Linear weight gets amax 10 and
    random E[x_j^2] over a wide range with a massive channel; `no_tokens` modules saw no token."""
    from quantize_cli.calibration.document import ScalesDoc, fingerprint
    from quantize_cli.checkpoint.source import open_source

    source = open_source(src)
    g = torch.Generator().manual_seed(seed)
    modules, channels = {}, {}
    for name, info in sorted(source.tensors.items()):
        if name.endswith(".weight") and len(info.shape) == 2 and "norm" not in name and "embed" not in name:
            m = name[: -len(".weight")]
            modules[m] = {"amax": 0.0 if m in no_tokens else 10.0, "tokens": 0 if m in no_tokens else 100}
            if m not in no_tokens:
                channels[m] = torch.exp2(torch.randn(info.shape[1], generator=g) * 4)
                channels[m][int(torch.randint(0, info.shape[1], (1,), generator=g))] = 1e6
    ScalesDoc({"label": source.label, **fingerprint(source.config, source.tensors)}, {"spec": "synthetic"}, {}, modules, {},
              channels=channels).save(path)
    return path


def test_experts_without_tokens_take_their_layers_token_weighted_mean(tmp_path):
    from quantize_cli.calibration.search_weights import resolve
    from quantize_cli.calibration.document import ScalesDoc

    layer = "model.layers.0.mlp.experts"
    e = {i: torch.full((4,), float(i + 1)) for i in range(3)}
    doc = ScalesDoc({}, {}, {}, {f"{layer}.{i}.down_proj": {"amax": 1.0, "tokens": t} for i, t in enumerate((10, 30, 0))}, {},
                    channels={f"{layer}.0.down_proj": e[0], f"{layer}.1.down_proj": e[1]})
    res, problems = resolve(doc, {f"{layer}.{i}.down_proj": 4 for i in range(3)}, {})
    assert not problems and res.no_tokens == [f"{layer}.2.down_proj"]
    assert torch.allclose(res.of(f"{layer}.2.down_proj"), torch.full((4,), (1 * 10 + 2 * 30) / 40))
    res, problems = resolve(doc, {f"{layer}.0.down_proj": 5}, {})  # a vector of the wrong length
    assert problems == [f"{layer}.0.down_proj: the calibration run records 4 input channels but the weight has 5 in-features; "
                        "calibrate this source again"]


def test_moe_experts_weighted_per_expert(tmp_path):
    """Per-expert weights reach each expert's search; an expert without tokens is warned about."""
    from quantize_cli.checkpoint.example_weights import qwen3_moe_config, qwen3_moe_tensors, write_checkpoint

    q = qwen3_moe_config()
    src = write_checkpoint(str(tmp_path / "moe"), qwen3_moe_tensors(q, seed=3), q, shards=2)
    quiet = "model.layers.0.mlp.experts.1.down_proj"
    scales = synthetic_scales(src, str(tmp_path / "s.json"), no_tokens=(quiet,))
    res = convert(src, str(tmp_path / "o"), algo="W4A16_NVFP4", device="cpu", quiet=True, scale_search="mse", act_scales=scales)
    assert res.plan.search_weights.no_tokens == [quiet]
    assert any("received no calibration token" in w for w in res.report["warnings"])
    out, source, doc = load_all(res.dst), load_all(src), load(scales)
    searched = with_scale_search(SCHEMES["W4A16_NVFP4"], "mse")
    m = "model.layers.0.mlp.experts.2.down_proj"
    ref = searched.quantize(source[f"{m}.weight"], None, doc.channel_energy(m))
    assert _bytes(out[f"{m}.weight_scale"]) == _bytes(ref["weight_scale"])


@pytest.mark.parametrize("rounding, smooth", [("gptq", "none"), ("nearest", "awq"), ("gptq", "awq")])
def test_weighted_under_gptq_and_smooth(calibrated, tmp_path, rounding, smooth):
    """With --rounding gptq / --smooth the search is weighted too, for a weight-only format (no static
    input scale keeps the scales doc): the smoothed Linears that round to nearest after the forward
    were searched data-free (and warned so) before; recorded as weighted, no data-free warning."""
    src, _ = calibrated
    kw = dict(algo="W4A16_NVFP4", device="cpu", quiet=True, calib_data="default", rounding=rounding, smooth=smooth)
    res = convert(src, str(tmp_path / "w"), scale_search="mse", **kw)
    conv = json.load(open(os.path.join(res.dst, "hf_quant_config.json")))["converter"]
    assert conv["scale_search_weights"] == "activations"
    assert not any("without calibration data" in w for w in res.report["warnings"])
    if rounding == "nearest":  # the final round to nearest searches with the smoothed inputs' E[x_j^2]: not data-free
        from dataclasses import replace

        from quantize_cli.calibration import stage

        keep = stage.pending
        stage.pending = lambda *a: replace(keep(*a), keep_scales=False)  # the old behaviour: the doc dropped
        try:
            free = convert(src, str(tmp_path / "f"), scale_search="mse", **kw)
        finally:
            stage.pending = keep
        assert any("without calibration data" in w for w in free.report["warnings"])
        w, f = load_all(res.dst), load_all(free.dst)
        moved = [n for n in w if n.endswith(".weight_scale") and _bytes(w[n]) != _bytes(f[n])]
        assert len(moved) >= 7, moved
