"""Scratch check (NOT run by the tests): vLLM 0.33 parses our configs into the intended per-layer methods.

Needs the upstream venv (vllm 0.33.0, CPU) and four outputs of this converter in /tmp/vchk
(tests/golden/mixed/README.md has the commands):

    /root/upstream-venv/bin/python tests/golden/mixed/vllm_check.py
"""
import json, sys
from vllm.model_executor.layers.quantization.modelopt import (ModelOptMixedPrecisionConfig, ModelOptMxFp8Config)
from vllm.model_executor.layers.linear import LinearBase
from vllm.model_executor.layers.quantization import get_quantization_config

def load(d):
    return json.load(open(f"{d}/config.json"))["quantization_config"], json.load(open(f"{d}/hf_quant_config.json"))

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
for d, prefixes in [
    ("/tmp/vchk/llama-mix", ["model.layers.0.self_attn.qkv_proj", "model.layers.1.self_attn.o_proj", "model.layers.0.mlp.gate_up_proj",
                             "model.layers.1.mlp.down_proj", "lm_head"]),
    ("/tmp/vchk/moe-mix", ["model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj", "model.layers.1.mlp.experts",
                           "model.layers.0.mlp.gate", "lm_head"]),
]:
    for which, cfg in zip(("config.json", "hf_quant_config.json"), load(d)):
        name = ModelOptMixedPrecisionConfig.override_quantization_method(cfg, None)
        qc = ModelOptMixedPrecisionConfig.from_config(cfg)
        qc.packed_modules_mapping = PACKED
        out = {}
        for p in prefixes:
            algo = None if qc.is_layer_excluded(p) else qc._resolve_quant_algo(p)
            meth = None
            if not p.endswith("experts"):
                layer = LinearBase.__new__(LinearBase)
                meth = type(qc.get_quant_method(layer, p)).__name__
            out[p] = (algo, meth)
        print(d.split("/")[-1], which, name, json.dumps(out))
for d in ("/tmp/vchk/llama-mxfp8", "/tmp/vchk/moe-mxfp8"):
    for which, cfg in zip(("config.json", "hf_quant_config.json"), load(d)):
        name = ModelOptMxFp8Config.override_quantization_method(cfg, None)
        qc = ModelOptMxFp8Config.from_config(cfg)
        print(d.split("/")[-1], which, name, qc.quant_method, qc.exclude_modules,
              [qc.is_layer_excluded(p) for p in ("lm_head", "model.layers.0.mlp.gate", "model.layers.0.mlp.experts", "model.layers.0.self_attn.qkv_proj")])
cfg = load("/tmp/vchk/moe-mix")[0]
qc = ModelOptMixedPrecisionConfig.from_config(cfg); qc.packed_modules_mapping = PACKED
for p in ("model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj"):
    m = qc.get_quant_method(LinearBase.__new__(LinearBase), p)
    print(p, {k: str(v)[:120] for k, v in vars(m).items()})
