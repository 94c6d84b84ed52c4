"""INT4 W4A16 quantization kernel: symmetric int4, one fp32 scale per 128-group (ModelOpt ``W4A16_AWQ``).

Equal bit for bit to ``quantize_cli.schemes.int4`` (``Int4Group``)::

    scale = group amax / 7 (all-zero group -> 1.0)             fp32, exact division
    q     = clamp(round_half_even(w_fp32 / scale), -8, 7)       int4 codes
    byte (i, k) = (q[2i, k] & 0xF) | (q[2i+1, k] & 0xF) << 4    uint8 [N/2, K]

One program takes ``BLOCK_P`` row pairs of one 128-group: it loads the even and the odd rows as
two tiles, computes both rows' scales, and stores the packed bytes and the scales. Every element
is read once; a group never straddles programs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..schemes.int4 import INT4_GROUP, INT4_SYM_MAX
from ._tl_math import div_rn, rint_i32, scale_from_amax
from ._validate import cdiv, next_pow2

PAIR_TILE = 64  # row pairs per program (x 2 rows x 128 columns = 16k elements)
WARPS = 4


@triton.jit
def _codes(x, scale):
    """int32 codes in [-8, 7]: round half to even of ``x / scale`` (exact division), clamped."""
    q = rint_i32(div_rn(x, scale[:, None]))
    return tl.minimum(tl.maximum(q, -8), 7)


@triton.jit
def _int4_kernel(x_ptr, q_ptr, s_ptr, N, K, qmax, BLOCK_P: tl.constexpr, GROUP: tl.constexpr):
    """Grid ``(cdiv(N/2, BLOCK_P), K/GROUP, B)``: row pairs ``[pid*BLOCK_P, +BLOCK_P)`` of group g of item b."""
    b = tl.program_id(2).to(tl.int64)
    g = tl.program_id(1).to(tl.int64)
    pairs = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    ok = pairs < N // 2
    cols = g * GROUP + tl.arange(0, GROUP)
    even = b * N * K + (2 * pairs) * K  # int64 element offset of each even row
    offs = even[:, None] + cols[None, :]
    xe = tl.load(x_ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)
    xo = tl.load(x_ptr + offs + K, mask=ok[:, None], other=0.0).to(tl.float32)
    se = scale_from_amax(tl.max(tl.abs(xe), axis=1), qmax)
    so = scale_from_amax(tl.max(tl.abs(xo), axis=1), qmax)
    packed = (_codes(xe, se) & 0xF) | ((_codes(xo, so) & 0xF) << 4)
    q_offs = b * (N // 2) * K + pairs[:, None] * K + cols[None, :]
    tl.store(q_ptr + q_offs, packed.to(tl.uint8), mask=ok[:, None])
    groups = K // GROUP
    s_offs = b * N * groups + (2 * pairs) * groups + g
    tl.store(s_ptr + s_offs, se, mask=ok)
    tl.store(s_ptr + s_offs + groups, so, mask=ok)


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [B, N, K]`` (N even, K % 128 == 0) -> (uint8 ``[B, N/2, K]``, fp32 scales ``[B, N, K/128]``)."""
    batch, n, k = w.shape
    if n % 2 or k % INT4_GROUP:
        raise ValueError(f"INT4 needs out-features divisible by 2 and in-features by {INT4_GROUP}, got shape {[n, k]}")
    block_p = min(PAIR_TILE, next_pow2(max(1, n // 2)))
    q = torch.empty((batch, n // 2, k), dtype=torch.uint8, device=w.device)
    s = torch.empty((batch, n, k // INT4_GROUP), dtype=torch.float32, device=w.device)
    grid = (cdiv(n // 2, block_p), k // INT4_GROUP, batch)
    _int4_kernel[grid](w, q, s, n, k, INT4_SYM_MAX, BLOCK_P=block_p, GROUP=INT4_GROUP, num_warps=WARPS)
    return q, s
