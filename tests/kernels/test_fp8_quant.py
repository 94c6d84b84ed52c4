"""FP8 kernels (per-tensor, per-row, 128x128 block) equal the torch references byte for byte."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import around, assert_same, e4m3_ties, pad_rows, reference, signed, weight

from quantize_cli import kernels
from quantize_cli.kernels import fp8_quant
from quantize_cli.schemes import SCHEMES

FP8_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO")
SHAPES = [(1, 16), (100, 96), (200, 176), (130, 272), (256, 384)]


def check(algo, w, global_amax=None, what=""):
    scheme = SCHEMES[algo]
    out = kernels.quantize(scheme, w, global_amax)
    assert_same(out, reference(scheme, w, global_amax), f"{algo} {what}")


@pytest.mark.parametrize("algo", FP8_ALGOS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_shapes_bf16(algo, shape, make_weight):
    check(algo, make_weight(shape), what=str(shape))


@pytest.mark.parametrize("algo", FP8_ALGOS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(100, 96), (130, 272)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_input_dtypes(algo, dtype, shape, make_weight):
    check(algo, make_weight(shape, dtype, seed=1), what=f"{shape} {dtype}")


@pytest.mark.parametrize("algo", FP8_ALGOS)
def test_all_zero(algo, device):
    w = torch.zeros(130, 272, dtype=torch.bfloat16, device=device)
    out = kernels.quantize(SCHEMES[algo], w)
    assert torch.all(out["weight_scale"] == 1.0)
    check(algo, w, what="zeros")


def test_e4m3_ties_per_tensor(device):
    """scale = 1 (amax 448): every e4m3 value, midpoint and neighbour, both signs, and values above
    448 (clamped before the cast: torch would give NaN above 464)."""
    over = torch.tensor([448.5, 463.9, 464.0, 465.0, 1000.0, 3.0e38])
    v = signed(torch.cat([e4m3_ties(), over])).to(device)
    check("FP8", v.reshape(-1, 2), torch.tensor(448.0), "ties")


@pytest.mark.parametrize("algo", ["FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"])
def test_e4m3_ties_row_and_block(algo, device):
    """Every row holds 448, so every row / block scale is exactly 1 and q = w."""
    w = pad_rows(signed(e4m3_ties()), 128, 448.0).to(device)
    check(algo, w, what="ties")


@pytest.mark.parametrize("scale", [0.7, 3.3e-3, 1.0 / 3.0])
def test_division_is_exact(scale, device):
    """Quotients on and next to e4m3 ties for scales that are not powers of two: an approximate
    division (Triton's fp32 ``/`` on the GPU) lands on the other side of some ties."""
    amax = torch.tensor(448.0 * scale).float()
    v = signed(around(e4m3_ties(), amax.item() / 448.0)).clamp(-amax.item(), amax.item())
    w = pad_rows(v, 256, amax.item()).to(device)
    for algo in FP8_ALGOS:
        check(algo, w, amax if algo == "FP8" else None, f"scale {scale}")


def test_fused_group_global_amax(make_weight):
    """FP8 with a precomputed fused-group amax: members share the scale of the largest."""
    members = [make_weight((64, 96), seed=s) * f for s, f in ((1, 1.0), (2, 0.25), (3, 4.0))]
    gamax = torch.stack([kernels.global_amax(m) for m in members]).amax()
    assert gamax.item() == max(SCHEMES["FP8"].global_amax(m).item() for m in members)
    for i, m in enumerate(members):
        check("FP8", m, gamax, f"member {i}")


def test_long_rows_two_pass(make_weight, monkeypatch):
    """Rows longer than one tile take the two-pass path (amax loop, then quantize loop)."""
    monkeypatch.setattr(fp8_quant, "MAX_ONE_TILE_K", 64)
    monkeypatch.setattr(fp8_quant, "ROW_LOOP_K", 64)
    check("FP8_PER_CHANNEL_PER_TOKEN", make_weight((37, 272), seed=4), what="two-pass")


def test_stack_equals_items(make_weight, device):
    """quantize_stack == the per-item references stacked (own amax, 0-d and [E] global amax)."""
    w = torch.stack([make_weight((130, 96), seed=s) * 2.0**s for s in range(3)])
    for algo in FP8_ALGOS:
        scheme = SCHEMES[algo]
        for gamax in (None, torch.tensor(3.0), torch.tensor([1.0, 2.0, 50.0])):
            out = kernels.quantize_stack(scheme, w, gamax)
            for e in range(3):
                g = None if gamax is None else (gamax if gamax.dim() == 0 else gamax[e])
                item = {k: v if k == "input_scale" else v[e] for k, v in out.items()}
                assert_same(item, reference(scheme, w[e], g), f"{algo} stack item {e}")


@pytest.mark.parametrize("algo", FP8_ALGOS)
def test_subnormal_scales(algo, device):
    """fp32 weights around 1e-39: amax / 448 is an fp32 sub-normal, which a flush-to-zero division
    or cast would turn into 0 (then inf / NaN); the reference keeps it."""
    w = weight((130, 256), torch.float32, seed=5) * 1e-40
    check(algo, w.to(device), what="sub-normal scales")
