"""Scratch check (not a test dependency): what vLLM 0.33 decides for our compressed-tensors outputs.

Run with the upstream venv (shared/tools/upstream-env.sh) after converting the golden tiny Llama:
    for a in FP8 FP8_PER_CHANNEL_PER_TOKEN FP8_PB_WO NVFP4 W4A16_NVFP4 INT8 MXFP8 INT4 INT4_ASYM; do
      quantize convert tests/golden/checkpoints/tiny-llama -o /tmp/ct/ours-$a --algo $a --format compressed-tensors; done
    /root/upstream-venv/bin/python -P bench/ct_vllm_decisions.py   (-P: bench/kernels.py would shadow the kernels package)
It parses each config.json with CompressedTensorsConfig.from_config and asks get_scheme_dict +
_get_scheme_from_parts for every Linear (CPU: the vLLM config and the NVFP4 kernel picker are stubbed).
Its output is committed as tests/golden/compressed_tensors/vllm_decisions.json.
"""
import json, sys, glob
import torch
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
from vllm.model_executor.layers.quantization.compressed_tensors.utils import should_ignore_layer
from safetensors import safe_open
import types, sys as _s
fake = types.SimpleNamespace(model_config=types.SimpleNamespace(dtype=torch.bfloat16), kernel_config=types.SimpleNamespace(linear_backend="auto", moe_backend="auto"))
import vllm.model_executor.layers.quantization.compressed_tensors.schemes as S
import pkgutil, importlib
for m in pkgutil.iter_modules(S.__path__):
    mod = importlib.import_module(S.__name__ + "." + m.name)
    if hasattr(mod, "get_current_vllm_config"):
        mod.get_current_vllm_config = lambda: fake
import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors as C
C.get_current_vllm_config = lambda: fake
class CompressedTensorsW4A4Fp4:  # stand-in: the real one picks a CUDA kernel in __init__ (records the decision only)
    def __init__(self, use_a16=False):
        self.is_static_input_scheme = not use_a16
C.CompressedTensorsW4A4Fp4 = CompressedTensorsW4A4Fp4
res = {}
for algo in ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "INT8", "MXFP8", "INT4", "INT4_ASYM"]:
    d = f"/tmp/ct/ours-{algo}"
    qc = json.load(open(f"{d}/config.json"))["quantization_config"]
    cfg = CompressedTensorsConfig.from_config(dict(qc))
    cfg.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    names = {}
    for f in glob.glob(f"{d}/*.safetensors"):
        with safe_open(f, "pt") as h:
            for k in h.keys():
                names[k] = h.get_slice(k).get_dtype()
    layers = ["model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj", "model.layers.0.mlp.gate_up_proj",
              "model.layers.1.mlp.down_proj", "lm_head"]
    out = {}
    for ln in layers:
        sd = cfg.get_scheme_dict(torch.nn.Linear(1, 1), ln)
        if sd is None:
            out[ln] = "unquantized"; continue
        try:
          sch = cfg._get_scheme_from_parts(sd["weights"], sd["input_activations"], sd.get("output_activations"), sd.get("format"), ln)
        except Exception as e:
          out[ln] = f"ERROR {type(e).__name__}: {e}"[:200]; continue
        out[ln] = type(sch).__name__ + (f"(static_input={getattr(sch, 'is_static_input_scheme', None)})" if hasattr(sch, "is_static_input_scheme") else "")
    res[algo] = out
    print(algo, json.dumps(out))
json.dump(res, open("/tmp/ct/vllm_decisions.json", "w"), indent=1)
