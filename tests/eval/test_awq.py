"""ModelOpt 0.47's AWQ exports as ``quantize eval`` reads them: ``NVFP4_AWQ`` (NVFP4_AWQ_LITE_CFG /
NVFP4_AWQ_CLIP_CFG; W4A16_NVFP4_CFG with awq_lite, which writes no input_scale) is the NVFP4 or
W4A16_NVFP4 of its tensors, and a Linear's ``pre_quant_scale`` [K] (left where the exporter could not
fold it into a norm or Linear; INT4_AWQ_CFG's ``W4A16_AWQ`` too) scales the input before the
activation quantization and the GEMM, as TensorRT-LLM does. Checkpoints are our own conversions,
relabelled and given pre_quant_scale tensors; the expected outputs are computed by hand."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from quantize_cli.algorithms import algo_of_awq_quant_algo, algo_of_quant_algo
from quantize_cli.errors import SourceError
from quantize_cli.eval.activations import nvfp4
from quantize_cli.eval.forward import ServedLoader
from quantize_cli.eval.model import _serve_linear
from quantize_cli.eval.weights import open_served
from quantize_cli.schemes import SCHEMES
from tests.calibration import builders
from tests.conftest import convert, load_all
from tests.eval.test_eval import SAMPLES, _llama128, jsonl, logits_of, whole_model

UNFUSED = ("self_attn.o_proj", "mlp.down_proj")  # where ModelOpt's INT4 AWQ export keeps a pre_quant_scale


def relabel(dst: str, folder, quant_algo: str, extra: dict | None = None) -> str:
    """`dst`'s tensors (plus `extra`) in one shard at `folder`, its quant_algo renamed `quant_algo`."""
    os.makedirs(folder)
    tensors = {**load_all(dst), **(extra or {})}
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(folder, "model.safetensors"))
    for name in os.listdir(dst):
        if name.endswith((".json", ".jinja", ".txt")) and not name.startswith("model.safetensors"):
            with open(os.path.join(dst, name), "rb") as f, open(os.path.join(folder, name), "wb") as g:
                g.write(f.read())
    for name, keys in (("hf_quant_config.json", ("quantization",)), ("config.json", ("quantization_config",))):
        path = os.path.join(folder, name)
        with open(path) as f:
            doc = json.load(f)
        node = doc
        for k in keys:
            node = node[k]
        node["quant_algo"] = quant_algo
        with open(path, "w") as f:
            json.dump(doc, f)
    return str(folder)


