"""INT8 quantization kernel: symmetric, one fp32 scale per output row (ModelOpt ``W8A16``).

Equal bit for bit to ``quantize_cli.schemes.int8`` (design §4.3)::

    scale = row amax / 127 (all-zero row -> 1.0)                 fp32, exact division
    q     = clamp(round_half_even(w_fp32 / scale), -128, 127)    int8

Single pass for rows up to ``MAX_ONE_TILE_K`` elements (a program holds whole rows in registers);
longer rows are read twice (amax, then quantize), the second time mostly from L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..schemes.numerics import INT8_MAX
from ._tl_math import div_rn, int8_code, scale_from_amax
from ._validate import cdiv, next_pow2

ROW_TILE = 8192  # elements per program (rows x padded K)
ROW_WARPS = 8
MAX_ONE_TILE_K = 16384
ROW_LOOP_K = 4096


@triton.jit
def _int8_row_kernel(x_ptr, q_ptr, s_ptr, N, K, qmax, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ONE_TILE: tl.constexpr):
    """Grid ``(cdiv(N, BLOCK_N), B)``: rows ``[pid*BLOCK_N, +BLOCK_N)`` of item b -> int8 + ``s[b, row]``."""
    b = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    start = b * N * K + rows * K  # int64 element offset of each row
    if ONE_TILE:
        cols = tl.arange(0, BLOCK_K)
        mask = row_ok[:, None] & (cols < K)[None, :]
        offs = start[:, None] + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        scale = scale_from_amax(tl.max(tl.abs(x), axis=1), qmax)
        tl.store(q_ptr + offs, int8_code(div_rn(x, scale[:, None])), mask=mask)
    else:
        amax = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            mask = row_ok[:, None] & (cols < K)[None, :]
            x = tl.load(x_ptr + start[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
        scale = scale_from_amax(amax, qmax)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            mask = row_ok[:, None] & (cols < K)[None, :]
            offs = start[:, None] + cols[None, :]
            x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(q_ptr + offs, int8_code(div_rn(x, scale[:, None])), mask=mask)
    tl.store(s_ptr + b * N + rows, scale, mask=row_ok)


def quantize_per_row(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [B, N, K]`` -> (int8 ``[B, N, K]``, fp32 row scales ``[B, N]``)."""
    batch, n, k = w.shape
    one_tile = k <= MAX_ONE_TILE_K
    block_k = next_pow2(k) if one_tile else ROW_LOOP_K
    block_n = min(max(1, ROW_TILE // block_k), next_pow2(n))
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    s = torch.empty((batch, n), dtype=torch.float32, device=w.device)
    grid = (cdiv(n, block_n), batch)
    _int8_row_kernel[grid](w, q, s, n, k, INT8_MAX, BLOCK_N=block_n, BLOCK_K=block_k, ONE_TILE=one_tile, num_warps=ROW_WARPS)
    return q, s
