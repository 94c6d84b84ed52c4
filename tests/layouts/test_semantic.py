"""Semantics: the packed operands, read the way the target kernel reads them, give the plain
checkpoint's GEMM exactly.

Two readings per layout:
* through ``unpack`` + the scheme's dequantization: identical to the plain weight's matmul;
* the kernel view (``layouts.dequantize``, MoE: the spec's row maps applied to the packed stacks),
  which uses the kernel's own scale format. It equals the plain dequantization with the kernel's
  documented conversions applied: Marlin rounds FP8 / INT8 scales to the activation dtype and drops
  NVFP4 block scales that stay e4m3 sub-normal after its rescaling; FlashInfer-CUTLASS clamps
  block-FP8 scales to >= 1e-10. Products are formed as (element x block scale) x global scale, the
  order the kernels use. Padded output rows decode to exactly 0; padded K columns too, except
  Marlin INT8, where vLLM's zero padding is code 0 = q -128: those columns only ever meet the
  zero-padded activations.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quantize_cli import layouts as L
from quantize_cli.layouts import Layout
from quantize_cli.layouts import cutlass as C
from quantize_cli.schemes import SCHEMES
from quantize_cli.schemes.int4 import expand_groups, unpack_row_pairs
from quantize_cli.schemes.numerics import e2m1_values, expand_blocks, unpack_nibbles

from .helpers import DENSE, MOE, moe_plain, quantize

G16 = 16


def _x(m: int, k: int) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16).float()


def _nvfp4(w: torch.Tensor, s: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    """(E2M1 x block scale) x global, [N, K]."""
    n = w.shape[0]
    vals = e2m1_values(unpack_nibbles(w)).reshape(n, -1, G16)
    return (vals * s.float()[:, :, None]).reshape(n, -1) * gs


def _kernel_reference(layout: Layout, algo: str, plain: dict, act: torch.dtype) -> torch.Tensor:
    w, ws = plain["weight"], plain["weight_scale"]
    if "NVFP4" in algo:
        s = ws.float()
        if layout is Layout.MARLIN:
            sf = L.marlin.nvfp4_scale_factor(ws, act)
            s = torch.where(s * sf * 2**7 < 2, torch.zeros_like(s), s)
        return _nvfp4(w, s, plain["weight_scale_2"])
    if algo == "INT4":  # codes x group scales rounded to the activation dtype
        return unpack_row_pairs(w).float() * expand_groups(ws.to(act).float())
    if algo == "MXFP8":  # e4m3 x 2^(byte - 127), one byte per 32 along K
        return w.float() * torch.exp2(ws.float() - 127).repeat_interleave(32, dim=1)
    s = ws.to(act).float()  # Marlin keeps FP8 / INT8 scales in the activation dtype
    if algo == "FP8_PB_WO":
        s = expand_blocks(s[:, 0, :, 0], (128, 128), tuple(w.shape))
    elif s.dim() == 1:
        s = s[:, None]
    return w.float() * s


def _cases():
    for layout, algo in DENSE:
        for shape in ((256, 384), (200, 176), (384, 128), (200, 256)):
            if L.shape_problem(layout, algo, shape) is None:
                for act in ((torch.bfloat16, torch.float16) if layout is Layout.MARLIN else (torch.bfloat16,)):
                    yield pytest.param(layout, algo, shape, act, id=f"{layout.value}-{algo}-{shape}-{str(act)[6:]}")


@pytest.mark.parametrize("layout,algo,shape,act", list(_cases()))
def test_dense_gemm(layout, algo, shape, act):
    n, k = shape
    plain = quantize(algo, n, k)
    packed = L.pack(layout, algo, plain, act)
    x = _x(5, k)
    scheme = SCHEMES[algo]
    plain_w = scheme.dequantize(plain)
    assert torch.equal(x @ scheme.dequantize(L.unpack(layout, algo, packed, act)).T, x @ plain_w.T)

    wk = L.dequantize(layout, algo, packed, act)
    ref = _kernel_reference(layout, algo, plain, act)
    assert torch.equal(wk[:n, :k], ref)
    assert wk[n:].count_nonzero() == 0  # padded rows (zero scales / zero codes) decode to 0
    if algo == "INT8":
        row_scale = plain["weight_scale"].to(act).float()[:, None]
        assert torch.equal(wk[:n, k:], (-128 * row_scale).expand(n, wk.shape[1] - k))
    else:
        assert wk[:, k:].count_nonzero() == 0
    assert torch.equal(x @ wk[:n, :k].T, x @ ref.T)
    # and the kernel's scale conversions are small perturbations of the plain weight
    err = (ref - plain_w).abs().amax() / plain_w.abs().amax()
    assert err <= (2**-8 if act == torch.bfloat16 else 2**-10) or "NVFP4" in algo and err <= 2**-6


def test_marlin_drops_subnormal_nvfp4_scales():
    """The helper weight has one block whose e4m3 scale is sub-normal: Marlin zeroes it (§1.4)."""
    plain = quantize("NVFP4", 256, 384)
    assert (plain["weight_scale"].float() < 2**-6).any()
    wk = L.dequantize("marlin", "NVFP4", L.pack("marlin", "NVFP4", plain, torch.float16), torch.float16)
    assert wk[1, :16].count_nonzero() == 0 and SCHEMES["NVFP4"].dequantize(plain)[1, :16].count_nonzero() > 0


def _moe_kernel_view(layout: Layout, algo: str, p: dict, e: int, i: int, h: int):
    """Plain-order fp32 (w13 [E, 2I, H], w2 [E, H, I]) read from the packed stacks with the spec's
    row maps (index formulas, not the pack implementation)."""
    sfx = L.suffix(layout)
    a, b = p["w13"]["weight" + sfx], p["w2"]["weight" + sfx]
    if layout is Layout.MARLIN:  # per expert the dense Marlin operands, read by the kernel view
        def view(side, x):
            return L.marlin.dequantize(algo, {k: v[x] for k, v in p[side].items() if k.endswith(sfx)}, torch.bfloat16)
        return torch.stack([view("w13", x) for x in range(e)]), torch.stack([view("w2", x) for x in range(e)])
    r13, r2 = torch.arange(2 * i), torch.arange(h)
    if layout is Layout.FLASHINFER and algo != "FP8_PB_WO":
        s = (r13 // 32) * 32 + (r13 % 8) * 4 + (r13 % 32) // 8
        src13 = torch.where(s % 2 == 0, i + s // 2, s // 2)
        src2 = (r2 // 32) * 32 + (r2 % 8) * 4 + (r2 % 32) // 8
    else:
        src13, src2 = (r13 + i) % (2 * i), r2  # w31 swap; w2 rows unchanged
    if algo == "FP8_PB_WO" and layout is Layout.FLASHINFER:  # BlockMajorK + 16-row shuffle
        def unblock(t, m):
            r = torch.arange(m)
            src = (r // 16) * 16 + (r % 8) * 2 + (r % 16) // 8
            out = torch.empty(t.shape[0], m, t.shape[1], 128, dtype=torch.uint8)
            out[:, src] = t.view(torch.uint8).permute(0, 2, 1, 3)
            return out.reshape(t.shape[0], m, -1).view(torch.float8_e4m3fn)
        a, b = unblock(a, 2 * i), unblock(b, h)
        src13 = (r13 + i) % (2 * i)
    if algo == "NVFP4":
        s13 = C.unswizzle_128x4(p["w13"]["weight_scale" + sfx], 2 * i, h // G16)
        s2 = C.unswizzle_128x4(p["w2"]["weight_scale" + sfx], h, i // G16)
        g13, g2 = p["w13"]["weight_scale_2"][:, 0], p["w2"]["weight_scale_2"]
        wa = torch.stack([_nvfp4(a[x], s13[x], g13[x]) for x in range(e)])
        wb = torch.stack([_nvfp4(b[x], s2[x], g2[x]) for x in range(e)])
    elif algo == "FP8":
        wa = a.float() * p["w13"]["weight_scale" + sfx][:, None, None]
        wb = b.float() * p["w2"]["weight_scale"][:, None, None]
    else:
        s13, s2 = p["w13"]["weight_scale" + sfx], p["w2"]["weight_scale" + sfx]
        wa = a.float() * s13.repeat_interleave(128, 1).repeat_interleave(128, 2)
        wb = b.float() * s2.repeat_interleave(128, 1).repeat_interleave(128, 2)
    w13 = torch.empty_like(wa)
    w13[:, src13] = wa
    w2 = torch.empty_like(wb)
    w2[:, src2] = wb
    return w13, w2


@pytest.mark.parametrize("layout,algo", MOE, ids=[f"{lay.value}-{a}" for lay, a in MOE])
def test_moe_gated_mlp(layout, algo):
    e, i, h = 2, 128, 256
    w13, w2 = moe_plain(algo, e, i, h)
    if algo == "FP8_PB_WO":
        w13["weight_scale"][1, 0, 1] = 1e-13  # a dead block: the kernel view clamps it
    p = L.pack_moe(layout, algo, w13, w2)
    k13, k2 = _moe_kernel_view(layout, algo, p, e, i, h)
    if algo == "NVFP4":
        r13 = torch.stack([_nvfp4(w13["weight"][x], w13["weight_scale"][x], w13["weight_scale_2"][x, 0])
                           for x in range(e)])
        r2 = torch.stack([_nvfp4(w2["weight"][x], w2["weight_scale"][x], w2["weight_scale_2"][x]) for x in range(e)])
    elif algo == "MXFP8":  # e4m3 x 2^(byte - 127), one byte per 32 along K
        r13 = w13["weight"].float() * torch.exp2(w13["weight_scale"].float() - 127).repeat_interleave(32, 2)
        r2 = w2["weight"].float() * torch.exp2(w2["weight_scale"].float() - 127).repeat_interleave(32, 2)
    elif algo == "FP8":
        r13 = w13["weight"].float() * w13["weight_scale"][:, :1, None]
        r2 = w2["weight"].float() * w2["weight_scale"][:, None, None]
    else:
        s13, s2 = w13["weight_scale"].clamp(min=1e-10), w2["weight_scale"].clamp(min=1e-10)
        r13 = w13["weight"].float() * s13.repeat_interleave(128, 1).repeat_interleave(128, 2)
        r2 = w2["weight"].float() * s2.repeat_interleave(128, 1).repeat_interleave(128, 2)
    assert torch.equal(k13, r13) and torch.equal(k2, r2)
    x = _x(3, h)
    for ex in range(e):
        def mlp(a, b):
            g, u = (x @ a[ex].T).split(i, dim=1)
            return (F.silu(g) * u) @ b[ex].T
        assert torch.equal(mlp(k13, k2), mlp(r13, r2))