def scales(dst: str, seed: int = 0) -> dict:
    """A pre_quant_scale [K] of powers of two (1/4 .. 4: scaling by them is exact) for every o_proj
    and down_proj of converted checkpoint `dst`."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    served = open_served(dst)
    for name in served.linears:
        if name.endswith(UNFUSED):
            k = served.weight(name).shape[1]
            out[f"{name}.pre_quant_scale"] = torch.exp2(torch.randint(-2, 3, (k,), generator=g).float()).to(torch.bfloat16)
    return out


def served_linear(served, name: str) -> torch.nn.Linear:
    """An nn.Linear with the forward eval gives quantized Linear `name`."""
    w, rule, p = ServedLoader(served).linear(name)
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight.data = w
    _serve_linear(lin, rule, p)
    return lin


def test_awq_names_live_in_the_algorithm_table():
    assert algo_of_awq_quant_algo("NVFP4_AWQ", static=True) == "NVFP4"  # NVFP4_AWQ_LITE_CFG: an input_scale
    assert algo_of_awq_quant_algo("nvfp4_awq", static=False) == "W4A16_NVFP4"  # W4A16_NVFP4_CFG + awq_lite
    assert algo_of_awq_quant_algo("W4A8_AWQ", static=True) is None
    assert algo_of_quant_algo("NVFP4_AWQ") is None  # verify / unpack / output facts still do not take it


@pytest.mark.parametrize("algo", ["NVFP4", "W4A16_NVFP4"])
def test_nvfp4_awq_without_pre_quant_scale_evaluates_as_its_tensors(tmp_path, algo):
    """Every pre_quant_scale folded into a norm / Linear: NVFP4_AWQ is the NVFP4 (input_scale written)
    or W4A16_NVFP4 (none written) of its tensors, bit for bit."""
    src = builders.llama(str(tmp_path / "src"))
    dst = convert(src, str(tmp_path / "dst"), algo=algo, device="cpu", quiet=True).dst
    awq = relabel(dst, tmp_path / "awq", "NVFP4_AWQ")
    data = jsonl(tmp_path / "d.jsonl")
    a, ra = logits_of(dst, source=src, data=data)
    b, rb = logits_of(awq, source=src, data=data)
    assert torch.equal(a, b) and ra.metrics == rb.metrics and ra.layers == rb.layers
    assert rb.checkpoint["quant_algo"] == "NVFP4_AWQ" and rb.checkpoint["served"] == ra.checkpoint["served"]
    assert {s.algo for s in open_served(awq).linears.values()} == {algo}
    assert not any("pre_quant_scale" in w for w in rb.warnings)


def test_pre_quant_scale_of_a_weight_only_linear_is_the_weight_with_scaled_columns(tmp_path):
    """INT4_AWQ_CFG's export (W4A16_AWQ): linear(x * p, W) == linear(x, W * p), the layer exactly
    (powers of two) and the model as transformers with those weights swapped in."""
    src = _llama128(tmp_path)  # INT4 groups of 128 along K
    dst = convert(src, str(tmp_path / "dst"), algo="INT4", device="cpu", quiet=True).dst
    extra = scales(dst)
    awq = relabel(dst, tmp_path / "awq", "W4A16_AWQ", extra)
    served, written = open_served(awq), load_all(awq)
    name = "model.layers.1.mlp.down_proj"
    assert served.linears[name].pre_quant_scale and not served.linears["model.layers.1.mlp.up_proj"].pre_quant_scale
    p = extra[f"{name}.pre_quant_scale"].float()
    x = torch.randn(5, p.numel(), generator=torch.Generator().manual_seed(2))
    w = served.weight(name)
    assert torch.equal(served_linear(served, name)(x), torch.nn.functional.linear(x, w * p))

    def swap(model):
        for mod_name, mod in model.named_modules():
            if f"{mod_name}.weight_scale" in written:
                leaves = {k.rsplit(".", 1)[1]: v for k, v in written.items() if k.rsplit(".", 1)[0] == mod_name}
                w = SCHEMES["INT4"].dequantize(leaves).float()
                if "pre_quant_scale" in leaves:
                    w = w * leaves["pre_quant_scale"].float()  # [N, K] * [K]: column k scaled by p_k
                mod.weight.data = w

    data = jsonl(tmp_path / "d.jsonl")
    ours, res = logits_of(awq, data=data)
    ref = whole_model(src, SAMPLES, swap)
    assert torch.allclose(ours, ref, rtol=0, atol=2e-5), (ours - ref).abs().max()
    without, _ = logits_of(dst, data=data)
    assert not torch.allclose(ours, without, rtol=0, atol=1e-3)  # the scales matter
    said = [w for w in res.warnings if "pre_quant_scale" in w]
    assert len(said) == 1 and f"on {len(extra)} Linear(s)" in said[0] and "TensorRT-LLM" in said[0] and "vLLM 0.33" in said[0]


def test_pre_quant_scale_comes_before_the_activation_quantization(tmp_path):
    """NVFP4_AWQ with input_scale (NVFP4_AWQ_LITE_CFG): the scaled input is what is quantized,
    ``linear(nvfp4(x * p, 1 / input_scale), W)``, not the quantized input scaled."""
    src = builders.llama(str(tmp_path / "src"))
    dst = convert(src, str(tmp_path / "dst"), algo="NVFP4", device="cpu", quiet=True).dst
    extra = scales(dst)
    awq = relabel(dst, tmp_path / "awq", "NVFP4_AWQ", extra)
    served = open_served(awq)
    name = "model.layers.0.self_attn.o_proj"
    spec = served.linears[name]
    assert spec.algo == "NVFP4" and spec.act.kind == "nvfp4" and spec.pre_quant_scale
    p = extra[f"{name}.pre_quant_scale"].float()
    x = torch.randn(7, p.numel(), generator=torch.Generator().manual_seed(3))
    w = served.weight(name)
    out = served_linear(served, name)(x)
    assert torch.equal(out, torch.nn.functional.linear(nvfp4(x * p, spec.act.scale), w))
    assert not torch.equal(out, torch.nn.functional.linear(nvfp4(x, spec.act.scale) * p, w))
    res = logits_of(awq, source=src, data=jsonl(tmp_path / "d.jsonl"))[1]
    assert sum("pre_quant_scale" in w for w in res.warnings) == 1 and res.metrics["kl_mean"] > 0
    assert open_served(awq, weights_only=True).linears[name].act.kind == "none"  # --weights-only: still scaled
    assert served_linear(open_served(awq, weights_only=True), name)(x).equal(torch.nn.functional.linear(x * p, w))


@pytest.mark.parametrize("quant_algo", ["W4A8_AWQ", "NVFP4_SVD"])
def test_an_unknown_quant_algo_is_still_refused_in_one_line(tmp_path, quant_algo):
    from click.testing import CliRunner

    from quantize_cli.cli import main

    src = builders.llama(str(tmp_path / "src"))
    dst = convert(src, str(tmp_path / "dst"), algo="NVFP4", device="cpu", quiet=True).dst
    bad = relabel(dst, tmp_path / "bad", quant_algo)
    with pytest.raises(SourceError, match=f"quant_algo '{quant_algo}' is not one this tool evaluates"):
        open_served(bad)
    r = CliRunner().invoke(main, ["eval", bad, "--data", jsonl(tmp_path / "d.jsonl"), "--device", "cpu"])
    assert r.exit_code != 0 and f"quant_algo '{quant_algo}' is not one this tool evaluates" in r.output
    assert "Traceback" not in r.output


def test_a_pre_quant_scale_of_the_wrong_length_is_refused(tmp_path):
    src = builders.llama(str(tmp_path / "src"))
    dst = convert(src, str(tmp_path / "dst"), algo="NVFP4", device="cpu", quiet=True).dst
    name = "model.layers.0.mlp.down_proj"
    awq = relabel(dst, tmp_path / "awq", "NVFP4_AWQ", {f"{name}.pre_quant_scale": torch.ones(3)})
    with pytest.raises(SourceError, match=r"down_proj.pre_quant_scale: shape \[3\]"):
        ServedLoader(open_served(awq)).linear(name)
