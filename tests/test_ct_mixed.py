"""--algo-for with --format compressed-tensors: several config_groups, each module as its algorithm alone.

Goldens: llm-compressor 0.14's model_free_ptq given the same groups (make_golden.py: tiny-llama-mixed,
moe-mixed) and vLLM 0.33's per-layer decisions for nine mixes (bench/ct_vllm_mixed_decisions.py ->
vllm_mixed_decisions.json).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from click.testing import CliRunner

from quantize_cli.api import check
from tests.conftest import convert
from quantize_cli.cli import main
from quantize_cli.errors import CheckFailed, PlanError, UsageError
from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors, qwen3_moe_config, qwen3_moe_tensors
from quantize_cli.formats import CT_SCHEMES
from quantize_cli.formats.ct_mixed import group_of
from quantize_cli.inspect_checkpoint import ct_summary
from quantize_cli.verify import verify_checkpoint
from tests.conftest import GOLDEN, assert_same_bytes, load_all

CT = os.path.join(GOLDEN, "compressed_tensors")
TINY = os.path.join(GOLDEN, "checkpoints", "tiny-llama")


def run(src, dst, algo, **kw):
    kw.setdefault("quiet", True)
    return convert(str(src), str(dst), algo=algo, format="compressed-tensors", device="cpu", **kw)


def qconfig(folder) -> dict:
    return json.load(open(os.path.join(folder, "config.json")))["quantization_config"]


@pytest.fixture
def moe_src(make_checkpoint):
    cfg = qwen3_moe_config()
    return make_checkpoint(qwen3_moe_tensors(cfg, seed=3), cfg, shards=2, name="moe")


def test_mixed_llama_equals_llm_compressor(tmp_path):
    """NVFP4A16 everywhere, FP8_BLOCK attention: every tensor and config.json as model_free_ptq writes them."""
    run(TINY, tmp_path / "o", "W4A16_NVFP4", algo_for=["self_attn*=FP8_PB_WO"])
    ours, theirs = load_all(tmp_path / "o"), load_all(os.path.join(CT, "tiny-llama-mixed"))
    compared = 0
    for name, t in theirs.items():
        if not name.startswith("model.embed_tokens."):  # model_free_ptq quantizes the embedding (docs/formats.md)
            assert_same_bytes(ours[name], t, name)
            compared += 1
    assert compared == 8 * 2 + 6 * 3  # 8 FP8_BLOCK attention Linears, 6 NVFP4A16 MLP Linears (copies were dropped)
    want = json.load(open(os.path.join(CT, "tiny-llama-mixed", "config.json")))
    assert json.load(open(tmp_path / "o" / "config.json")) == want
    q = want["quantization_config"]
    assert q["format"] == "mixed-precision" and q["config_groups"]["NVFP4A16"]["targets"] == ["Linear"]
    assert len(q["config_groups"]["FP8_BLOCK"]["targets"]) == 8


def test_mixed_moe_equals_llm_compressor_but_shares_each_experts_w13_global_scale(tmp_path, make_checkpoint):
    """FP8_BLOCK dense Linears, NVFP4A16 experts. One deliberate difference: each expert's gate/up share
    one NVFP4 global scale (vLLM's MoE loader keeps gate's for both, warning when they differ);
    model_free_ptq's fusion patterns miss ``mlp.experts.N.gate_proj`` and give each its own."""
    cfg = qwen3_moe_config(hidden=256, moe_intermediate=64, experts=2, layers=1, vocab=64)  # make_golden.MOE_CONFIG
    src = make_checkpoint(qwen3_moe_tensors(cfg, seed=5), cfg, name="moe")
    run(src, tmp_path / "o", "FP8_PB_WO", algo_for=["*experts*=W4A16_NVFP4"])
    ours, theirs = load_all(tmp_path / "o"), load_all(os.path.join(CT, "moe-mixed"))
    gates = [n for n in theirs if ".experts." in n and ".gate_proj." in n]
    assert len(gates) == 2 * 3
    for name, t in theirs.items():
        if not name.startswith("model.embed_tokens.") and name not in gates:
            assert_same_bytes(ours[name], t, name)
    for e in range(2):
        p = f"model.layers.0.mlp.experts.{e}"
        g_ours, u_ours = ours[f"{p}.gate_proj.weight_global_scale"], ours[f"{p}.up_proj.weight_global_scale"]
        g_theirs, u_theirs = theirs[f"{p}.gate_proj.weight_global_scale"], theirs[f"{p}.up_proj.weight_global_scale"]
        assert g_theirs.item() != u_theirs.item()  # the difference is real in this golden
        assert g_ours.item() == u_ours.item() == min(g_theirs.item(), u_theirs.item())
    want = json.load(open(os.path.join(CT, "moe-mixed", "config.json")))
    assert json.load(open(tmp_path / "o" / "config.json")) == want


