"""MXFP8 quantization kernel: e4m3 values, one e8m0 (power-of-two) scale per 32 elements along K.

Equal bit for bit to ``quantize_cli.schemes.mxfp8`` (ModelOpt 0.47's exporter)::

    d     = group_amax / 448                             exact division
    e     = clamp(ceil(fl32(log2 d)), -127, 127)         from the bits of d (below); d == 0 -> -127
    scale = e + 127                                      weight_scale [N, K/32] uint8
    q     = e4m3(clamp(w_fp32 * 2^-e, -448, 448))        a multiply by a power of two

No ``log2`` is evaluated (the GPU's ``lg2.approx`` is not torch's): with ``d = 2^e (1 + m 2^-23)``
the result is ``e + (m > T[e])``, ``T`` the round-down table of the reference (a few ulps at
most), loaded from a 278-entry int32 tensor. A sub-normal ``d`` gets its ``(e, m)`` from the
integer mantissa converted to fp32 (exact), so no sub-normal arithmetic is needed.

Groups never straddle rows (K % 32 == 0), so a contiguous ``[B, N, K]`` stack is, per item, a flat
run of ``G = N*K/32`` groups; each program loads ``BLOCK_G`` whole groups. Single pass.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..schemes.mxfp8 import MX_BLOCK, round_down_table
from ..schemes.numerics import E4M3_MAX
from ._tl_math import div_rn, e4m3
from ._validate import cdiv, soft_fp8

GROUPS_PER_PROGRAM = 128  # 4096 elements per program
MXFP8_WARPS = 4


@functools.lru_cache(maxsize=None)
def _table(device: torch.device) -> torch.Tensor:
    return torch.tensor(round_down_table(), dtype=torch.int32, device=device)


@triton.jit
def _pow2(e):
    """fp32 ``2^e`` for int32 ``e`` in ``[-126, 127]`` from its bits."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _mxfp8_kernel(x_ptr, q_ptr, s_ptr, t_ptr, G, qmax, BLOCK_G: tl.constexpr, SOFT: tl.constexpr):
    """Grid ``(cdiv(G, BLOCK_G), B)``: groups ``[pid*BLOCK_G, +BLOCK_G)`` of item b.

    x: ``[B, G, 32]`` source; q: ``[B, G, 32]`` e4m3; s: ``[B, G]`` uint8; t: the round-down
    table; qmax = 448 (an argument: keeps the divisor out of constant folding).
    """
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    g0 = b * G + pid.to(tl.int64) * BLOCK_G
    gl = tl.arange(0, BLOCK_G)
    g_ok = pid * BLOCK_G + gl < G
    c = tl.arange(0, 32)
    offs = g0 * 32 + gl[:, None] * 32 + c[None, :]
    x = tl.load(x_ptr + offs, mask=g_ok[:, None], other=0.0).to(tl.float32)

    amax = tl.max(tl.abs(x), axis=1)
    # the GPU's max drops NaN (torch's propagates it): a NaN block gets amax inf, i.e. the same
    # out-of-range scale byte as the reference, which the executor refuses
    amax = tl.where(tl.sum((x != x).to(tl.int32), axis=1) > 0, float("inf"), amax)
    d = div_rn(amax, qmax)  # [BLOCK_G], >= 0
    bits = d.to(tl.int32, bitcast=True)
    biased = (bits >> 23) & 0xFF
    man = bits & 0x7FFFFF
    # sub-normal d = man * 2^-149: fp32(man) is exact and normal, with the same mantissa bits
    mf = man.to(tl.float32).to(tl.int32, bitcast=True)
    sub = biased == 0
    e = tl.where(sub, ((mf >> 23) & 0xFF) - 127 - 149, biased - 127)
    m = tl.where(sub, mf & 0x7FFFFF, man)
    t = tl.load(t_ptr + (tl.minimum(tl.maximum(e, -150), 127) + 150))
    exp = tl.minimum(tl.maximum(e + (m > t).to(tl.int32), -127), 127)
    exp = tl.where(d == 0.0, -127, exp)
    # 2^-exp: a normal fp32 for every finite block (exp <= 120, as d <= 3.4e38 / 448 < 2^120);
    # a NaN/Inf block (exp 127, refused by the executor) gets the reference's sub-normal 2^-127
    mult = tl.where(exp == 127, 5.877471754111438e-39, _pow2(tl.minimum(-exp, 127)))
    q = x * mult[:, None]
    tl.store(q_ptr + offs, e4m3(q, SOFT), mask=g_ok[:, None])
    tl.store(s_ptr + g0 + gl, (exp + 127).to(tl.uint8), mask=g_ok)


def quantize(w: torch.Tensor, soft: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [B, N, K]`` (K % 32 == 0) -> (e4m3 ``[B, N, K]``, uint8 e8m0 ``[B, N, K/32]``).
    ``soft``: software e4m3 rounding (the interpreter's path; default: only without e4m3 hardware)."""
    soft = soft_fp8(w.device) if soft is None else soft
    batch, n, k = w.shape
    if k % MX_BLOCK:
        raise ValueError(f"MXFP8 needs in-features (last dim) divisible by {MX_BLOCK}, got shape {list(w.shape[-2:])}")
    groups = n * (k // MX_BLOCK)
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    s = torch.empty((batch, n, k // MX_BLOCK), dtype=torch.uint8, device=w.device)
    grid = (cdiv(groups, GROUPS_PER_PROGRAM), batch)
    _mxfp8_kernel[grid](w, q, s, _table(w.device), groups, E4M3_MAX,
                        BLOCK_G=GROUPS_PER_PROGRAM, SOFT=soft, num_warps=MXFP8_WARPS)
    return q, s
