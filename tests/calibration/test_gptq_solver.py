"""The GPTQ solver against a plain reference, and the value grids against the schemes' own bytes."""

from __future__ import annotations

import pytest
import torch

from quantize_cli.calibration import gptq
from quantize_cli.calibration.grid import fixed_grid
from quantize_cli.formats import CT_SCHEMES
from quantize_cli.schemes import SCHEMES
from quantize_cli.schemes.searched import with_scale_search

MODELOPT = ["NVFP4", "W4A16_NVFP4", "INT8", "INT4", "FP8", "FP8_PER_CHANNEL_PER_TOKEN", "MXFP8"]


def _problem(n: int, k: int, seed: int, tokens: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight and the Hessian of correlated inputs with a few large channels (as real activations)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16)
    mix = torch.randn(k, k, generator=g) / k**0.5 + torch.eye(k)
    x = torch.randn(tokens, k, generator=g) @ mix
    x[:, : max(1, k // 8)] *= 6.0
    return w, x.t() @ x / tokens


def _reference(w: torch.Tensor, h: torch.Tensor, grid, order: list[int], damp: float = gptq.DAMP,
               shrink: float = gptq.SHRINK) -> torch.Tensor:
    """GPTQ as its objective reads, column by column in fp64: round column j, spread its error over the
    columns still unrounded with the inverse Hessian, then remove j from the inverse (Schur complement).
    The Hessian's off-diagonal is first scaled by ``1 - shrink`` (gptq.SHRINK), then damped."""
    W = w.double().clone()
    H = h.double().clone()
    diag = H.diagonal().clone()
    H.mul_(1 - shrink).diagonal().copy_(diag)
    H.diagonal().add_(damp * H.diagonal().mean())
    Hinv = torch.linalg.inv(H)
    left = list(order)
    Q = torch.zeros_like(W)
    for j in order:
        left.remove(j)
        q = grid.round(W[:, j : j + 1].float(), slice(j, j + 1)).double()[:, 0]
        Q[:, j] = q
        err = (W[:, j] - q) / Hinv[j, j]
        if left:
            W[:, left] -= err[:, None] * Hinv[j, left][None, :]
        Hinv = Hinv - Hinv[:, j : j + 1] @ Hinv[j : j + 1, :] / Hinv[j, j]
    return Q


@pytest.mark.parametrize("algo", ["W4A16_NVFP4", "INT8", "INT4", "FP8_PER_CHANNEL_PER_TOKEN"])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shrink", [gptq.SHRINK, 0.0])
def test_solver_equals_plain_reference(algo, act_order, seed, shrink):
    scheme = SCHEMES[algo]
    w, h = _problem(8, {"W4A16_NVFP4": 32, "INT4": 256}.get(algo, 16), seed)  # INT4: two 128-groups
    grid = fixed_grid(scheme, w, None)
    sol = gptq.solve(w, h, [grid], block=8, act_order=act_order, shrink=shrink)  # blocks of 8: the lazy batch update runs too
    order = torch.argsort(torch.diagonal(h), descending=True, stable=True).tolist() if act_order else list(range(w.shape[1]))
    ref_grid = fixed_grid(scheme, w, None)
    ref = _reference(w, h, ref_grid, order, shrink=shrink)
    assert torch.equal(grid.codes, ref_grid.codes), "GPTQ chose other codes than the plain reference"
    torch.testing.assert_close(sol.values.double(), ref, rtol=0, atol=0)
    assert sol.error < sol.rtn_error  # the objective: lower H-weighted output error than round-to-nearest


def test_shrink_is_plain_gptq_on_the_shrunk_hessian_and_the_objective_reads_the_measured_one():
    """gptq.SHRINK only changes the Hessian the solver uses (its off-diagonal times 1 - shrink); the
    reported objective stays tr(D H D^T) with the measured H, so the two runs' errors are comparable."""
    scheme = SCHEMES["W4A16_NVFP4"]
    w, h = _problem(16, 64, 7)
    shrunk = h * (1 - gptq.SHRINK)
    shrunk.diagonal().copy_(h.diagonal())
    a, b, plain = (fixed_grid(scheme, w, None) for _ in range(3))
    sa = gptq.solve(w, h, [a])
    sb = gptq.solve(w, shrunk, [b], shrink=0.0)
    sp = gptq.solve(w, h, [plain], shrink=0.0)
    assert torch.equal(a.codes, b.codes) and not torch.equal(a.codes, plain.codes)
    assert sa.error == gptq.output_error(w, sa.values, h) and sa.rtn_error == sp.rtn_error
    with pytest.raises(ValueError, match="shrink"):
        gptq.solve(w, h, [fixed_grid(scheme, w, None)], shrink=1.0)


@pytest.mark.parametrize("algo", MODELOPT)
def test_identity_hessian_gives_round_to_nearest(algo):
    """Without correlations nothing is propagated: GPTQ rounds every column to nearest, the scheme's own bytes."""
    scheme = SCHEMES[algo]
    k = 128 if algo == "INT4" else 64  # INT4: whole groups of 128
    w, _ = _problem(16, k, 3)
    grid = fixed_grid(scheme, w, None)
    gptq.solve(w, torch.eye(k), [grid], act_order=True)
    rtn = scheme.quantize(w)
    for name, t in grid.outputs().items():
        assert torch.equal(t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t,
                           rtn[name].view(torch.uint8) if rtn[name].dtype == torch.float8_e4m3fn else rtn[name]), name


@pytest.mark.parametrize("scheme", [SCHEMES[a] for a in MODELOPT] + [SCHEMES["FP8_PB_WO"]] + list(CT_SCHEMES.values())
                         + [with_scale_search(SCHEMES["NVFP4"], "mse"), with_scale_search(SCHEMES["INT8"], "mse")],
                         ids=lambda s: f"{type(s).__name__}-{s.algo}")
def test_grid_values_are_what_the_scheme_dequantizes(scheme):
    """The values GPTQ rounds to are bit for bit what the written tensors dequantize to, scales untouched."""
    w, h = _problem(128, 128, 4)
    grid = fixed_grid(scheme, w, None)
    sol = gptq.solve(w, h, [grid])
    out = grid.outputs()
    assert torch.equal(scheme.dequantize(out).float(), sol.values)
    rtn = scheme.quantize(w)
    assert set(out) == set(rtn)
    for name in rtn:
        if name not in ("weight", "weight_packed"):
            assert torch.equal(out[name], rtn[name]), f"{name}: the scales must stay the scheme's"


def test_fused_members_solved_as_one_equal_separately_solved():
    """Members sharing a Hessian (q/k/v) are stacked by rows; rows are independent under GPTQ."""
    scheme = SCHEMES["NVFP4"]
    w, h = _problem(24, 64, 5)
    parts = list(torch.split(w, [8, 4, 12]))
    gamax = torch.stack([scheme.global_amax(p) for p in parts]).amax()
    stacked = [fixed_grid(scheme, p, gamax) for p in parts]
    gptq.solve(w, h, stacked)
    for p, g in zip(parts, stacked):
        alone = fixed_grid(scheme, p, gamax)
        gptq.solve(p, h, [alone])
        assert torch.equal(g.codes, alone.codes)


def test_dead_input_channels_keep_round_to_nearest_and_deterministic():
    w, h = _problem(8, 32, 6)
    h[5, :] = 0
    h[:, 5] = 0
    scheme = SCHEMES["INT8"]
    a, b = fixed_grid(scheme, w, None), fixed_grid(scheme, w, None)
    gptq.solve(w, h, [a])
    gptq.solve(w, h, [b])
    assert torch.equal(a.codes, b.codes)
    rtn = scheme.quantize(w)["weight"]
    assert torch.equal(a.codes[:, 5], rtn[:, 5])


def test_damping_is_raised_for_a_singular_hessian():
    w, _ = _problem(8, 32, 7)
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    h = -(x.t() @ x)  # negative definite: even damped it is not positive definite
    with pytest.raises(ValueError, match="not positive definite"):
        gptq.solve(w, h, [fixed_grid(SCHEMES["INT8"], w, None)])
