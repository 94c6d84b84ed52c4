"""INT8 per-row kernel equals the torch reference byte for byte."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import around, assert_same, pad_rows, reference, signed, weight

from quantize_cli import kernels
from quantize_cli.kernels import int8_quant
from quantize_cli.schemes import SCHEMES

SHAPES = [(1, 16), (100, 96), (200, 176), (130, 272), (256, 384)]
SCHEME = SCHEMES["INT8"]


def check(w, what=""):
    assert_same(kernels.quantize(SCHEME, w), reference(SCHEME, w), f"INT8 {what}")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_shapes_bf16(shape, make_weight):
    check(make_weight(shape), str(shape))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(100, 96), (130, 272)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_input_dtypes(dtype, shape, make_weight):
    check(make_weight(shape, dtype, seed=1), f"{shape} {dtype}")


def test_all_zero(device):
    w = torch.zeros(100, 96, dtype=torch.bfloat16, device=device)
    assert torch.all(kernels.quantize(SCHEME, w)["weight_scale"] == 1.0)
    check(w, "zeros")


def test_round_half_even(device):
    """Row amax 127 -> scale 1 -> q = w: every half-integer tie (and its fp32 neighbours) rounds
    to the even integer, as torch.round does; -0.0 and tiny negatives give 0."""
    halves = torch.arange(0, 127, dtype=torch.float32) + 0.5
    inf = torch.tensor(float("inf"))
    v = torch.cat([halves, torch.nextafter(halves, inf), torch.nextafter(halves, -inf), torch.tensor([0.0, 1e-30, 126.9])])
    check(pad_rows(signed(v), 96, 127.0).to(device), "ties")


@pytest.mark.parametrize("amax", [0.7, 3.3e-3, 100.0 / 3.0])
def test_division_is_exact(amax, device):
    """Quotients on and next to half-integers for a scale that is not a power of two."""
    scale = (torch.tensor(amax) / 127.0).item()  # the fp32 scale the reference computes
    halves = torch.arange(0, 127, dtype=torch.float32) + 0.5
    v = signed(around(halves, scale)).clamp(-amax, amax)
    check(pad_rows(v, 128, amax).to(device), f"amax {amax}")


def test_long_rows_two_pass(make_weight, monkeypatch):
    """Rows longer than one tile take the two-pass path (amax loop, then quantize loop)."""
    monkeypatch.setattr(int8_quant, "MAX_ONE_TILE_K", 64)
    monkeypatch.setattr(int8_quant, "ROW_LOOP_K", 64)
    check(make_weight((37, 272), seed=4), "two-pass")


def test_stack_equals_items(make_weight):
    w = torch.stack([make_weight((70, 96), seed=s) for s in range(3)])
    out = kernels.quantize_stack(SCHEME, w)
    for e in range(3):
        assert_same({k: v[e] for k, v in out.items()}, reference(SCHEME, w[e]), f"stack item {e}")


def test_subnormal_scales(device):
    """Row amax / 127 is an fp32 sub-normal: no flush to zero anywhere."""
    check((weight((130, 256), torch.float32, seed=5) * 1e-40).to(device), "sub-normal scales")
