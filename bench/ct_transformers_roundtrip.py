"""Scratch check (upstream venv, not a test dependency): transformers + compressed-tensors load our
compressed-tensors outputs of the golden tiny Llama (converted to /tmp/ct/ours-ALGO, see
bench/ct_vllm_decisions.py) and their own dequantization equals our scheme.dequantize (bf16, bit for bit).
    /root/upstream-venv/bin/python bench/ct_transformers_roundtrip.py INT8 FP8_PER_CHANNEL_PER_TOKEN FP8_PB_WO W4A16_NVFP4 FP8 NVFP4
"""
import os, sys, glob, json, torch
from transformers import AutoModelForCausalLM
from safetensors.torch import load_file
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout
from quantize_cli.formats import CT_SCHEMES
for algo in sys.argv[1:]:
    d = f"/tmp/ct/ours-{algo}"
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    sd = m.state_dict()
    ours = {}
    for f in glob.glob(f"{d}/*.safetensors"): ours.update(load_file(f))
    mods = sorted({k.rsplit(".", 1)[0] for k in ours if k.endswith("weight_scale")})
    bad = 0
    for mod in mods:
        leaves = {k.rsplit(".", 1)[1]: v for k, v in ours.items() if k.rsplit(".", 1)[0] == mod}
        deq = CT_SCHEMES[algo].dequantize(leaves).to(torch.bfloat16)
        lin = m.get_submodule(mod)
        if not hasattr(lin, "weight"):  # NVFP4 kept packed: compressed-tensors' unpack + dequantize
            from compressed_tensors.quantization.lifecycle.forward import dequantize
            from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
            p = lin.weight_packed.data
            vals = unpack_fp4_from_uint8(p, p.shape[0], p.shape[1] * 2, dtype=torch.bfloat16)
            got = dequantize(x_q=vals, scale=lin.weight_scale.to(torch.bfloat16), global_scale=lin.weight_global_scale,
                             args=lin.quantization_scheme.weights, dtype=torch.bfloat16)
        else:
            got = lin.weight.data
        if got.dtype != torch.bfloat16:  # kept compressed in memory: compressed-tensors' own dequantize
            from compressed_tensors.quantization.lifecycle.forward import dequantize
            got = dequantize(x_q=got, scale=lin.weight_scale, args=lin.quantization_scheme.weights, dtype=torch.bfloat16)
        if got.dtype != torch.bfloat16 or not torch.equal(got.view(torch.int16), deq.view(torch.int16)):
            bad += 1
            print("  differs:", mod, got.dtype, (got.float() - deq.float()).abs().max().item())
    print(f"{algo}: {len(mods)} Linears decompressed by compressed-tensors; {len(mods) - bad} bit-identical to our dequantize")
