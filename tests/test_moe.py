"""MoE (per-expert and fused 3-D experts) and DeepSeek-style (MLA + MoE + MTP) checkpoints."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from quantize_cli.api import prepare
from tests.conftest import convert
from quantize_cli.errors import PlanError
from quantize_cli.checkpoint.example_weights import deepseek_config, deepseek_tensors, qwen3_moe_config, qwen3_moe_tensors
from quantize_cli.schemes import SCHEMES
from quantize_cli.schemes.numerics import sqnr_db
from tests.conftest import assert_same_bytes, load_all


def run(src, dst, algo, **kw):
    kw.setdefault("quiet", True)
    convert(str(src), str(dst), algo=algo, **kw)
    return load_all(dst)


@pytest.fixture
def qwen_moe(make_checkpoint):
    cfg = qwen3_moe_config()
    return make_checkpoint(qwen3_moe_tensors(cfg, seed=2), cfg, shards=3, name="moe")


@pytest.mark.parametrize("algo", ["NVFP4", "W4A16_NVFP4", "FP8", "INT8", "MXFP8"])
def test_fused_3d_experts_give_the_same_bytes_as_per_expert(make_checkpoint, tmp_path, algo):
    cfg = qwen3_moe_config()
    a = make_checkpoint(qwen3_moe_tensors(cfg, seed=5), cfg, shards=2, name="per_expert")
    b = make_checkpoint(qwen3_moe_tensors(cfg, seed=5, fused_experts=True), cfg, shards=2, name="fused")
    run(a, tmp_path / "oa", algo)
    run(b, tmp_path / "ob", algo)
    for f in ("model.safetensors", "hf_quant_config.json", "config.json"):
        assert open(tmp_path / "oa" / f, "rb").read() == open(tmp_path / "ob" / f, "rb").read(), f


@pytest.mark.parametrize("algo,key", [("NVFP4", "weight_scale_2"), ("FP8", "weight_scale")])
def test_each_expert_gate_and_up_share_their_global_scale(qwen_moe, tmp_path, algo, key):
    out = run(qwen_moe, tmp_path / "out", algo)
    for layer in (0, 1):
        for e in range(4):
            p = f"model.layers.{layer}.mlp.experts.{e}"
            assert torch.equal(out[f"{p}.gate_proj.{key}"], out[f"{p}.up_proj.{key}"])
            assert torch.equal(out[f"{p}.gate_proj.input_scale"], out[f"{p}.up_proj.input_scale"])
        # experts differ in magnitude, so sharing across experts would be a bug
        assert not torch.equal(out[f"model.layers.{layer}.mlp.experts.0.gate_proj.{key}"], out[f"model.layers.{layer}.mlp.experts.3.gate_proj.{key}"])


def test_mxfp8_experts_equal_the_reference_per_expert(qwen_moe, tmp_path):
    """vLLM serves MXFP8 experts (ModelOptMxFp8FusedMoE): each expert is its own 2-D MXFP8 weight."""
    out = run(qwen_moe, tmp_path / "out", "MXFP8")
    src = load_all(qwen_moe)
    s = SCHEMES["MXFP8"]
    experts = [n for n in src if ".experts." in n]
    assert experts
    for name in experts:
        mod = name[: -len(".weight")]
        ref = s.quantize(src[name])
        for k in ("weight", "weight_scale"):
            assert_same_bytes(out[f"{mod}.{k}"], ref[k], f"{mod}.{k}")
    hq = json.load(open(tmp_path / "out" / "hf_quant_config.json"))["quantization"]
    assert hq["quant_algo"] == "MXFP8" and hq["group_size"] == 32


def test_routers_kept_and_listed(qwen_moe, tmp_path):
    out = run(qwen_moe, tmp_path / "out", "NVFP4")
    src = load_all(qwen_moe)
    assert_same_bytes(out["model.layers.0.mlp.gate.weight"], src["model.layers.0.mlp.gate.weight"], "router")
    hq = json.load(open(tmp_path / "out" / "hf_quant_config.json"))["quantization"]
    assert hq["exclude_modules"] == ["lm_head", "model.embed_tokens", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
    assert hq["group_size"] == 16


def test_expert_outputs_dequantize_close_to_source(qwen_moe, tmp_path):
    out = run(qwen_moe, tmp_path / "out", "NVFP4")
    src = load_all(qwen_moe)
    s = SCHEMES["NVFP4"]
    for name, w in src.items():
        if ".experts." in name:
            mod = name[: -len(".weight")]
            q = {k: out[f"{mod}.{k}"] for k in ("weight", "weight_scale", "weight_scale_2")}
            assert sqnr_db(w.float(), s.dequantize(q)) > 15, name


@pytest.mark.parametrize("algo", ["FP8_PB_WO", "FP8_PER_CHANNEL_PER_TOKEN"])
def test_block_and_channel_fp8_refused_on_experts_unless_excluded(qwen_moe, tmp_path, algo):
    with pytest.raises(PlanError) as exc:
        run(qwen_moe, tmp_path / "out", algo)
    assert "MoE" in exc.value.details[0] and "--exclude '*.experts'" in exc.value.details[0]
    assert not os.path.exists(tmp_path / "out")
    out = run(qwen_moe, tmp_path / "out", algo, exclude=["*.experts"])
    assert out["model.layers.0.mlp.experts.1.up_proj.weight"].dtype == torch.bfloat16
    assert out["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    hq = json.load(open(tmp_path / "out" / "hf_quant_config.json"))["quantization"]
    assert {"model.layers.0.mlp.experts", "model.layers.1.mlp.experts"} <= set(hq["exclude_modules"])
    assert not any(".experts." in e for e in hq["exclude_modules"])  # whole layers only, never one expert


def test_partial_expert_exclusion_is_refused(qwen_moe):
    plan = prepare(qwen_moe, "NVFP4", exclude=["model.layers.0.mlp.experts.2.*"])
    assert any("exclude the whole layer" in p for p in plan.problems)


def test_undeclared_3d_expert_tensor_is_refused_never_guessed(make_checkpoint, tmp_path):
    cfg = qwen3_moe_config()
    cfg["model_type"] = "some_new_moe"  # no recipe declares its fused-expert layout
    src = make_checkpoint(qwen3_moe_tensors(cfg, fused_experts=True), cfg, name="new")
    plan = prepare(src, "NVFP4")
    assert sum("fused 3-D expert tensor" in p for p in plan.problems) == 4
    # excluding the experts copies the 3-D tensors unchanged
    plan = prepare(src, "NVFP4", exclude=["*.experts"])
    assert not plan.problems
    assert plan.outputs["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 256, 256)


def _llama4_like(cfg, per_expert: dict, layout: str):
    """Rebuild the qwen experts in a transposed 3-D layout: [E, H, 2I] and [E, I, H]."""
    out = {}
    for name, t in per_expert.items():
        if ".experts." not in name:
            out[name] = t
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}.mlp.experts"
        gates = [per_expert[f"{p}.{e}.gate_proj.weight"] for e in range(4)]
        ups = [per_expert[f"{p}.{e}.up_proj.weight"] for e in range(4)]
        if layout == "gate_up_t":
            gu = [torch.cat([g, u]).t() for g, u in zip(gates, ups)]
        else:  # interleaved columns, gpt-oss style
            gu = [torch.stack([g, u], dim=1).reshape(-1, g.shape[1]).t() for g, u in zip(gates, ups)]
        out[f"{p}.gate_up_proj"] = torch.stack(gu).contiguous()
        out[f"{p}.down_proj"] = torch.stack([per_expert[f"{p}.{e}.down_proj.weight"].t() for e in range(4)]).contiguous()
    return out


@pytest.mark.parametrize("layout", ["gate_up_t", "gate_up_interleaved"])
def test_transposed_and_interleaved_layouts_via_a_user_recipe(make_checkpoint, tmp_path, layout):
    cfg = qwen3_moe_config()
    per = qwen3_moe_tensors(cfg, seed=7)
    a = make_checkpoint(per, cfg, name="a")
    b = make_checkpoint(_llama4_like(cfg, per, layout), cfg, name="b")
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(f"name: mine\nextends: qwen3_moe\nexperts:\n  fused_tensors: {{gate_up_proj: {layout}, down_proj: down_t}}\n")
    run(a, tmp_path / "oa", "NVFP4")
    run(b, tmp_path / "ob", "NVFP4", recipe=str(recipe), memory_budget="1MB")
    assert open(tmp_path / "oa" / "model.safetensors", "rb").read() == open(tmp_path / "ob" / "model.safetensors", "rb").read()


@pytest.fixture
def deepseek(make_checkpoint):
    cfg = deepseek_config()
    return make_checkpoint(deepseek_tensors(cfg, seed=1), cfg, shards=3, name="ds")


@pytest.mark.parametrize("algo", ["NVFP4", "W4A16_NVFP4", "FP8", "INT8"])
def test_deepseek_mla_moe_mtp(deepseek, tmp_path, algo):
    out = run(deepseek, tmp_path / "out", algo)
    src = load_all(deepseek)
    hq = json.load(open(tmp_path / "out" / "hf_quant_config.json"))["quantization"]
    assert hq["exclude_modules"] == ["lm_head", "model.embed_tokens", "model.layers.1.mlp.gate", "model.layers.2*"]
    # MTP layer (index == num_hidden_layers) kept whole, router bias copied in fp32
    for name in ("model.layers.2.eh_proj.weight", "model.layers.2.self_attn.q_a_proj.weight", "model.layers.1.mlp.gate.e_score_correction_bias"):
        assert_same_bytes(out[name], src[name], name)
    assert out["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    if SCHEMES[algo].shares_global_amax:
        key = "weight_scale_2" if "NVFP4" in algo else "weight_scale"
        for layer in (0, 1):
            a = f"model.layers.{layer}.self_attn"
            assert torch.equal(out[f"{a}.q_a_proj.{key}"], out[f"{a}.kv_a_proj_with_mqa.{key}"])
        assert torch.equal(out[f"model.layers.1.mlp.shared_experts.gate_proj.{key}"], out[f"model.layers.1.mlp.shared_experts.up_proj.{key}"])
    assert out["model.layers.1.self_attn.kv_b_proj.weight"].dtype != torch.bfloat16


def test_deepseek_block_fp8_reports_mla_shape_and_moe_at_once(deepseek):
    plan = prepare(deepseek, "FP8_PB_WO")
    assert len(plan.problems) == 3
    assert sum("fused_qkv_a_proj" in p for p in plan.problems) == 2


def test_all_zero_linear_has_no_nan_anywhere(make_checkpoint, tmp_path):
    from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors

    cfg = llama_config()
    t = llama_tensors(cfg)
    t["model.layers.0.mlp.down_proj.weight"].zero_()
    src = make_checkpoint(t, cfg)
    for algo in ("NVFP4", "FP8", "FP8_PB_WO", "INT8"):
        out = run(src, tmp_path / algo, algo)
        for name, v in out.items():
            if v.is_floating_point():
                assert torch.isfinite(v.float()).all(), (algo, name)
