"""GPTQ (Frantar et al., 2022): round a weight column by column, correcting the columns not yet
rounded for the error of each rounded one, weighted by the input Hessian ``H = X^T X / T``.

The scales are fixed before the first column (:mod:`.grid`: the scheme's own scales of the
original weight, RTN or searched), so the output is the format's exact bytes. For a weight
``W [N, K]`` (fused members that share an input share ``H`` and are solved as one ``[sum N, K]``)::

    dead = diag(H) == 0: H[d, d] = 1 (such a column keeps plain rounding: nothing couples to it)
    perm = columns by decreasing diag(H) (act order; the scales stay those of the original columns,
           so the order needs no extra tensor at serve time), stable for ties
    H = diag(H) + (1 - shrink) * offdiag(H)  shrink 0.5: the off-diagonal (the channels' correlations)
                                             halved, toward the diagonal, before solving (see SHRINK)
    H += damp * mean(diag(H)) * I           damp 0.1 (llm-compressor's default is 0.01), x10 while H is not
                                             positive definite (at most 4 times)
    U = cholesky(H^-1, upper)                the rows of the inverse Hessian GPTQ propagates with
    for each block of 128 columns, for each column j in it:
        q_j = grid(w_j);  e_j = (w_j - q_j) / U[j, j];  w_{j+1..} -= e_j U[j, j+1..]  (in the block)
    then the columns after the block: W[:, after] -= E U[block, after]   (lazy batch update)

All arithmetic is fp32 on the weight's device; the same inputs give the same bytes (no
randomness, stable sorts), on the CPU whatever the thread count (the solver runs on one thread there:
:mod:`.one_thread`). A Hessian that is not finite, or not positive definite after the last damping,
raises :class:`HessianError` (the caller names the module). :func:`output_error` is the objective,
``tr((W - Q) H (W - Q)^T)`` with the measured ``H`` (not the shrunk one the solver uses).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .grid import Grid
from .one_thread import one_thread

BLOCK = 128
# The CPU's lazy update multiplies this many rows at a time (:func:`_update`: row slices give equal bytes).
TILE_ROWS = 64
# 10% of mean(diag H), not llm-compressor's 1%: with the few thousand tokens the shipped calibration
# text gives, 1% fits the calibration text (SmolLM2 W4A16_NVFP4, docs/accuracy.md: GPTQ perplexity
# 25.00 at 1% vs 24.15 at 10%; with the weighted search 23.13 vs 22.42; KL and top-1 agree).
DAMP = 0.1
DAMP_RETRIES = 4
# The share of H's off-diagonal taken away before solving: a shrinkage of the sample covariance toward
# its diagonal (Ledoit-Wolf's diagonal target, with a fixed weight). H comes from a few thousand
# calibration tokens, so its off-diagonal (which decides where GPTQ moves each column's error) is a
# noisy estimate and GPTQ fits the calibration text: on SmolLM2 W4A16_NVFP4 the layers' output error on
# it fell to 0.17 of round to nearest's while held-out perplexity closed only 22% of the gap (and
# choosing the group scales from the updated weights cut that error by 40% more and the perplexity
# by nothing). Shrunk by 0.3 to 0.8 it closed 37-42% (0.5: 39%, KL 0.209 -> 0.183); docs/accuracy.md.
SHRINK = 0.5


class HessianError(ValueError):
    """GPTQ cannot solve with this input Hessian (the message says why; the caller adds the module)."""


@dataclass
class Solution:
    """The rounded weight ``[N, K]`` (fp32 grid values), the damping used and the objective of
    GPTQ and of round-to-nearest under the same scales (``tr(D H D^T)``, D the weight error)."""

    values: torch.Tensor
    damp: float
    error: float
    rtn_error: float


def output_error(w: torch.Tensor, q: torch.Tensor, h: torch.Tensor) -> float:
    """``tr((w - q) h (w - q)^T)``: the summed squared output error over the calibration inputs / T."""
    d = (w.float() - q.float())
    return float(((d @ h) * d).sum())


def _inverse_factor(h: torch.Tensor, damp: float) -> tuple[torch.Tensor, float]:
    """Upper Cholesky factor of the damped inverse of `h` (damping raised x10 while it fails).

    `h` is consumed: damped in place and freed once factored, so a ``[K, K]`` Hessian costs about
    two more of its size at the peak, not five (a 14336-wide ``down_proj`` input: 0.8 GB each).
    """
    diag = torch.diagonal(h)
    mean = diag.mean()
    undamped = diag.clone()
    for attempt in range(DAMP_RETRIES + 1):
        d = damp * 10**attempt
        diag.copy_(undamped).add_(d * mean)
        low, info = torch.linalg.cholesky_ex(h)
        if int(info) == 0:
            del h, diag
            inv = torch.cholesky_inverse(low)
            del low
            return torch.linalg.cholesky(inv, upper=True), d
        del low
    raise HessianError(f"its input Hessian is not positive definite even with damping {d:g} of its mean diagonal")


def _order(h: torch.Tensor, act_order: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the column order ``[K]``, the dead channels ``[K]`` bool: diag(H) == 0). Act order sorts by
    decreasing diag(H), a dead channel counting as 1 (its diagonal is set to 1)."""
    diag = torch.diagonal(h).float()
    dead = diag == 0
    if not act_order:
        return torch.arange(h.shape[0], device=h.device), dead
    return torch.argsort(torch.where(dead, torch.ones_like(diag), diag), descending=True, stable=True), dead


