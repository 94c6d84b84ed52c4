"""INT4 / INT4_ASYM through the rest of the tool: check, verify --source, inspect, the card, unpack
of --layout marlin, MoE experts, mixed precision (compressed-tensors groups; ModelOpt refused)."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from quantize_cli.api import check, unpack
from tests.conftest import convert
from quantize_cli.cli import main
from quantize_cli.errors import CheckFailed, PlanError
from quantize_cli.inspect_checkpoint import inspect_checkpoint
from quantize_cli.verify import verify_checkpoint
from tests.conftest import assert_same_bytes, golden_checkpoint, load_all, output_files

TINY = golden_checkpoint("tiny-llama")


def run(src, dst, algo, **kw):
    return convert(str(src), str(dst), algo=algo, device="cpu", quiet=True, **kw)


def test_check_warns_that_vllm_does_not_serve_the_modelopt_form(tmp_path):
    res = check(TINY, "INT4", json=str(tmp_path / "c.json"), quiet=True)
    assert [f.code for f in res.warnings] == ["int4-vllm"] and not res.errors
    res = check(TINY, "W4A16", format="compressed-tensors", json=str(tmp_path / "ct.json"), quiet=True)
    assert not res.warnings and not res.errors
    schemes = json.load(open(tmp_path / "ct.json"))["vllm_schemes"]
    assert schemes["model.layers.0.self_attn.qkv_proj"] == "CompressedTensorsWNA16" and schemes["lm_head"] == "unquantized"


def test_check_refuses_shapes_int4_cannot_take(make_checkpoint):
    from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors

    cfg = llama_config(hidden=192)  # K = 192: not whole 128-groups
    src = make_checkpoint(llama_tensors(cfg), cfg)
    with pytest.raises(CheckFailed):
        check(src, "INT4", quiet=True)
    with pytest.raises(PlanError) as err:
        run(src, os.path.join(os.path.dirname(src), "out"), "INT4")
    assert any("divisible by 128 for INT4 groups of 128" in str(d) for d in err.value.details)


@pytest.mark.parametrize("algo,fmt", [("INT4", "modelopt"), ("INT4", "compressed-tensors"), ("INT4_ASYM", "compressed-tensors")])
def test_verify_with_source_and_inspect(tmp_path, algo, fmt):
    run(TINY, tmp_path / "out", algo, format=fmt)
    res = verify_checkpoint(str(tmp_path / "out"), TINY)
    assert not res.errors and len(res.quantized) == 14
    assert all(15 < e["sqnr_db"] < 30 for e in res.errors_by_tensor.values())  # 4-bit: real error, not zero
    text = inspect_checkpoint(str(tmp_path / "out"))
    assert ("W4A16_AWQ" in text) if fmt == "modelopt" else ("pack-quantized" in text)


def test_verify_catches_a_damaged_int4_checkpoint(tmp_path):
    from safetensors.torch import load_file, save_file

    run(TINY, tmp_path / "out", "INT4_ASYM", format="compressed-tensors")
    shard = next(f for f in sorted(os.listdir(tmp_path / "out")) if f.endswith(".safetensors"))
    t = load_file(str(tmp_path / "out" / shard))
    name = next(n for n in t if n.endswith("weight_zero_point"))
    t[name] = t[name][:1].contiguous()
    save_file(t, str(tmp_path / "out" / shard), metadata={"format": "pt"})
    res = verify_checkpoint(str(tmp_path / "out"))
    assert any(name in f.message and "needs I32" in f.message for f in res.errors)


def test_card_names_the_algorithm_and_the_loader(tmp_path):
    run(TINY, tmp_path / "out", "INT4")
    card = open(tmp_path / "out" / "README.md").read()
    assert "one scale per 128-element group" in card and "W4A16_AWQ" in card and "- int4" in card


def test_marlin_layout_unpacks_to_the_plain_checkpoint(tmp_path):
    run(TINY, tmp_path / "plain", "INT4")
    run(TINY, tmp_path / "marlin", "INT4", layout="marlin")
    m = load_all(tmp_path / "marlin")
    assert "model.layers.0.mlp.up_proj.weight_marlin" in m and "model.layers.0.mlp.up_proj.weight" not in m
    unpack(str(tmp_path / "marlin"), str(tmp_path / "back"))
    a, b = load_all(tmp_path / "back"), load_all(tmp_path / "plain")
    assert set(a) == set(b)
    for n in a:
        assert_same_bytes(a[n], b[n], n)
    assert json.load(open(tmp_path / "back" / "hf_quant_config.json"))["quantization"] == \
        json.load(open(tmp_path / "plain" / "hf_quant_config.json"))["quantization"]


@pytest.mark.parametrize("example", ["tiny-qwen3-moe", "tiny-qwen3-moe-fused"])
@pytest.mark.parametrize("algo,fmt", [("INT4", "modelopt"), ("INT4_ASYM", "compressed-tensors")])
def test_moe_experts(tmp_path, example, algo, fmt):
    res = run(f"example:{example}", tmp_path / "out", algo, format=fmt)
    out = load_all(tmp_path / "out")
    leaf = "weight_packed" if fmt == "compressed-tensors" else "weight"
    experts = [n for n in out if ".mlp.experts." in n and n.endswith(leaf)]
    assert len(experts) == 3 * 4 * 2  # gate/up/down x 4 experts x 2 layers
    assert all(out[n].dtype.is_floating_point is False for n in experts)
    assert not any(n.endswith("mlp.gate.weight_scale") for n in out)  # routers stay bf16
    assert not verify_checkpoint(str(tmp_path / "out"), f"example:{example}").errors
    assert res.plan is not None


def test_mixed_precision_compressed_tensors_groups(tmp_path):
    run(TINY, tmp_path / "out", "INT4", format="compressed-tensors", algo_for=["self_attn*=INT4_ASYM"])
    qc = json.load(open(tmp_path / "out" / "config.json"))["quantization_config"]
    assert set(qc["config_groups"]) == {"W4A16_ASYM", "W4A16"} and qc["format"] == "pack-quantized"
    assert qc["config_groups"]["W4A16"]["targets"] == ["Linear"]
    out = load_all(tmp_path / "out")
    assert "model.layers.0.self_attn.q_proj.weight_zero_point" in out and "model.layers.0.mlp.up_proj.weight_zero_point" not in out
    assert not verify_checkpoint(str(tmp_path / "out"), TINY).errors


def test_modelopt_mixed_precision_refuses_int4(tmp_path):
    with pytest.raises(PlanError):
        run(TINY, tmp_path / "out", "NVFP4", algo_for=["self_attn*=INT4"])
    assert not os.path.exists(tmp_path / "out")


def test_cli_names(tmp_path):
    r = CliRunner().invoke(main, ["convert", TINY, "-o", str(tmp_path / "a"), "--algo", "w4a16", "--quiet", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["convert", TINY, "-o", str(tmp_path / "b"), "--algo", "INT4", "--quiet", "--device", "cpu"])
    assert r.exit_code == 0 and output_files(tmp_path / "a") == output_files(tmp_path / "b")
    r = CliRunner().invoke(main, ["convert", TINY, "-o", str(tmp_path / "c"), "--algo", "int4_asym", "--device", "cpu"])
    assert r.exit_code == 2 and "carries no zero points" in r.output and "\n" not in r.output.strip()


@pytest.mark.parametrize("algo,fmt", [("INT4", "modelopt"), ("INT4_ASYM", "compressed-tensors")])
def test_nan_weight_is_refused_naming_the_tensor(make_checkpoint, tmp_path, algo, fmt):
    from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors
    from quantize_cli.errors import NumericsError

    cfg = llama_config()
    t = llama_tensors(cfg)
    t["model.layers.1.mlp.up_proj.weight"][3, 200] = float("nan")
    with pytest.raises(NumericsError, match=r"model.layers.1.mlp.up_proj.weight .*\[3, 200\]"):
        run(make_checkpoint(t, cfg), tmp_path / "out", algo, format=fmt)
    assert not os.path.exists(tmp_path / "out")
