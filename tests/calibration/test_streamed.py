"""The layer-streamed forward equals one whole-model forward, exactly; scales flow into the output."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.conftest import convert
from quantize_cli import api
from quantize_cli.calibration import calibrate, load
from quantize_cli.checkpoint.source import open_source
from quantize_cli.modules.recipe import load_recipe
from tests.calibration import builders
from tests.conftest import load_all, same_bytes

SAMPLES = [[5, 17, 99, 3, 250, 7, 8, 9, 310, 1], [42, 43, 44, 45, 46, 47], [1, 2, 3, 200, 100, 50, 25, 12, 6, 3, 1, 0]]


def _jsonl(path, samples=SAMPLES) -> str:
    with open(path, "w") as f:
        for s in samples:
            f.write(json.dumps({"input_ids": s}) + "\n")
    return str(path)


KV_IMPL = "test_kv_recorder"  # this test's own attention function: stock SDPA after recording K and V


def _whole_model(folder: str, prefix: str, samples) -> tuple[dict, dict]:
    """An independent measurement: the full transformers model with its stock eager experts and plain
    forward pre-hooks (none of quantize_cli.calibration.hooks), one forward per sample.

    Returns ``({module: {"amax", "tokens"}}, {attention: (k_amax, v_amax)})``: every Linear's input,
    every routed expert's gate/up input (its tokens) and down input (recomputed from the expert's
    own weights), and K / V as the attention function receives them (after RoPE).
    """
    from transformers import AutoModel
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    inputs: dict[str, dict] = {}
    kv: dict[str, list] = {}
    names: dict[int, str] = {}

    def record(name, x):
        e = inputs.setdefault(name, {"amax": 0.0, "tokens": 0})
        e["amax"] = max(e["amax"], x.detach().abs().max().float().item()) if x.numel() else e["amax"]
        e["tokens"] += x.numel() // x.shape[-1]

    def attention(module, query, key, value, attention_mask, **kwargs):
        slot = kv.setdefault(names[id(module)], [0.0, 0.0])
        slot[0] = max(slot[0], key.abs().max().float().item())
        slot[1] = max(slot[1], value.abs().max().float().item())
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(KV_IMPL, attention)
    AttentionMaskInterface.register(KV_IMPL, sdpa_mask)
    model = AutoModel.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation=KV_IMPL).eval()
    for sub, mod in model.named_modules():
        name = f"{prefix}.{sub}" if prefix and sub else (prefix or sub)
        names[id(mod)] = name
        if isinstance(mod, torch.nn.Linear):
            mod.register_forward_pre_hook(lambda m, args, name=name: record(name, args[0]))
        elif isinstance(getattr(mod, "gate_up_proj", None), torch.nn.Parameter) and mod.gate_up_proj.dim() == 3:
            assert not getattr(mod, "is_transposed", False) and not getattr(mod, "has_bias", False)
            mod.config._experts_implementation = "eager"  # transformers' own loop computes the output
            mod.register_forward_pre_hook(lambda m, args, name=name: _experts_inputs(m, name, *args[:2], record))
    with torch.no_grad():
        for s in samples:
            model(input_ids=torch.tensor([s]))
    return inputs, {k: tuple(v) for k, v in kv.items()}


def _experts_inputs(mod, name: str, hidden, top_k_index, record) -> None:
    """Per expert: its routed tokens (gate and up input) and ``act(gate) * up`` (down input), from the expert's weights."""
    for e in range(mod.gate_up_proj.shape[0]):
        routed = (top_k_index == e).any(dim=-1)
        if not routed.any():
            continue
        x = hidden[routed]
        gate, up = torch.nn.functional.linear(x, mod.gate_up_proj[e]).chunk(2, dim=-1)  # gate rows first (transformers 5)
        for role in ("gate_proj", "up_proj"):
            record(f"{name}.{e}.{role}", x)
        record(f"{name}.{e}.down_proj", mod.act_fn(gate) * up)


def _streamed(folder: str, data: str):
    src = open_source(folder)
    return calibrate(src, load_recipe(None, src.config.get("model_type")), data, samples=8, seq_len=64)


@pytest.mark.parametrize("build, prefix", [(builders.llama, "model"), (builders.qwen3_moe, "model"), (builders.bert, ""),
                                           (builders.deepseek_v3, "model"), (builders.gemma3, "model")])