def _permuted(h: torch.Tensor, perm: torch.Tensor, dead: torch.Tensor, shrink: float = 0.0) -> torch.Tensor:
    """``h`` fp32 in the order `perm`, its off-diagonal times ``1 - shrink``, dead channels' diagonal
    set to 1: one new ``[K, K]``."""
    H = h.float()[perm][:, perm]
    if shrink:
        diag = H.diagonal().clone()
        H.mul_(1.0 - shrink)
        H.diagonal().copy_(diag)
    H.diagonal()[dead[perm]] = 1.0
    return H


def _round_with(grids: list[Grid]):
    """Column rounding for members stacked by rows: one scale matrix, the family's rounding."""
    scale = torch.cat([g.scale for g in grids]) if len(grids) > 1 else grids[0].scale
    codes = torch.cat([g.codes for g in grids]) if len(grids) > 1 else grids[0].codes
    zero = None if grids[0].zero is None else torch.cat([g.zero for g in grids]) if len(grids) > 1 else grids[0].zero
    family = grids[0]

    def round_col(x: torch.Tensor, col: int, rows: slice = slice(None)) -> torch.Tensor:
        c, v = family.quantize_with(x, scale[rows, col], None if zero is None else zero[rows, col])
        codes[rows, col] = c
        return v

    def finish() -> None:
        if len(grids) > 1:  # hand each member its rows of the codes
            start = 0
            for g in grids:
                g.codes.copy_(codes[start : start + g.codes.shape[0]])
                start += g.codes.shape[0]

    return round_col, finish, scale, codes, zero


def use_kernel(device: torch.device, grids: list[Grid], block: int) -> bool:
    """Run the block loop in the Triton kernel (``kernels/gptq_block.py``, same bits)? On a CUDA
    device with Triton, for grids the kernel knows and blocks it holds."""
    from .. import kernels

    if not (device.type == "cuda" and kernels.has_triton() and grids and grids[0].kernel):
        return False
    from ..kernels.gptq_block import MAX_WIDTH

    return block <= MAX_WIDTH


def solve(w: torch.Tensor, h: torch.Tensor, grids: list[Grid], block: int = BLOCK, damp: float = DAMP,
          act_order: bool = True, kernel: bool | None = None, rows: int | None = None, shrink: float = SHRINK) -> Solution:
    """GPTQ of `w` ``[N, K]`` (the members of `grids` stacked by rows) under Hessian `h` ``[K, K]``.

    Each grid receives its members' codes (``grid.outputs()`` are then the format's tensors).
    `kernel`: run each block in the Triton kernel (None: :func:`use_kernel`; True also runs it on
    the CPU under ``TRITON_INTERPRET=1``, which the tests use to hold it to this loop).
    `shrink`: the share of `h`'s off-diagonal removed before solving (:data:`SHRINK`; 0: plain GPTQ).
    `rows`: solve at most this many rows at a time (None: all; see :func:`slice_rows`). The rows are
    independent given the inverse-Hessian factor, and on the CPU the lazy update multiplies fixed
    tiles of :data:`TILE_ROWS` rows, so any slicing gives the same bytes; on a GPU the update is one
    GEMM over the rows given, so slice there only where its bytes may change.
    """
    if not bool(torch.isfinite(h).all()):
        raise HessianError("its input Hessian has non-finite values (the activations before it overflow)")
    if not 0.0 <= shrink < 1.0:
        raise ValueError(f"shrink {shrink}: must be in [0, 1)")
    with one_thread(w.device):
        return _solve(w, h, grids, block, damp, act_order, kernel, rows, shrink)


