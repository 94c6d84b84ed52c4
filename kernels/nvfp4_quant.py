"""NVFP4 quantization kernel: E2M1 values in 16-element groups, e4m3 group scales, packed nibbles.

Equal bit for bit to ``quantize_cli.schemes.nvfp4`` (design §4.2), given the global amax::

    weight_scale_2 = gamax / (6 * 448)               (gamax 0 counts as 6)
    bs   = group_amax / (6 * weight_scale_2)         6 * wsf2 first, then an exact division
    bs8  = e4m3(clamp(bs == 0 ? 1 : bs, 2^-9, 448))  weight_scale [N, K/16]
    q    = w_fp32 / (float(bs8) * weight_scale_2)    exact division
    code = E2M1(q), nearest with ties to the even code; byte j = code(2j) | code(2j+1) << 4

Groups never straddle rows (K % 16 == 0), so a contiguous ``[B, N, K]`` stack is, per item, a flat
run of ``G = N*K/16`` groups: each program loads ``BLOCK_G`` whole groups (one contiguous span),
reduces each group, and writes ``8*BLOCK_G`` packed bytes and ``BLOCK_G`` scales. Single pass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..schemes.numerics import E2M1_MAX, E4M3_MAX, NVFP4_GROUP
from ._tl_math import div_rcp, div_rn, e2m1_codes, e4m3, e4m3_to_f32, rcp_refined
from ._validate import cdiv, soft_fp8

GROUPS_PER_PROGRAM = 256  # 4096 elements: 8 KiB of bf16 per program, 32 per thread
NVFP4_WARPS = 4
FAST_DIV = True  # one reciprocal per group (bf16/fp16 inputs on the GPU); False: div_rn everywhere

# Largest divisor for which the reciprocal path is exact, per input dtype: every nonzero input
# must keep |x / d| >= 2^-140 (far from fp32 underflow), so d <= smallest nonzero * 2^140.
# fp32 inputs reach 2^-149 and always use div_rn.
_FAST_DMAX = {torch.bfloat16: 2.0**-133 * 2.0**140, torch.float16: 2.0**60}


@triton.jit
def _nvfp4_kernel(
    x_ptr, q_ptr, s_ptr, gamax_ptr, wsf2_ptr, G, global_div, fast_dmax,
    BLOCK_G: tl.constexpr, SOFT: tl.constexpr, FAST_DIV: tl.constexpr,
):
    """Grid ``(cdiv(G, BLOCK_G), B)``: groups ``[pid*BLOCK_G, +BLOCK_G)`` of item b.

    x: ``[B, G, 16]`` source; q: ``[B, G, 8]`` uint8; s: ``[B, G]`` e4m3; gamax, wsf2: ``[B]``
    fp32 (program 0 writes ``wsf2[b]``); ``global_div`` = 6 * 448. FAST_DIV: divide through one
    reciprocal per group where ``_tl_math.div_rcp`` is exact (divisor in [2^-60, fast_dmax] and no
    block scale clamped at 448), else, for the whole program, with ``div_rn``.
    """
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    # weight_scale_2 = gamax / 2688, where an all-zero tensor / group (gamax 0) counts as 6.
    gamax = tl.load(gamax_ptr + b)
    wsf2 = div_rn(tl.where(gamax == 0.0, 6.0, gamax), global_div)
    tl.store(wsf2_ptr + b, wsf2, mask=pid == 0)

    g0 = b * G + pid.to(tl.int64) * BLOCK_G  # first group of this program (int64)
    gl = tl.arange(0, BLOCK_G)
    g_ok = pid * BLOCK_G + gl < G
    e = tl.arange(0, 16)
    x = tl.load(x_ptr + g0 * 16 + gl[:, None] * 16 + e[None, :], mask=g_ok[:, None], other=0.0).to(tl.float32)

    bs = div_rn(tl.max(tl.abs(x), axis=1), 6.0 * wsf2)  # 6 * wsf2 first, as the reference
    bs = tl.where(bs == 0.0, 1.0, bs)
    bs8 = e4m3(tl.minimum(tl.maximum(bs, 0.001953125), 448.0), SOFT)  # clamp to [2^-9, 448]
    denom = e4m3_to_f32(bs8, SOFT) * wsf2
    if FAST_DIV:
        safe = (denom >= 8.673617379884035e-19) & (denom <= fast_dmax) & (bs <= 448.0)
        if tl.min(safe.to(tl.int32), axis=0) == 1:  # uniform over the program
            q = div_rcp(x, denom, rcp_refined(denom))
        else:
            q = div_rn(x, denom[:, None])
    else:
        q = div_rn(x, denom[:, None])
    codes = e2m1_codes(q)  # int32 [BLOCK_G, 16]

    # Element 2j goes to the low nibble of byte j: split the pairs along a trailing axis of 2.
    lo, hi = tl.split(tl.reshape(codes, [BLOCK_G, 8, 2]))
    packed = (lo | (hi << 4)).to(tl.uint8)
    j = tl.arange(0, 8)
    tl.store(q_ptr + g0 * 8 + gl[:, None] * 8 + j[None, :], packed, mask=g_ok[:, None])
    tl.store(s_ptr + g0 + gl, bs8, mask=g_ok)


def quantize(
    w: torch.Tensor, gamax: torch.Tensor, soft: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``w [B, N, K]`` (K % 16 == 0), ``gamax [B]`` fp32 -> (uint8 ``[B, N, K/2]``,
    e4m3 ``[B, N, K/16]``, fp32 ``weight_scale_2 [B]``). ``soft``: software e4m3 rounding and
    ``div_rn`` only (the interpreter's path; default: only where there is no e4m3 hardware)."""
    soft = soft_fp8(w.device) if soft is None else soft
    fast = FAST_DIV and not soft and w.dtype in _FAST_DMAX
    batch, n, k = w.shape
    groups = n * (k // NVFP4_GROUP)
    q = torch.empty((batch, n, k // 2), dtype=torch.uint8, device=w.device)
    s = torch.empty((batch, n, k // NVFP4_GROUP), dtype=torch.float8_e4m3fn, device=w.device)
    wsf2 = torch.empty(batch, dtype=torch.float32, device=w.device)
    grid = (cdiv(groups, GROUPS_PER_PROGRAM), batch)
    _nvfp4_kernel[grid](
        w, q, s, gamax, wsf2, groups, E2M1_MAX * E4M3_MAX, _FAST_DMAX.get(w.dtype, 0.0),
        BLOCK_G=GROUPS_PER_PROGRAM, SOFT=soft, FAST_DIV=fast, num_warps=NVFP4_WARPS,
    )
    return q, s, wsf2
