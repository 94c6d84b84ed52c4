"""The layer-streamed forward equals one whole-model forward, exactly; scales flow into the output."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.conftest import convert
from quantize_cli import api
from quantize_cli.calibration import calibrate, hooks, load
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


def _whole_model(folder: str, prefix: str, samples) -> hooks.Recorder:
    """Hooks on every Linear / experts / attention of the full transformers model, one forward per sample."""
    from transformers import AutoModel

    hooks.register()
    model = AutoModel.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation=hooks.IMPL).eval()
    for mod in model.modules():
        if hasattr(getattr(mod, "config", None), "_experts_implementation"):
            mod.config._experts_implementation = hooks.IMPL
    rec = hooks.Recorder()
    hooks.attach(rec, model, prefix, {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"})
    with hooks.active(rec), torch.no_grad():
        for s in samples:
            model(input_ids=torch.tensor([s]))
    return rec


def _streamed(folder: str, data: str):
    src = open_source(folder)
    return calibrate(src, load_recipe(None, src.config.get("model_type")), data, samples=8, seq_len=64)


@pytest.mark.parametrize("build, prefix", [(builders.llama, "model"), (builders.qwen3_moe, "model"), (builders.bert, ""),
                                           (builders.deepseek_v3, "model")])
def test_streamed_equals_whole_model(tmp_path, build, prefix):
    folder = build(str(tmp_path / "src"))
    doc = _streamed(folder, _jsonl(tmp_path / "c.jsonl"))
    ref = _whole_model(folder, prefix, SAMPLES)
    assert doc.modules, "nothing recorded"
    assert set(doc.modules) == set(ref.inputs)
    for name, stat in ref.inputs.items():
        assert doc.modules[name] == {"amax": stat.amax, "tokens": stat.tokens}, name
    assert {k: (v["k_amax"], v["v_amax"]) for k, v in doc.kv.items()} == {k: (v["k"].amax, v["v"].amax) for k, v in ref.kv.items()}
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
