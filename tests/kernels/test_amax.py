"""Amax reductions equal Scheme.global_amax and numerics.block_amax exactly."""

from __future__ import annotations

import pytest
import torch

from quantize_cli import kernels
from quantize_cli.kernels import amax as amax_kernels
from quantize_cli.schemes import SCHEMES
from quantize_cli.schemes.numerics import block_amax


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(1, 16), (200, 176), (130, 272)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_global_amax(shape, dtype, make_weight):
    w = make_weight(shape, dtype)
    got = kernels.global_amax(w)
    want = SCHEMES["FP8"].global_amax(w)
    assert got.dtype == torch.float32 and got.shape == () and torch.equal(got.cpu(), want.cpu())


def test_global_amax_many_partials(make_weight, monkeypatch):
    """Small tiles force many persistent programs and a real second reduction stage; the largest
    value sits in the last, partial tile."""
    monkeypatch.setattr(amax_kernels, "AMAX_BLOCK", 64)
    w = make_weight((100, 96))
    w[-1, -1] = -1000.0
    assert kernels.global_amax(w).item() == 1000.0


def test_global_amax_zero_and_negative(device):
    assert kernels.global_amax(torch.zeros(3, 16, device=device)).item() == 0.0
    assert kernels.global_amax(torch.full((3, 16), -2.5, device=device)).item() == 2.5


@pytest.mark.parametrize(
    "shape, block",
    [((20, 48), (1, 16)), ((200, 272), (1, 272)), ((200, 272), (128, 128)), ((200, 272), (200, 272)), ((20, 33), (7, 5))],
    ids=str,
)
def test_block_amax(shape, block, make_weight):
    """One program per block: the small-block cases use small tensors (the interpreter is slow)."""
    w = make_weight(shape)
    assert torch.equal(kernels.block_amax(w, block).cpu(), block_amax(w, block).cpu())


def test_stack_global_amax(make_weight):
    w = torch.stack([make_weight((40, 48), seed=s) * 2.0**s for s in range(4)])
    want = torch.stack([SCHEMES["FP8"].global_amax(w[e]) for e in range(4)])
    assert torch.equal(kernels.stack_global_amax(w).cpu(), want.cpu())