@pytest.mark.parametrize("algo,rule,alone", [
    ("NVFP4", "self_attn*=FP8_PB_WO", "FP8_PB_WO"),
    ("MXFP8", "mlp*=INT8", "INT8"),
    ("FP8", "self_attn*=MXFP8", "MXFP8"),
])
def test_each_part_equals_converting_it_alone(tiny_llama, tmp_path, algo, rule, alone):
    run(tiny_llama, tmp_path / "mix", algo, algo_for=[rule])
    run(tiny_llama, tmp_path / "a", algo)
    run(tiny_llama, tmp_path / "b", alone)
    mix, a, b = load_all(tmp_path / "mix"), load_all(tmp_path / "a"), load_all(tmp_path / "b")
    part = rule.split("*")[0]
    n_alone = 0
    for name, t in mix.items():
        ref = b if f".{part}." in name else a
        n_alone += ref is b
        assert_same_bytes(t, ref[name], name)
    assert n_alone > 0 and set(mix) == {n for n in b if f".{part}." in n} | {n for n in a if f".{part}." not in n}
    groups = qconfig(tmp_path / "mix")["config_groups"]
    assert groups[CT_SCHEMES[algo].preset]["targets"] == ["Linear"]
    assert all(f".{part}." in t for t in groups[CT_SCHEMES[alone].preset]["targets"])


def test_moe_parts_equal_converting_them_alone(moe_src, tmp_path):
    """The issue's MoE: block-FP8 dense layers with NVFP4 experts (the single ModelOpt format cannot say it)."""
    run(moe_src, tmp_path / "mix", "FP8_PB_WO", algo_for=["*experts*=NVFP4"])
    run(moe_src, tmp_path / "fp", "FP8_PB_WO")
    run(moe_src, tmp_path / "nv", "NVFP4")
    mix, fp, nv = load_all(tmp_path / "mix"), load_all(tmp_path / "fp"), load_all(tmp_path / "nv")
    for name, t in mix.items():
        assert_same_bytes(t, (nv if ".experts." in name else fp)[name], name)
    assert any(n.endswith("experts.0.gate_proj.weight_packed") for n in mix)
    groups = qconfig(tmp_path / "mix")["config_groups"]
    assert groups["FP8_BLOCK"]["targets"] == ["Linear"]
    experts = groups["NVFP4"]["targets"]  # one anchored regex per MoE layer, not 3 x E names
    assert experts == [rf"re:model\.layers\.{i}\.mlp\.experts\.\d+\.(?:down_proj|gate_proj|up_proj)$" for i in (0, 1)]
    targets = {g: c["targets"] for g, c in groups.items()}
    assert group_of("model.layers.1.mlp.experts.3.up_proj", targets) == "NVFP4"
    assert group_of("model.layers.1.mlp.experts.3.up_proj_x", targets) == "FP8_BLOCK"  # $ anchors the end
    assert group_of("model.layers.1.mlp.shared_experts.up_proj", targets) == "FP8_BLOCK"
    assert verify_checkpoint(str(tmp_path / "mix"), source=str(moe_src)).errors == []


