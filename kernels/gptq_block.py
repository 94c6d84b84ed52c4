"""GPTQ's inner loop as one kernel per column block: round, spread the error, next column.

Equal bit for bit to the torch loop of ``quantize_cli.calibration.gptq.solve`` (its reference), for
one block of columns ``[b0, b1)`` of the act-ordered weight ``W [N, K]`` (fp32)::

    for j in b0 .. b1-1:                       (c = perm[j], the column's original index)
        q    = W1[:, j] / S[:, c] (+ Z[:, c])                  exact division
        code = nearest(q)                                      the grid's rounding (E2M1, e4m3, int)
        v    = (value(code) (- Z[:, c])) * S[:, c]             the grid value, as the schemes decode
        Q[:, j] = v;  codes[:, c] = code
        err  = (W1[:, j] - v) / U[j, j];  E[:, j - b0] = err
        W1[:, j:] -= err * U[j, j:]                            product, then difference (no FMA)

Rows are independent within a block, so a program owns ``BLOCK_N`` rows and the whole block
(at most 128 columns) in registers, and walks the columns in order: one launch replaces the
torch loop's ~30 small launches per column. The block's update of the later columns
(``W[:, b1:] -= E @ U[b0:b1, b1:]``) stays a torch matmul in the caller, as in the reference.

A column is taken out of the register tile by a max over the row with every other column set to
``-inf``: it returns the element itself, the sign of a zero included (a masked sum would not: a
reduction may start from +0.0, and ``+0.0 + -0.0`` is ``+0.0``). FMA
contraction is switched off at compile time (``enable_fp_fusion=False``): the reference rounds
the product before subtracting it.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from ._tl_math import div_rn, e2m1_codes, e4m3, e4m3_to_f32, rint_i32
from ._validate import cdiv, next_pow2, soft_fp8

KINDS = {"e2m1": 0, "e4m3": 1, "int": 2}  # the grids' `kernel` names -> the kernel's KIND
BLOCK_N = 16
WARPS = 4
MAX_WIDTH = 128


@triton.jit
def _e2m1_value(code):
    """fp32 value of an E2M1 nibble (``numerics.E2M1_VALUES``; code 8 is -0.0). The sign is set
    in the bits: the GPU compiler may fold ``where(neg, -mag, mag)`` into a form that drops -0.0."""
    m = code & 7
    mag = tl.where(m < 4, m.to(tl.float32) * 0.5, tl.where(m == 4, 2.0, tl.where(m == 5, 3.0, tl.where(m == 6, 4.0, 6.0))))
    return (mag.to(tl.int32, bitcast=True) | (((code >> 3) & 1) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _gptq_block_kernel(w_ptr, s_ptr, z_ptr, u_ptr, perm_ptr, q_ptr, c_ptr, e_ptr,
                       N, K, b0, width, lo, hi,
                       KIND: tl.constexpr, HAS_Z: tl.constexpr, SOFT: tl.constexpr,
                       BLOCK_N: tl.constexpr, BW: tl.constexpr):
    """Grid ``(cdiv(N, BLOCK_N),)``. ``w, q [N, K]`` fp32 act-ordered; ``s, z, c [N, K]`` in the
    original column order (``perm`` maps); ``u [K, K]``; ``e [N, width]``."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rok = rows < N
    cols = tl.arange(0, BW)
    base = rows * K  # int64 offset of each row in every [N, K] tensor
    tile = tl.load(w_ptr + base[:, None] + b0 + cols[None, :], mask=rok[:, None] & (cols < width)[None, :], other=0.0)
    for j in range(0, width):
        col = tl.max(tl.where(cols[None, :] == j, tile, float("-inf")), axis=1)
        orig = tl.load(perm_ptr + b0 + j).to(tl.int64)
        s = tl.load(s_ptr + base + orig, mask=rok, other=1.0)
        q = div_rn(col, s)
        if HAS_Z:
            z = tl.load(z_ptr + base + orig, mask=rok, other=0.0)
            q = q + z
        if KIND == 0:
            code = e2m1_codes(q)
            val = _e2m1_value(code)
        elif KIND == 1:
            f8 = e4m3(q, SOFT)
            code = f8.to(tl.uint8, bitcast=True).to(tl.int32)
            val = e4m3_to_f32(f8, SOFT)
        else:  # round half to even (torch.round), clamp; |q| kept inside rint_i32's range first
            code = tl.minimum(tl.maximum(rint_i32(tl.minimum(tl.maximum(q, -4194304.0), 4194304.0)), lo), hi)
            val = code.to(tl.float32)
        if HAS_Z:
            val = val - z
        v = val * s
        tl.store(q_ptr + base + b0 + j, v, mask=rok)
        tl.store(c_ptr + base + orig, code.to(c_ptr.dtype.element_ty), mask=rok)
        ujj = tl.load(u_ptr + (b0 + j) * K + b0 + j)
        err = div_rn(col - v, ujj)
        tl.store(e_ptr + rows * width + j, err, mask=rok)
        later = (cols >= j) & (cols < width)
        u = tl.load(u_ptr + (b0 + j) * K + b0 + cols, mask=later, other=0.0)
        tile = tl.where(later[None, :], tile - err[:, None] * u[None, :], tile)


def gptq_block(W: torch.Tensor, U: torch.Tensor, Q: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor,
               zero: torch.Tensor | None, perm: torch.Tensor, b0: int, b1: int, kind: str,
               lo: int = 0, hi: int = 0) -> torch.Tensor:
    """Round columns ``[b0, b1)`` of ``W [N, K]`` (fp32, act-ordered, contiguous) into ``Q`` (same
    order) and ``codes`` (original order, ``perm [K]`` int64 maps), under ``scale`` / ``zero``
    ``[N, K]`` (original order) and the upper inverse-Hessian factor ``U [K, K]``. Returns the
    block's scaled errors ``E [N, b1 - b0]`` for the caller's update of the later columns.
    `kind`: ``e2m1``, ``e4m3`` or ``int`` (codes clamped to ``[lo, hi]``)."""
    n, k = W.shape
    width = b1 - b0
    if not 0 < width <= MAX_WIDTH:
        raise ValueError(f"gptq_block: a block is 1..{MAX_WIDTH} columns, got {width}")
    for name, t in (("W", W), ("Q", Q), ("scale", scale), ("U", U)):
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"gptq_block: {name} must be contiguous fp32, got {t.dtype}")
    err = torch.empty((n, width), dtype=torch.float32, device=W.device)
    z = zero if zero is not None else scale  # unread when HAS_Z is off
    with torch.cuda.device(W.device) if W.device.type == "cuda" else contextlib.nullcontext():
        _gptq_block_kernel[(cdiv(n, BLOCK_N),)](
            W, scale, z, U, perm, Q, codes, err, n, k, b0, width, lo, hi,
            KIND=KINDS[kind], HAS_Z=zero is not None, SOFT=soft_fp8(W.device),
            BLOCK_N=BLOCK_N, BW=next_pow2(max(width, 16)), num_warps=WARPS, enable_fp_fusion=False)
    return err


__all__ = ["gptq_block", "KINDS", "MAX_WIDTH"]
