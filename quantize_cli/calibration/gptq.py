"""GPTQ (Frantar et al., 2022): round a weight column by column, correcting the columns not yet
rounded for the error of each rounded one, weighted by the input Hessian ``H = X^T X / T``.

The scales are fixed before the first column (:mod:`.grid`: the scheme's own scales of the
original weight, RTN or searched), so the output is the format's exact bytes. For a weight
``W [N, K]`` (fused members that share an input share ``H`` and are solved as one ``[sum N, K]``)::

    dead = diag(H) == 0: H[d, d] = 1 (such a column keeps plain rounding: nothing couples to it)
    perm = columns by decreasing diag(H) (act order; the scales stay those of the original columns,
           so the order needs no extra tensor at serve time), stable for ties
    H += damp * mean(diag(H)) * I           damp 0.01 (llm-compressor's default), x10 while H is not
                                             positive definite (at most 4 times)
    U = cholesky(H^-1, upper)                the rows of the inverse Hessian GPTQ propagates with
    for each block of 128 columns, for each column j in it:
        q_j = grid(w_j);  e_j = (w_j - q_j) / U[j, j];  w_{j+1..} -= e_j U[j, j+1..]  (in the block)
    then the columns after the block: W[:, after] -= E U[block, after]   (lazy batch update)

All arithmetic is fp32 on the weight's device; the same inputs give the same bytes (no
randomness, stable sorts). :func:`output_error` is the objective, ``tr((W - Q) H (W - Q)^T)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .grid import Grid

BLOCK = 128
DAMP = 0.01
DAMP_RETRIES = 4


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
    """Upper Cholesky factor of the damped inverse of `h` (damping raised x10 while it fails)."""
    mean = torch.diagonal(h).mean()
    for attempt in range(DAMP_RETRIES + 1):
        d = damp * 10**attempt
        hd = h.clone()
        hd.diagonal().add_(d * mean)
        low, info = torch.linalg.cholesky_ex(hd)
        if int(info) == 0:
            return torch.linalg.cholesky(torch.cholesky_inverse(low), upper=True), d
    raise ValueError(f"the Hessian is not positive definite even with damping {d:g}; give more or other calibration data")


def _round_with(grids: list[Grid]):
    """Column rounding for members stacked by rows: one scale matrix, the family's rounding."""
    scale = torch.cat([g.scale for g in grids]) if len(grids) > 1 else grids[0].scale
    codes = torch.cat([g.codes for g in grids]) if len(grids) > 1 else grids[0].codes
    zero = None if grids[0].zero is None else torch.cat([g.zero for g in grids]) if len(grids) > 1 else grids[0].zero
    family = grids[0]

    def round_col(x: torch.Tensor, col: int) -> torch.Tensor:
        c, v = family.quantize_with(x, scale[:, col], None if zero is None else zero[:, col])
        codes[:, col] = c
        return v

    def finish() -> None:
        if len(grids) > 1:  # hand each member its rows of the codes
            start = 0
            for g in grids:
                g.codes.copy_(codes[start : start + g.codes.shape[0]])
                start += g.codes.shape[0]

    return round_col, finish, scale, codes


def solve(w: torch.Tensor, h: torch.Tensor, grids: list[Grid], block: int = BLOCK, damp: float = DAMP,
          act_order: bool = True) -> Solution:
    """GPTQ of `w` ``[N, K]`` (the members of `grids` stacked by rows) under Hessian `h` ``[K, K]``.

    Each grid receives its members' codes (``grid.outputs()`` are then the format's tensors).
    """
    W = w.float().clone()
    H = h.float().clone()
    n, k = W.shape
    dead = torch.diagonal(H) == 0
    H[dead, dead] = 1.0
    perm = torch.argsort(torch.diagonal(H), descending=True, stable=True) if act_order else torch.arange(k, device=W.device)
    W, H = W[:, perm], H[perm][:, perm]
    U, used = _inverse_factor(H, damp)
    round_col, finish, scale, _ = _round_with(grids)
    Q = torch.zeros_like(W)
    order = perm.tolist()  # one host copy: no device sync per column
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
        W[:, b1:] -= E1 @ U[b0:b1, b1:]
    finish()
    inv = torch.argsort(perm)
    Q = Q[:, inv]
    href = h.float()
    rtn = torch.cat([g.quantize_with(wm.float(), g.scale, g.zero)[1] for g, wm in zip(grids, _split(w, grids))]) if grids else w
    return Solution(Q, used, output_error(w, Q, href), output_error(w, rtn, href))


def _split(w: torch.Tensor, grids: list[Grid]) -> list[torch.Tensor]:
    sizes = [g.codes.shape[0] for g in grids]
    return list(torch.split(w, sizes))


__all__ = ["solve", "output_error", "Solution", "BLOCK", "DAMP"]