CASES = {  # bench/ct_vllm_mixed_decisions.py
    "llama-NVFP4-attn-FP8_PB_WO": ("llama", "NVFP4", "self_attn*=FP8_PB_WO"),
    "llama-MXFP8-attn-INT8": ("llama", "MXFP8", "self_attn*=INT8"),
    "moe-FP8_PB_WO-experts-NVFP4": ("moe", "FP8_PB_WO", "*experts*=NVFP4"),
    "moe-NVFP4-experts-MXFP8": ("moe", "NVFP4", "*experts*=MXFP8"),
    "moe-MXFP8-experts-INT8": ("moe", "MXFP8", "*experts*=INT8"),
    "moe-INT8-experts-FP8_PER_CHANNEL_PER_TOKEN": ("moe", "INT8", "*experts*=FP8_PER_CHANNEL_PER_TOKEN"),
    "moe-FP8_PER_CHANNEL_PER_TOKEN-experts-W4A16_NVFP4": ("moe", "FP8_PER_CHANNEL_PER_TOKEN", "*experts*=W4A16_NVFP4"),
    "moe-W4A16_NVFP4-experts-FP8": ("moe", "W4A16_NVFP4", "*experts*=FP8"),
    "moe-FP8-experts-FP8_PB_WO": ("moe", "FP8", "*experts*=FP8_PB_WO"),
    "llama-INT4-attn-MXFP8": ("llama", "INT4", "self_attn*=MXFP8"),
    "moe-FP8_PB_WO-experts-INT4": ("moe", "FP8_PB_WO", "*experts*=INT4"),
    "moe-INT4_ASYM-experts-NVFP4": ("moe", "INT4_ASYM", "*experts*=NVFP4"),
    "moe-INT4-experts-INT4_ASYM": ("moe", "INT4", "*experts*=INT4_ASYM"),
}


def test_check_predicts_what_vllm_decided_per_layer(moe_src, tmp_path):
    """vLLM 0.33 parsed each mixed config.json (CompressedTensorsConfig, get_moe_method); check agrees on every layer."""
    decided = json.load(open(os.path.join(CT, "vllm_mixed_decisions.json")))
    assert set(decided) == set(CASES)
    algos_dense, algos_moe = set(), set()
    for case, (model, algo, rule) in CASES.items():
        src = TINY if model == "llama" else moe_src
        check(str(src), algo, format="compressed-tensors", algo_for=[rule], json=str(tmp_path / "c.json"), quiet=True)
        got = json.load(open(tmp_path / "c.json"))["vllm_schemes"]
        assert got == decided[case], case
        algos_dense.add(algo)
        algos_moe.add(rule.split("=")[1]) if model == "moe" else None
        assert not any(v.startswith("ERROR") for v in decided[case].values())
    assert algos_dense == algos_moe == set(CT_SCHEMES)  # every algorithm as a dense default and as MoE experts


def test_every_compressed_tensors_algorithm_is_served_per_layer():
    assert all(s.vllm_linear and s.vllm_moe for s in CT_SCHEMES.values())  # a Linear scheme and a MoE method each
    from quantize_cli.formats import COMPRESSED_TENSORS

    linear, moe = COMPRESSED_TENSORS.mixed_served()
    where = COMPRESSED_TENSORS.mixed_where()
    assert set(linear) == set(moe) == set(CT_SCHEMES) and "config_groups" in where


