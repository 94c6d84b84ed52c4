"""Scratch check (not a test dependency): vLLM 0.33's reading of our mixed-precision compressed-tensors outputs.

Two steps, from the repository root:

    .venv/bin/python bench/ct_vllm_mixed_decisions.py make          # our venv: convert CASES to /tmp/ct-mixed/
    /root/upstream-venv/bin/python bench/ct_vllm_mixed_decisions.py  # vLLM 0.33 parses each config.json

The second step builds ``CompressedTensorsConfig.from_config`` from each config.json (with the
packed_modules_mapping vLLM's Llama / Qwen3-MoE set), then asks for every vLLM layer prefix
found in the checkpoint: Linears -> ``get_scheme_dict`` + ``_get_scheme_from_parts`` (the scheme
class and its static-input flag); MoE layers -> ``CompressedTensorsMoEMethod.get_moe_method``
(the method class). On the CPU the vLLM config is stubbed, and the classes whose constructors
pick a CUDA kernel (NVFP4 Linear, every MoE method) are replaced by recorders of their name: the
decision is recorded, not a kernel. Output: tests/golden/compressed_tensors/vllm_mixed_decisions.json
(case -> prefix -> decision), which tests/formats/test_ct_mixed.py compares with ``check --json``.
"""

import glob
import importlib
import json
import os
import pkgutil
import sys
import types

OUT = "/tmp/ct-mixed"
TINY = "tests/golden/checkpoints/tiny-llama"
MOE = f"{OUT}/moe-src"  # quantize_cli.checkpoint.example_weights.qwen3_moe_tensors(qwen3_moe_config(), seed=3)
# case -> (source, --algo, --algo-for): every algorithm appears as a dense default and as experts
CASES = {
    "llama-NVFP4-attn-FP8_PB_WO": (TINY, "NVFP4", ["self_attn*=FP8_PB_WO"]),
    "llama-MXFP8-attn-INT8": (TINY, "MXFP8", ["self_attn*=INT8"]),
    "moe-FP8_PB_WO-experts-NVFP4": (MOE, "FP8_PB_WO", ["*experts*=NVFP4"]),
    "moe-NVFP4-experts-MXFP8": (MOE, "NVFP4", ["*experts*=MXFP8"]),
    "moe-MXFP8-experts-INT8": (MOE, "MXFP8", ["*experts*=INT8"]),
    "moe-INT8-experts-FP8_PER_CHANNEL_PER_TOKEN": (MOE, "INT8", ["*experts*=FP8_PER_CHANNEL_PER_TOKEN"]),
    "moe-FP8_PER_CHANNEL_PER_TOKEN-experts-W4A16_NVFP4": (MOE, "FP8_PER_CHANNEL_PER_TOKEN", ["*experts*=W4A16_NVFP4"]),
    "moe-W4A16_NVFP4-experts-FP8": (MOE, "W4A16_NVFP4", ["*experts*=FP8"]),
    "moe-FP8-experts-FP8_PB_WO": (MOE, "FP8", ["*experts*=FP8_PB_WO"]),
    "llama-INT4-attn-MXFP8": (TINY, "INT4", ["self_attn*=MXFP8"]),
    "moe-FP8_PB_WO-experts-INT4": (MOE, "FP8_PB_WO", ["*experts*=INT4"]),
    "moe-INT4_ASYM-experts-NVFP4": (MOE, "INT4_ASYM", ["*experts*=NVFP4"]),
    "moe-INT4-experts-INT4_ASYM": (MOE, "INT4", ["*experts*=INT4_ASYM"]),
}
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def make() -> None:
    import shutil

    from safetensors.torch import save_file

    from quantize_cli.api import ConvertOptions, convert
    from quantize_cli.checkpoint.example_weights import qwen3_moe_config, qwen3_moe_tensors

    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(MOE)
    cfg = qwen3_moe_config()
    save_file(qwen3_moe_tensors(cfg, seed=3), f"{MOE}/model.safetensors")
    json.dump(cfg, open(f"{MOE}/config.json", "w"))
    for case, (src, algo, rules) in CASES.items():
        convert(ConvertOptions(src, f"{OUT}/{case}", algo=algo, algo_for=rules, format="compressed-tensors", device="cpu", quiet=True))