def test_streamed_equals_whole_model(tmp_path, build, prefix):
    folder = build(str(tmp_path / "src"))
    doc = _streamed(folder, _jsonl(tmp_path / "c.jsonl"))
    ref, ref_kv = _whole_model(folder, prefix, SAMPLES)
    assert doc.modules, "nothing recorded"
    seen = {n: e for n, e in doc.modules.items() if e["tokens"]}  # an expert no token reached: amax 0, tokens 0
    assert all(e == {"amax": 0, "tokens": 0} for n, e in doc.modules.items() if n not in seen)
    assert set(seen) == set(ref)
    for name, stat in ref.items():
        assert doc.modules[name] == stat, name
    assert ref_kv and {k: (v["k_amax"], v["v_amax"]) for k, v in doc.kv.items()} == ref_kv
    if build is builders.qwen3_moe:  # per expert, and the routed tokens add up to top-k per token
        experts = [n for n in doc.modules if ".experts." in n and n.endswith("gate_proj") and n.startswith("model.layers.0.")]
        assert len(experts) == 8
        assert sum(doc.modules[n]["tokens"] for n in experts) == 2 * sum(map(len, SAMPLES))
    if build is builders.deepseek_v3:  # MLA projections and the shared expert are Linears like any other
        assert {"model.layers.0.self_attn.kv_b_proj", "model.layers.1.mlp.shared_experts.down_proj",
                "model.layers.1.mlp.experts.3.up_proj"} <= set(doc.modules)
    if build is builders.bert:  # the pooler after the blocks is calibrated too; an encoder has no K/V for a cache
        assert "pooler.dense" in doc.modules


def _scale_tensors(folder):
    return {k: v for k, v in load_all(folder).items() if k.endswith(("input_scale", "k_scale", "v_scale"))}


@pytest.mark.parametrize("algo, bound", [("FP8", 448.0), ("NVFP4", 2688.0)])
def test_scales_written_shared_and_round_trip(tmp_path, algo, bound):
    folder = builders.llama(str(tmp_path / "src"))
    data = _jsonl(tmp_path / "c.jsonl")
    a = convert(folder, str(tmp_path / "a"), algo=algo, device="cpu", quiet=True, calib_data=data, kv_cache_dtype="fp8")
    doc = api.calibrate(folder, calib_data=data, output=str(tmp_path / "s.json"), device="cpu", quiet=True)
    convert(folder, str(tmp_path / "b"), algo=algo, device="cpu", quiet=True, act_scales=str(tmp_path / "s.json"), kv_cache_dtype="fp8")
    ta, tb = load_all(tmp_path / "a"), load_all(tmp_path / "b")
    assert ta.keys() == tb.keys() and all(same_bytes(ta[k], tb[k]) for k in ta)  # --act-scales == --calib-data, byte for byte
    for i in range(3):
        p = f"model.layers.{i}"
        qkv = max(doc.modules[f"{p}.self_attn.{x}_proj"]["amax"] for x in "qkv")
        for x in "qkv":  # a fused group shares the max, computed in fp32 as ModelOpt does
            assert same_bytes(ta[f"{p}.self_attn.{x}_proj.input_scale"], torch.tensor(qkv, dtype=torch.float32) / bound)
        down = doc.modules[f"{p}.mlp.down_proj"]["amax"]
        assert same_bytes(ta[f"{p}.mlp.down_proj.input_scale"], torch.tensor(down, dtype=torch.float32) / bound)
        assert ta[f"{p}.mlp.gate_proj.input_scale"].item() == ta[f"{p}.mlp.up_proj.input_scale"].item()
        kv = doc.kv[f"{p}.self_attn"]  # ModelOpt's names / dtype / shape, vLLM remaps them to .attn.k_scale
        assert same_bytes(ta[f"{p}.self_attn.k_proj.k_scale"], torch.tensor(kv["k_amax"], dtype=torch.float32) / 448.0)
        assert same_bytes(ta[f"{p}.self_attn.v_proj.v_scale"], torch.tensor(kv["v_amax"], dtype=torch.float32) / 448.0)
    assert a.report["calibration"]["calibrated"] is True
    hq = json.load(open(tmp_path / "a" / "hf_quant_config.json"))
    assert hq["converter"]["calibration"]["data"]["samples"] == 3
    assert hq["quantization"]["kv_cache_quant_algo"] == "FP8"
    from quantize_cli.verify import verify_checkpoint

    assert verify_checkpoint(str(tmp_path / "a")).input_scales.startswith("calibrated for 21 module(s)")
    convert(folder, str(tmp_path / "c"), algo=algo, device="cpu", quiet=True)  # data-free: the constant, said so
    assert verify_checkpoint(str(tmp_path / "c")).input_scales.startswith("constant")


def test_moe_experts_without_tokens_take_layer_max(tmp_path):
    folder = builders.qwen3_moe(str(tmp_path / "src"))
    data = _jsonl(tmp_path / "c.jsonl", [[7]])  # one token, top-2: six of eight experts see nothing
    res = convert(folder, str(tmp_path / "o"), algo="FP8", device="cpu", quiet=True, calib_data=data)
    cal = res.plan.act_scales
    layer0 = [n for n in cal.no_tokens if n.startswith("model.layers.0.")]
    assert len(layer0) == 6 * 3  # gate, up, down of six experts
    out = load_all(tmp_path / "o")
    doc_amax = {n: cal.input_amax[n] for n in cal.input_amax if n.startswith("model.layers.0.mlp.experts.") and n.endswith("down_proj")}
    top = max(doc_amax[n] for n in doc_amax if n not in cal.no_tokens)
    for n in layer0:
        if n.endswith("down_proj"):
            assert same_bytes(out[f"{n}.input_scale"], torch.tensor(top, dtype=torch.float32) / 448.0)
    assert res.report["calibration"]["experts_without_tokens"] == cal.no_tokens
