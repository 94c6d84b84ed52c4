"""FP8 e4m3 quantization kernels: per-tensor, per-row and 128x128-block scales.

Equal bit for bit to ``quantize_cli.schemes.fp8`` (design §4.1)::

    scale = amax / 448 over the group (all-zero group -> 1.0)     fp32, exact division
    q     = e4m3(clamp(w_fp32 / scale, -448, 448))                 exact division, nearest-even

All functions take a contiguous stack ``[B, N, K]`` (B = 1 for a single weight; experts of a MoE
layer otherwise) so that a whole stack is one launch. Per-row and block scales are single pass: a
program loads its tile once, reduces it and quantizes from registers. Per-tensor needs the tensor's
amax first (``amax.stack_amax``, or the caller's precomputed fused-group amax).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..schemes.fp8 import BLOCK
from ..schemes.numerics import E4M3_MAX
from ._tl_math import div_rn, e4m3, scale_from_amax
from ._validate import cdiv, next_pow2, soft_fp8

# Launch shapes (module attributes so the benchmark can sweep them; results never depend on them).
TENSOR_BLOCK = 8192  # elements per program of the per-tensor kernel
TENSOR_WARPS = 8
ROW_TILE = 8192  # elements per program of the per-row kernel (rows x padded K)
ROW_WARPS = 8
MAX_ONE_TILE_K = 16384  # longer rows are walked twice (amax, then quantize) in ROW_LOOP_K chunks
ROW_LOOP_K = 4096
BLOCK_WARPS = 16  # a 128x128 tile per program (16 warps: 56 registers, 2 programs per SM)


@triton.jit
def _fp8_tensor_kernel(x_ptr, q_ptr, amax_ptr, scale_ptr, numel, qmax, BLOCK_SIZE: tl.constexpr, SOFT: tl.constexpr):
    """Grid ``(cdiv(numel, BLOCK_SIZE), B)``: quantize one slice of item b with the scale derived
    from ``amax[b]``; program 0 also writes that scale to ``scale[b]`` (no extra launch for it)."""
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    scale = scale_from_amax(tl.load(amax_ptr + b), qmax)
    tl.store(scale_ptr + b, scale, mask=pid == 0)
    offs = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < numel
    x = tl.load(x_ptr + b * numel + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(q_ptr + b * numel + offs, e4m3(div_rn(x, scale), SOFT), mask=mask)


@triton.jit
def _fp8_row_kernel(
    x_ptr, q_ptr, s_ptr, N, K, qmax,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ONE_TILE: tl.constexpr, SOFT: tl.constexpr,
):
    """Grid ``(cdiv(N, BLOCK_N), B)``: rows ``[pid*BLOCK_N, +BLOCK_N)`` of item b -> e4m3 + ``s[b, row]``.

    ONE_TILE (``K <= BLOCK_K``): one load per element. Otherwise the row is read twice in BLOCK_K
    chunks (amax, then quantize); the second read mostly hits L2.
    """
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
        tl.store(q_ptr + offs, e4m3(div_rn(x, scale[:, None]), SOFT), mask=mask)
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
            tl.store(q_ptr + offs, e4m3(div_rn(x, scale[:, None]), SOFT), mask=mask)
    tl.store(s_ptr + b * N + rows, scale, mask=row_ok)


@triton.jit
def _fp8_block_kernel(x_ptr, q_ptr, s_ptr, N, K, NB, KB, qmax, BLOCK_SIZE: tl.constexpr, SOFT: tl.constexpr):
    """Grid ``(NB * KB, B)``: program (i, j) quantizes block ``[i*128:, j*128:]`` of item b (clipped
    at the edges) and writes its scale to ``s[b, i, j]``."""
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    rows = (pid // KB).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    cols = (pid % KB).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = (rows < N)[:, None] & (cols < K)[None, :]
    offs = b * N * K + rows[:, None] * K + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    scale = scale_from_amax(tl.max(tl.max(tl.abs(x), axis=1), axis=0), qmax)
    tl.store(q_ptr + offs, e4m3(div_rn(x, scale), SOFT), mask=mask)
    tl.store(s_ptr + b * NB * KB + pid, scale)


def quantize_per_tensor(w: torch.Tensor, amax: torch.Tensor, soft: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [B, N, K]``, ``amax [B]`` fp32 -> (e4m3 ``[B, N, K]``, fp32 scales ``[B]``)."""
    soft = soft_fp8(w.device) if soft is None else soft
    batch = w.shape[0]
    numel = w[0].numel()
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    scale = torch.empty(batch, dtype=torch.float32, device=w.device)
    grid = (cdiv(numel, TENSOR_BLOCK), batch)
    _fp8_tensor_kernel[grid](w, q, amax, scale, numel, E4M3_MAX, BLOCK_SIZE=TENSOR_BLOCK, SOFT=soft, num_warps=TENSOR_WARPS)
    return q, scale


def quantize_per_row(w: torch.Tensor, soft: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [B, N, K]`` -> (e4m3 ``[B, N, K]``, fp32 row scales ``[B, N]``)."""
    soft = soft_fp8(w.device) if soft is None else soft
    batch, n, k = w.shape
    one_tile = k <= MAX_ONE_TILE_K
    block_k = next_pow2(k) if one_tile else ROW_LOOP_K
    block_n = min(max(1, ROW_TILE // block_k), next_pow2(n))
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    s = torch.empty((batch, n), dtype=torch.float32, device=w.device)
    grid = (cdiv(n, block_n), batch)
    _fp8_row_kernel[grid](w, q, s, n, k, E4M3_MAX, BLOCK_N=block_n, BLOCK_K=block_k, ONE_TILE=one_tile, SOFT=soft, num_warps=ROW_WARPS)
    return q, s


def quantize_per_block(w: torch.Tensor, soft: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [B, N, K]`` -> (e4m3 ``[B, N, K]``, fp32 block scales ``[B, ceil(N/128), 1, ceil(K/128), 1]``)."""
    soft = soft_fp8(w.device) if soft is None else soft
    batch, n, k = w.shape
    nb, kb = cdiv(n, BLOCK), cdiv(k, BLOCK)
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    s = torch.empty((batch, nb, kb), dtype=torch.float32, device=w.device)
    _fp8_block_kernel[(nb * kb, batch)](w, q, s, n, k, nb, kb, E4M3_MAX, BLOCK_SIZE=BLOCK, SOFT=soft, num_warps=BLOCK_WARPS)
    return q, s.view(batch, nb, 1, kb, 1)