def test_verify_reads_each_layer_against_its_own_group(tiny_llama, tmp_path):
    run(tiny_llama, tmp_path / "mix", "NVFP4", algo_for=["self_attn*=MXFP8"])
    res = verify_checkpoint(str(tmp_path / "mix"), source=str(tiny_llama))
    assert not res.errors and res.algo == "MIXED_PRECISION" and len(res.quantized) == 14
    cfg_path = tmp_path / "mix" / "config.json"
    doc = json.load(open(cfg_path))
    targets = doc["quantization_config"]["config_groups"]["MXFP8"]["targets"]
    targets.remove("model.layers.1.self_attn.o_proj")  # now read as NVFP4 (Linear), but holds MXFP8 tensors
    targets.append("model.layers.0.mlp.not_there")  # a listed name with no module: fine
    json.dump(doc, open(cfg_path, "w"))
    errors = verify_checkpoint(str(tmp_path / "mix")).errors
    assert {f.subject for f in errors if f.code == "tensors"} >= {"model.layers.1.self_attn.o_proj.weight_packed"}
    targets.append("lm_head")  # listed, but kept unquantized
    json.dump(doc, open(cfg_path, "w"))
    assert "mixed-listed" in {f.code for f in verify_checkpoint(str(tmp_path / "mix")).errors}
    del doc["quantization_config"]["config_groups"]["NVFP4"]  # no Linear group: the MLPs are targeted by nothing
    json.dump(doc, open(cfg_path, "w"))
    assert "mixed-unlisted" in {f.code for f in verify_checkpoint(str(tmp_path / "mix")).errors}


def test_group_of_follows_vllms_precedence():
    groups = {"NVFP4": ["Linear"], "FP8_BLOCK": ["model.layers.0.self_attn.q_proj", "re:.*o_proj$"]}
    assert group_of("model.layers.0.self_attn.q_proj", groups) == "FP8_BLOCK"  # exact beats Linear, whatever the order
    assert group_of("model.layers.3.self_attn.o_proj", groups) == "FP8_BLOCK"
    assert group_of("model.layers.0.mlp.up_proj", groups) == "NVFP4"
    assert group_of("model.layers.0.mlp.up_proj", {"A": ["x"]}) is None


def test_inspect_and_check_show_the_groups(tiny_llama, tmp_path, capsys):
    run(tiny_llama, tmp_path / "mix", "W4A16_NVFP4", algo_for=["self_attn*=FP8_PB_WO"])
    line = ct_summary(qconfig(tmp_path / "mix"))
    assert "mixed: FP8_BLOCK (8 target(s)), NVFP4A16 (Linear)" in line and "'mixed-precision'" in line
    res = check(str(tiny_llama), "W4A16_NVFP4", format="compressed-tensors", algo_for=["self_attn*=FP8_PB_WO"],
                json=str(tmp_path / "c.json"))
    text = capsys.readouterr().out
    assert "format compressed-tensors" in text and "--algo-for 'self_attn*=FP8_PB_WO'" in text
    rows = {m["module"]: m for m in json.load(open(tmp_path / "c.json"))["modules"]}
    assert rows["model.layers.0.self_attn.k_proj"]["algo"] == "FP8_PB_WO"
    assert rows["model.layers.0.mlp.up_proj"]["algo_rule"] == "--algo W4A16_NVFP4" and not res.errors


def test_refusals_name_the_pattern(tiny_llama, moe_src, tmp_path):
    with pytest.raises(PlanError) as exc:  # a fused group split between two groups: vLLM raises
        run(tiny_llama, tmp_path / "o", "NVFP4", algo_for=["*q_proj=MXFP8"])
    assert any("qkv_proj" in d and "--algo-for '*q_proj=MXFP8'" in d for d in exc.value.details)
    with pytest.raises(PlanError) as exc:  # one MoE layer, two schemes: get_moe_method raises
        run(moe_src, tmp_path / "o", "NVFP4", algo_for=["*experts.0.*=MXFP8"])
    assert any("MoE layer would mix" in d for d in exc.value.details)
    with pytest.raises(UsageError, match="--scale-search mse --format compressed-tensors"):  # a refusal that stays
        run(tiny_llama, tmp_path / "o", "NVFP4", algo_for=["self_attn*=FP8_PB_WO"], scale_search="mse")
    assert not os.path.exists(tmp_path / "o")


