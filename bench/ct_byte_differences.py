"""Bytes that differ between (a) llm-compressor on CPU (bf16 quotient; what we match) and its GPU
Triton path (fp32 quotient), and (b) our compressed-tensors output and our ModelOpt math, on the golden tiny Llama."""
import glob, torch
from safetensors.torch import load_file
from quantize_cli.formats import CT_SCHEMES
from quantize_cli.schemes import SCHEMES
src = {}
for f in glob.glob("tests/golden/checkpoints/tiny-llama/*.safetensors"): src.update(load_file(f))
lin = {k: v for k, v in src.items() if k.endswith("proj.weight")}
def gpu_variant(algo, w):
    ct = CT_SCHEMES[algo].quantize(w)
    s = ct["weight_scale"].float()
    if algo == "FP8_PB_WO":
        n,k = w.shape; s = s.repeat_interleave(128,0)[:n].repeat_interleave(128,1)[:,:k]
    q = w.float() / s
    if algo == "INT8":
        return ct["weight"], q.clamp(-128,127).round().to(torch.int8)
    return ct["weight"], q.clamp(-448,448).to(torch.float8_e4m3fn)
for algo in ["FP8_PB_WO", "FP8_PER_CHANNEL_PER_TOKEN", "INT8"]:
    diff = tot = 0
    for w in lin.values():
        a, b = gpu_variant(algo, w)
        diff += (a.view(torch.uint8) != b.view(torch.uint8)).sum().item(); tot += a.numel()
    print(f"{algo}: CPU bf16 quotient vs GPU fp32 quotient: {diff} of {tot} payload bytes differ ({100*diff/tot:.2f}%)")
groups = [("q_proj","k_proj","v_proj"), ("gate_proj","up_proj")]
for algo in ["FP8_PB_WO", "FP8_PER_CHANNEL_PER_TOKEN", "INT8", "W4A16_NVFP4"]:
    diff = tot = sd = stot = 0
    for name, w in lin.items():
        mod = name[:-7]; base, leaf = mod.rsplit(".",1)
        gam = None
        for g in groups:
            if leaf in g: gam = torch.stack([src[f"{base}.{m}.weight"].abs().amax().float() for m in g]).amax()
        mo = SCHEMES[algo].quantize(w, gam if SCHEMES[algo].shares_global_amax else None)
        c = CT_SCHEMES[algo].quantize(w, gam if CT_SCHEMES[algo].shares_global_amax else None)
        a = mo["weight"]; b = c.get("weight_packed", c.get("weight"))
        diff += (a.view(torch.uint8) != b.view(torch.uint8)).sum().item(); tot += a.numel()
        if algo == "W4A16_NVFP4":
            sd += (mo["weight_scale"].view(torch.uint8) != c["weight_scale"].view(torch.uint8)).sum().item(); stot += c["weight_scale"].numel()
    extra = f"; e4m3 group scales {sd} of {stot} differ ({100*sd/stot:.2f}%)" if stot else ""
    print(f"{algo}: compressed-tensors (llm-compressor) vs ModelOpt math: {diff} of {tot} payload bytes differ ({100*diff/tot:.2f}%){extra}")
