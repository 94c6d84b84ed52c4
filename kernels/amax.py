"""Max-|w| reductions: whole tensor (per stacked weight) and any block shape.

abs and max are exact in every float dtype, so results equal ``Scheme.global_amax`` and
``numerics.block_amax`` exactly. The quantize kernels compute their row / block / group amax from
the tile they already hold (single pass); these reductions serve the schemes whose scale depends on
the whole tensor (``FP8``, ``NVFP4``: one pass before quantizing) and callers that need amaxes
alone (a fused group's global amax is the max of its members' tensor amaxes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._validate import cdiv, next_pow2, num_sms

AMAX_BLOCK = 8192  # elements per loop step of the tensor reduction (16 KiB of bf16 in flight)
AMAX_WARPS = 8
AMAX_PROGRAMS_PER_SM = 4  # persistent programs: enough loads in flight to saturate HBM


@triton.jit
def _amax_partial_kernel(x_ptr, out_ptr, numel, n_prog, n_iter, BLOCK: tl.constexpr):
    """Grid ``(n_prog, B)``: program p of batch item b reduces tiles p, p + n_prog, ... of the
    ``numel``-element item and writes ``out[b, p]`` (fp32)."""
    p = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    base = x_ptr + b * numel
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(n_iter):
        # Tile indices fit int32 (numel / BLOCK); element offsets need int64.
        offs = (p + i * n_prog).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(base + offs, mask=offs < numel, other=0.0)
        acc = tl.maximum(acc, tl.abs(x).to(tl.float32))
    tl.store(out_ptr + b * n_prog + p, tl.max(acc, axis=0))


def _reduce(x: torch.Tensor, n_prog: int, block: int, warps: int) -> torch.Tensor:
    """``[B, M]`` (any float dtype, contiguous) -> ``[B, n_prog]`` fp32 partial maxima."""
    batch, numel = x.shape
    tiles = cdiv(numel, block)
    n_prog = max(1, min(n_prog, tiles))
    out = torch.empty((batch, n_prog), dtype=torch.float32, device=x.device)
    _amax_partial_kernel[(n_prog, batch)](x, out, numel, n_prog, cdiv(tiles, n_prog), BLOCK=block, num_warps=warps)
    return out


def stack_amax(w: torch.Tensor) -> torch.Tensor:
    """``max |w[b]|`` of each item of a contiguous ``[B, ...]`` tensor -> fp32 ``[B]``.

    Two launches: persistent programs write partial maxima, then one program per item reduces them.
    """
    batch = w.shape[0]
    x = w.reshape(batch, -1)
    per_item = max(1, cdiv(AMAX_PROGRAMS_PER_SM * num_sms(w.device), batch))
    partial = _reduce(x, per_item, AMAX_BLOCK, AMAX_WARPS)
    if partial.shape[1] == 1:
        return partial.reshape(batch)
    block = min(next_pow2(partial.shape[1]), 1024)
    return _reduce(partial, 1, block, 4).reshape(batch)


@triton.jit
def _block_amax_kernel(x_ptr, out_ptr, N, K, BN, BK, KB, TILE_N: tl.constexpr, TILE_K: tl.constexpr):
    """Grid ``(NB * KB, B)``: program (i, j) writes max |x| over block ``[i*BN:(i+1)*BN, j*BK:(j+1)*BK]``
    of item b (clipped at the edges) to ``out[b, i, j]``, walking it in TILE_N x TILE_K tiles."""
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    bi = (pid // KB).to(tl.int64)
    bj = (pid % KB).to(tl.int64)
    row_end = tl.minimum(bi * BN + BN, N)
    col_end = tl.minimum(bj * BK + BK, K)
    base = x_ptr + b * N * K
    acc = tl.zeros([TILE_N, TILE_K], dtype=tl.float32)
    for r0 in range(0, BN, TILE_N):
        rows = bi * BN + r0 + tl.arange(0, TILE_N)
        for c0 in range(0, BK, TILE_K):
            cols = bj * BK + c0 + tl.arange(0, TILE_K)
            mask = (rows < row_end)[:, None] & (cols < col_end)[None, :]
            x = tl.load(base + rows[:, None] * K + cols[None, :], mask=mask, other=0.0)
            acc = tl.maximum(acc, tl.abs(x).to(tl.float32))
    nb = tl.cdiv(N, BN)
    tl.store(out_ptr + b * nb * KB + pid, tl.max(tl.max(acc, axis=1), axis=0))


def stack_block_amax(w: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Per-block max |w| of a contiguous ``[B, N, K]`` stack -> fp32 ``[B, ceil(N/bn), ceil(K/bk)]``."""
    batch, n, k = w.shape
    bn, bk = (min(int(block[0]), n), min(int(block[1]), k))
    nb, kb = cdiv(n, bn), cdiv(k, bk)
    tile_k = min(next_pow2(bk), 1024)
    tile_n = min(next_pow2(bn), max(1, 4096 // tile_k))
    out = torch.empty((batch, nb, kb), dtype=torch.float32, device=w.device)
    _block_amax_kernel[(nb * kb, batch)](w, out, n, k, bn, bk, kb, TILE_N=tile_n, TILE_K=tile_k, num_warps=4)
    return out
