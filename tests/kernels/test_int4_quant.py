"""INT4 W4A16 (group 128) kernel equals the torch reference byte for byte (and ModelOpt's goldens)."""

from __future__ import annotations

import os

import pytest
import torch
from kernel_helpers import around, assert_same, reference, signed, weight
from safetensors.torch import load_file

from quantize_cli import kernels
from quantize_cli.schemes import SCHEMES
from tests.conftest import GOLDEN

SCHEME = SCHEMES["INT4"]
SHAPES = [(2, 128), (100, 256), (130, 384), (256, 128)]


def check(w, what=""):
    assert_same(kernels.quantize(SCHEME, w), reference(SCHEME, w), f"INT4 {what}")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_shapes_bf16(shape, make_weight):
    check(make_weight(shape), str(shape))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_input_dtypes(dtype, make_weight):
    check(make_weight((130, 256), dtype, seed=1), str(dtype))


@pytest.mark.parametrize("name", ["int4_256x384", "int4_fp16_128x256", "int4_fp32_64x128"])
def test_modelopt_goldens(name, device):
    g = load_file(os.path.join(GOLDEN, "int4", f"{name}.safetensors"))
    out = kernels.quantize(SCHEME, g["input.weight"].to(device))
    assert_same(out, {"weight": g["expected.weight"], "weight_scale": g["expected.weight_scale"]}, name)


def test_all_zero(device):
    w = torch.zeros(4, 256, dtype=torch.bfloat16, device=device)
    assert torch.all(kernels.quantize(SCHEME, w)["weight_scale"] == 1.0)
    check(w, "zeros")


def test_round_half_even(device):
    """Group amax 7 -> scale 1 -> q = w: every tie k + 0.5 and its fp32 neighbours, -0.0, tiny values."""
    halves = torch.arange(0, 7, dtype=torch.float32) + 0.5
    inf = torch.tensor(float("inf"))
    v = torch.cat([halves, torch.nextafter(halves, inf), torch.nextafter(halves, -inf), torch.tensor([0.0, 1e-30, 6.99])])
    v = signed(v)  # 48 values in row 0 after the amax; row 1 holds the same values negated
    w = torch.zeros(2, 128)
    w[:, 0] = 7.0
    w[0, 1: 1 + v.numel()] = v
    w[1, 1: 1 + v.numel()] = -v
    check(w.to(device), "ties")


@pytest.mark.parametrize("amax", [0.7, 3.3e-3, 100.0 / 3.0])
def test_division_is_exact(amax, device):
    """Quotients on and next to half-integers for a scale that is not a power of two."""
    scale = (torch.tensor(amax) / 7.0).item()
    v = signed(around(torch.arange(0, 7, dtype=torch.float32) + 0.5, scale)).clamp(-amax, amax)
    w = torch.zeros(2, 128)
    w[:, 0] = amax
    w[0, 1: 1 + v.numel()] = v
    w[1, 1: 1 + v.numel()] = -v
    check(w.to(device), f"amax {amax}")


def test_stack_equals_items(make_weight):
    w = torch.stack([make_weight((70, 256), seed=s) for s in range(3)])
    out = kernels.quantize_stack(SCHEME, w)
    for e in range(3):
        assert_same({k: v[e] for k, v in out.items()}, reference(SCHEME, w[e]), f"stack item {e}")


def test_subnormal_scales(device):
    check((weight((64, 128), torch.float32, seed=5) * 1e-40).to(device), "sub-normal scales")


def test_refuses_shapes_it_cannot_pack(device):
    with pytest.raises(ValueError, match="divisible by 2 and in-features by 128"):
        kernels.quantize(SCHEME, torch.zeros(3, 128, device=device))