def slice_rows(k: int, budget: int | None) -> int | None:
    """Rows GPTQ solves at a time within a quarter of `budget` (host bytes; None: all rows): a row
    of the slice holds about eight fp32 copies of its ``K`` values (weight, its working copy, the
    rounded values in both column orders, round-to-nearest's, the error terms)."""
    if not budget:
        return None
    return max(1, budget // 4 // (8 * 4 * k))


def _solve(w, h, grids, block, damp, act_order, kernel, rows, shrink) -> Solution:
    n, k = w.shape
    perm, dead = _order(h, act_order)
    U, used = _inverse_factor(_permuted(h, perm, dead, shrink), damp)  # no reference kept here: freed once factored
    round_col, finish, scale, codes, zero = _round_with(grids)
    in_kernel = use_kernel(w.device, grids, block) if kernel is None else kernel
    order = perm.tolist()  # one host copy of the order: no sync per column
    inv = torch.argsort(perm)
    href = h.float()
    values = torch.empty((n, k), device=w.device)  # the rounded weight, original column order
    error = rtn_error = 0.0
    for r0 in range(0, n, rows or n):
        r = slice(r0, min(r0 + (rows or n), n))
        W = w[r].float()[:, perm]  # a new tensor: the loop below changes it in place
        Q = torch.zeros_like(W)
        sz = None if zero is None else zero[r]
        if in_kernel:
            _blocks_in_kernel(W, U, Q, codes[r], scale[r], sz, perm, grids[0], block)
        else:
            _blocks_in_torch(W, U, Q, _rows_of(round_col, r), order, block)
        del W
        values[r] = Q[:, inv]
        del Q
        wr = w[r].float()
        error += output_error(wr, values[r], href)
        rtn_error += output_error(wr, grids[0].quantize_with(wr, scale[r], sz)[1] if grids else wr, href)
    finish()
    return Solution(values, used, error, rtn_error)


def _rows_of(round_col, r: slice):
    """`round_col` for the rows `r` of the stacked weight."""
    return lambda x, col: round_col(x, col, r)


def _update(W: torch.Tensor, E1: torch.Tensor, U: torch.Tensor) -> None:
    """The lazy batch update ``W -= E1 @ U`` (W the columns after the block).

    On the CPU the product is taken :data:`TILE_ROWS` rows at a time, the last tile padded with
    zero rows: every row then goes through the very same GEMM shape whatever the rows around it, so
    solving in row slices (:func:`solve`'s `rows`) gives the bytes of one slice. A whole-matrix
    GEMM does not: MKL picks another kernel by the row count (one row, or a larger matrix, changes
    the bits of every row). On a GPU it stays one GEMM (its bytes as before).
    """
    n = E1.shape[0]
    if E1.device.type != "cpu":
        W -= E1 @ U
        return
    for t0 in range(0, n, TILE_ROWS):
        e = E1[t0 : t0 + TILE_ROWS]
        m = e.shape[0]
        if m < TILE_ROWS:
            e = torch.cat([e, e.new_zeros((TILE_ROWS - m, e.shape[1]))])
        W[t0 : t0 + m] -= (e @ U)[:m]


def _blocks_in_torch(W, U, Q, round_col, order: list[int], block: int) -> None:
    """The reference: each column rounded, its error spread over the block's later columns."""
    n, k = W.shape
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        W1, E1, U1 = W[:, b0:b1].clone(), torch.zeros((n, b1 - b0), device=W.device), U[b0:b1, b0:b1]
        for j in range(b1 - b0):
            col = W1[:, j]
            q = round_col(col, order[b0 + j])
            Q[:, b0 + j] = q
            err = (col - q) / U1[j, j]
            W1[:, j:] -= err[:, None] * U1[j, j:][None, :]
            E1[:, j] = err
        _update(W[:, b1:], E1, U[b0:b1, b1:])


def _blocks_in_kernel(W, U, Q, codes, scale, zero, perm, family: Grid, block: int) -> None:
    """The same loop with each block's columns in one Triton launch (equal bits)."""
    from ..kernels.gptq_block import gptq_block

    scale = scale.float().contiguous()  # the kernel addresses dense [N, K] rows (no copy when it already is)
    zero = None if zero is None else zero.float().contiguous()
    lo, hi = family.code_range
    k = W.shape[1]
    Uc = U.contiguous()  # for the kernel's addressing; the update below multiplies U itself, as the
    # reference does: a GEMM on another memory layout may accumulate in another order
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        E1 = gptq_block(W, Uc, Q, codes, scale, zero, perm, b0, b1, family.kernel, lo, hi)
        _update(W[:, b1:], E1, U[b0:b1, b1:])


def _split(w: torch.Tensor, grids: list[Grid]) -> list[torch.Tensor]:
    sizes = [g.codes.shape[0] for g in grids]
    return list(torch.split(w, sizes))


__all__ = ["solve", "slice_rows", "output_error", "Solution", "HessianError", "BLOCK", "DAMP", "SHRINK", "TILE_ROWS"]
