"""GPTQ's block kernel equals the solver's torch loop bit for bit, for every value grid.

``gptq.solve(kernel=True)`` runs each column block in ``kernels/gptq_block.py`` (the interpreter on
the CPU); ``kernel=False`` is the reference loop. Codes, grid values and the written tensors must be
identical, including signed zeros, saturation, dead input channels, partial blocks and fused members.
"""

from __future__ import annotations

import pytest
import torch

from quantize_cli.calibration import gptq
from quantize_cli.calibration.grid import fixed_grid
from quantize_cli.formats import CT_SCHEMES
from quantize_cli.schemes import SCHEMES
from quantize_cli.schemes.searched import with_scale_search

SCHEMES_UNDER_TEST = ([SCHEMES[a] for a in ("NVFP4", "W4A16_NVFP4", "INT8", "INT4", "FP8", "FP8_PER_CHANNEL_PER_TOKEN",
                                            "FP8_PB_WO", "MXFP8")]
                      + [CT_SCHEMES[a] for a in ("NVFP4", "INT4", "INT4_ASYM")]
                      + [with_scale_search(SCHEMES["NVFP4"], "mse")])


def _problem(n: int, k: int, device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A bf16 weight with exact (signed) zeros and outliers, and a Hessian with a dead channel and
    a few dominant ones (as real activations give)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    w[0, :7] = 0.0
    w[1, :7] = -0.0
    w[2, 5] = 40.0  # an outlier: its group's scale is large, the rest of the group rounds near zero
    x = torch.randn(3 * k, k, generator=g) @ (torch.randn(k, k, generator=g) / k**0.5 + torch.eye(k))
    x[:, :4] *= 30.0
    x[:, 9] = 0.0  # a dead input channel
    return w.to(torch.bfloat16).to(device), (x.t() @ x / x.shape[0]).to(device)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _solve_both(scheme, w, h, block, members=1):
    grids = {}
    sols = {}
    for kernel in (False, True):
        parts = list(torch.chunk(w, members))
        gamax = w.float().abs().amax() if members > 1 else None
        grids[kernel] = [fixed_grid(scheme, p, gamax) for p in parts]
        sols[kernel] = gptq.solve(w, h, grids[kernel], block=block, kernel=kernel)
    return grids, sols


@pytest.mark.parametrize("scheme", SCHEMES_UNDER_TEST, ids=lambda s: f"{type(s).__name__}-{s.algo}")
def test_block_kernel_equals_the_torch_loop(scheme, device):
    k = 256 if "INT4" in scheme.algo else 160  # INT4: whole 128-groups; else a partial second block
    w, h = _problem(20, k, device)
    grids, sols = _solve_both(scheme, w, h, block=128)
    assert torch.equal(sols[True].values.view(torch.int32), sols[False].values.view(torch.int32))
    assert sols[True].error == sols[False].error
    for ref, got in zip(grids[False], grids[True]):
        assert torch.equal(got.codes, ref.codes)
        for name, t in ref.outputs().items():
            assert torch.equal(_bits(got.outputs()[name]), _bits(t)), name


@pytest.mark.parametrize("algo", ["NVFP4", "INT8"])
def test_small_blocks_and_fused_members(algo, device):
    """Blocks of 32 (the lazy update between kernel launches runs) and two members stacked by rows."""
    w, h = _problem(24, 96, device, seed=1)
    grids, sols = _solve_both(SCHEMES[algo], w, h, block=32, members=2)
    assert torch.equal(sols[True].values.view(torch.int32), sols[False].values.view(torch.int32))
    for ref, got in zip(grids[False], grids[True]):
        assert torch.equal(got.codes, ref.codes)


def test_block_wider_than_the_kernel_is_refused(device):
    from quantize_cli.kernels.gptq_block import MAX_WIDTH, gptq_block

    n, k = 4, MAX_WIDTH + 8
    z = torch.zeros(n, k, device=device)
    with pytest.raises(ValueError, match="a block is 1..128 columns"):
        gptq_block(z, torch.eye(k, device=device), z.clone(), torch.zeros(n, k, dtype=torch.uint8, device=device),
                   torch.ones(n, k, device=device), None, torch.arange(k, device=device), 0, k, "e2m1")


def test_auto_choice_is_the_kernel_only_on_cuda():
    w, h = _problem(4, 32, "cpu")
    assert not gptq.use_kernel(torch.device("cpu"), [fixed_grid(SCHEMES["NVFP4"], w, None)], 128)
    assert not gptq.use_kernel(torch.device("cuda"), [fixed_grid(SCHEMES["NVFP4"], w, None)], 256)  # wider than a launch holds


@pytest.mark.parametrize("scheme", [SCHEMES["INT4"], SCHEMES["NVFP4"]], ids=lambda s: s.algo)
def test_block_kernel_in_row_slices_equals_the_whole_torch_loop(scheme, device):
    """Row slices (gptq.solve's `rows`, the CPU working set) hand the kernel row views of the codes and
    scales: the bytes stay those of the unsliced reference (on the CPU, where solve slices: a GPU's
    lazy update is one GEMM over the rows it is given)."""
    if device.type != "cpu":
        pytest.skip("row slices are the CPU's")
    w, h = _problem(20, 256, device)
    ref, sliced = fixed_grid(scheme, w, None), fixed_grid(scheme, w, None)
    a = gptq.solve(w, h, [ref], kernel=False)
    b = gptq.solve(w, h, [sliced], kernel=True, rows=7)
    assert torch.equal(a.values.view(torch.int32), b.values.view(torch.int32))
    assert torch.equal(_bits(ref.codes), _bits(sliced.codes))
