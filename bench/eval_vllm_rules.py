"""eval's activation rules against vLLM 0.33's own torch code, on random data (upstream scratch venv).

    /root/upstream-venv/bin/python bench/eval_vllm_rules.py

NVFP4 (``ref_nvfp4_quant_dequant``) and MXFP8 (``_mxfp8_e4m3_quantize_torch``) must be equal bit
for bit. For FP8 the served path is a CUDA kernel whose source eval follows (activations.py cites
it); ``QuantFP8.forward_native`` (vLLM's torch reference, used by torch.compile's CPU fallback)
differs on purpose in two places, which this script counts: per token it multiplies by the
reciprocal scale (the kernel divides), and per 1 x 128 group its smallest scale is 1 / (448 * 512)
(the kernel's eps is 1e-10). Prints one line per rule; exit 1 if an exact rule is not exact.
"""

from __future__ import annotations

import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _project():
    """quantize_cli from this checkout (its recipes/ ship as quantize_cli.recipes)."""
    import importlib.util

    sys.path.insert(0, ROOT)
    spec = importlib.util.spec_from_file_location("quantize_cli.recipes", os.path.join(ROOT, "recipes", "__init__.py"),
                                                  submodule_search_locations=[os.path.join(ROOT, "recipes")])
    sys.modules["quantize_cli.recipes"] = mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from quantize_cli.eval import activations

    return activations


def main() -> None:
    A = _project()
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
    from vllm.model_executor.layers.quantization.utils.mxfp8_utils import _mxfp8_e4m3_quantize_torch
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import ref_nvfp4_quant_dequant
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    def native(group_shape, static):
        """QuantFP8.forward_native's state without the CustomOp machinery (which needs a vLLM config)."""
        from types import SimpleNamespace

        ns = SimpleNamespace(static=static, group_shape=group_shape, num_token_padding=None, column_major_scales=False,
                             use_ue8m0=False, is_group_quant=group_shape.is_per_group(), group_size=group_shape.col)
        ns._quantize_group_native = lambda x: QuantFP8._quantize_group_native(ns, x)
        return lambda x, scale=None: QuantFP8.forward_native(ns, x, scale)


    g = torch.Generator().manual_seed(0)
    x = (torch.randn(256, 1024, generator=g) * torch.logspace(-4, 3, 1024)).to(torch.bfloat16).float()
    x[3] = 0.0  # an all-zero token
    bad = 0

    def report(name, ours, theirs, exact):
        nonlocal bad
        diff = int((ours != theirs).sum())
        bad += exact and diff > 0
        print(f"{name:<28} differing elements {diff} of {ours.numel()} ({'must be 0' if exact else 'expected: see the docstring'})")

    gs = torch.tensor(2688.0 / 37.0)
    report("nvfp4", A.nvfp4(x, float(gs)), ref_nvfp4_quant_dequant(x, gs, 16), True)
    q, s = _mxfp8_e4m3_quantize_torch(x)
    report("mxfp8", A.mxfp8(x), (q.float().view(256, 32, 32) * torch.exp2(s.float() - 127)[..., None]).view(256, 1024), True)
    q, s = native(GroupShape.PER_TENSOR, True)(x, torch.tensor([0.37]))
    report("fp8 static per tensor", A.fp8_tensor(x, 0.37), q.float() * s, True)
    q, s = native(GroupShape.PER_TOKEN, False)(x)
    report("fp8 per token (native)", A.fp8_token(x), q.float() * s, False)
    q, s = native(GroupShape(1, 128), False)(x)
    ours, theirs = A.fp8_group(x), (q.float().view(256, 8, 128) * s[..., None]).view(256, 1024)
    report("fp8 1x128 groups (native)", ours, theirs, False)
    big = (x.view(256, 8, 128).abs().amax(-1, keepdim=True) >= 1.0 / 512).expand(256, 8, 128).reshape(256, 1024)
    report("  groups with amax >= 1/512", ours[big], theirs[big], True)  # above the native floor: the same rule
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