def test_block_fp8_shape_rule_applies_to_its_own_group_only(make_checkpoint, tmp_path):
    """vLLM's block loader needs a fused member other than the last in 128-row multiples: k_proj [64, 256]
    is refused when attention is FP8_BLOCK, not when only the MLPs are."""
    cfg = llama_config(heads=4, kv_heads=1)
    src = make_checkpoint(llama_tensors(cfg, seed=2), cfg, name="kv1")
    with pytest.raises(CheckFailed):
        check(src, "NVFP4", format="compressed-tensors", algo_for=["self_attn*=FP8_PB_WO"], json=str(tmp_path / "c.json"))
    errors = [f for f in json.load(open(tmp_path / "c.json"))["findings"] if f["level"] == "error"]
    assert [f["subject"] for f in errors] == ["model.layers.0.self_attn.k_proj", "model.layers.1.self_attn.k_proj"]
    assert all("FP8_BLOCK needs out-features in multiples of 128" in f["message"] for f in errors)
    assert not check(src, "NVFP4", format="compressed-tensors", algo_for=["mlp*=FP8_PB_WO"], quiet=True).errors


def test_cli(tiny_llama, tmp_path):
    out = tmp_path / "o"
    r = CliRunner().invoke(main, ["convert", str(tiny_llama), "-o", str(out), "--algo", "NVFP4", "--format", "compressed-tensors",
                                  "--algo-for", "self_attn*=FP8_PB_WO", "-q"])
    assert r.exit_code == 0, r.output
    assert set(qconfig(out)["config_groups"]) == {"NVFP4", "FP8_BLOCK"} and not (out / "hf_quant_config.json").exists()
    r = CliRunner().invoke(main, ["verify", str(out)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["convert", str(tiny_llama), "-o", str(tmp_path / "p"), "--algo", "NVFP4", "--format",
                                  "compressed-tensors", "--algo-for", "q_proj=MXFP8"])
    assert r.exit_code == 1 and "q_proj" in r.output and not (tmp_path / "p").exists()  # a plan error, as for ModelOpt


def test_calibrated_static_scales_follow_each_modules_algorithm(tmp_path):
    """FP8 attention (input_scale) in an NVFP4 model (input_global_scale), from one calibration run:
    each part equals its calibrated single-algorithm conversion."""
    from quantize_cli.api import calibrate

    scales = str(tmp_path / "scales.json")
    calibrate(TINY, calib_data=os.path.join(GOLDEN, "checkpoints", "calibration.jsonl"), output=scales, device="cpu", quiet=True)
    run(TINY, tmp_path / "mix", "NVFP4", algo_for=["self_attn*=FP8"], act_scales=scales)
    run(TINY, tmp_path / "fp8", "FP8", act_scales=scales)
    run(TINY, tmp_path / "nv", "NVFP4", act_scales=scales)
    mix, fp8, nv = load_all(tmp_path / "mix"), load_all(tmp_path / "fp8"), load_all(tmp_path / "nv")
    for name, t in mix.items():
        assert_same_bytes(t, (fp8 if ".self_attn." in name else nv)[name], name)
    assert sum(n.endswith("input_scale") for n in mix) == 8 and sum(n.endswith("input_global_scale") for n in mix) == 6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_conversion_equals_cpu(moe_src, tmp_path):
    """A mixed compressed-tensors conversion on the GPU (torch references there) writes the CPU's bytes."""
    for src, algo, rule in ((TINY, "MXFP8", "self_attn*=NVFP4"), (moe_src, "FP8_PB_WO", "*experts*=MXFP8")):
        convert(str(src), str(tmp_path / "gpu"), algo=algo, algo_for=[rule], format="compressed-tensors", device="cuda", quiet=True)
        convert(str(src), str(tmp_path / "cpu"), algo=algo, algo_for=[rule], format="compressed-tensors", device="cpu", quiet=True)
        gpu, cpu = load_all(tmp_path / "gpu"), load_all(tmp_path / "cpu")
        assert set(gpu) == set(cpu)
        for name in cpu:
            assert_same_bytes(gpu[name], cpu[name], name)
        assert open(tmp_path / "gpu" / "config.json").read() == open(tmp_path / "cpu" / "config.json").read()
        for d in ("gpu", "cpu"):
            shutil.rmtree(tmp_path / d)