def prefixes(folder: str) -> list[str]:
    """vLLM layer prefixes of a checkpoint's Linears: fused qkv / gate_up, one ``experts`` per MoE layer."""
    from safetensors import safe_open

    out = []
    for f in sorted(glob.glob(f"{folder}/*.safetensors")):
        with safe_open(f, "pt") as h:
            for k in h.keys():
                if not k.endswith((".weight", ".weight_packed")) or "norm" in k or "embed_tokens" in k:
                    continue
                mod = k.rsplit(".", 1)[0]
                parts = mod.split(".")
                if "experts" in parts:
                    mod = ".".join(parts[: parts.index("experts") + 1])
                else:
                    for fused, shards in PACKED.items():
                        if parts[-1] in shards:
                            mod = ".".join(parts[:-1] + [fused])
                if mod not in out:
                    out.append(mod)
    return out


def decide() -> None:
    import torch

    import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors as C
    import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe as M
    import vllm.model_executor.layers.quantization.compressed_tensors.schemes as S
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe import (
        CompressedTensorsMoEMethod,
    )

    fake = types.SimpleNamespace(model_config=types.SimpleNamespace(dtype=torch.bfloat16), lora_config=None,
                                 kernel_config=types.SimpleNamespace(linear_backend="auto", moe_backend="auto"))
    for pkg in (S, M):
        for m in pkgutil.iter_modules(pkg.__path__):
            try:
                mod = importlib.import_module(pkg.__name__ + "." + m.name)
            except ImportError:  # ROCm-only methods (aiter) do not import here and are not chosen on CUDA
                continue
            if hasattr(mod, "get_current_vllm_config"):
                mod.get_current_vllm_config = lambda: fake
            if pkg is M:  # every MoE method class -> a recorder of its name (their constructors pick CUDA kernels)
                for name in dir(mod):
                    if name.startswith("CompressedTensors") and name.endswith("MoEMethod") and name != "CompressedTensorsMoEMethod":
                        setattr(mod, name, type(name, (), {"__init__": lambda self, *a, **k: None}))
    C.get_current_vllm_config = lambda: fake

    class CompressedTensorsW4A4Fp4:  # stand-in: the real one picks a CUDA kernel in __init__
        def __init__(self, use_a16=False):
            self.is_static_input_scheme = not use_a16

    C.CompressedTensorsW4A4Fp4 = CompressedTensorsW4A4Fp4
    layer = types.SimpleNamespace(ckpt_gate_proj_name="gate_proj", ckpt_up_proj_name="up_proj", ckpt_down_proj_name="down_proj",
                                  moe_config=None)
    res = {}
    for case in CASES:
        d = f"{OUT}/{case}"
        cfg = C.CompressedTensorsConfig.from_config(dict(json.load(open(f"{d}/config.json"))["quantization_config"]))
        cfg.packed_modules_mapping = dict(PACKED)
        out = {}
        for prefix in prefixes(d):
            try:
                if prefix.endswith("experts"):
                    out[prefix] = type(CompressedTensorsMoEMethod.get_moe_method(cfg, layer, prefix)).__name__
                    continue
                sd = cfg.get_scheme_dict(torch.nn.Linear(1, 1), prefix)
                if sd is None:
                    out[prefix] = "unquantized"
                    continue
                sch = cfg._get_scheme_from_parts(sd["weights"], sd["input_activations"], sd.get("output_activations"),
                                                 sd.get("format"), prefix)
                flag = getattr(sch, "is_static_input_scheme", None)
                out[prefix] = type(sch).__name__ + (f"(static_input={flag})" if hasattr(sch, "is_static_input_scheme") else "")
            except Exception as e:  # noqa: BLE001 - recorded: a decision vLLM refuses is an answer too
                out[prefix] = f"ERROR {type(e).__name__}: {e}"[:200]
        res[case] = out
        print(case, json.dumps(out))
    path = "tests/golden/compressed_tensors/vllm_mixed_decisions.json"
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    print("wrote", path, file=sys.stderr)


if __name__ == "__main__":
    make() if sys.argv[1:] == ["make"] else decide()
