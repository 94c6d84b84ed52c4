"""MXFP8 kernel equals the torch reference byte for byte: e4m3 payload and e8m0 scale bytes.

On a machine without CUDA this runs in Triton's interpreter; ``-m gpu`` runs the same checks on
the GPU (``test_*_gpu`` twins below, and the large shapes in ``test_gpu.py``)."""

from __future__ import annotations

import os

import pytest
import torch
from kernel_helpers import around, assert_same, e4m3_ties, reference, signed
from safetensors.torch import load_file

from quantize_cli import kernels
from quantize_cli.schemes import SCHEMES

MXFP8 = SCHEMES["MXFP8"]
SHAPES = [(1, 32), (100, 96), (200, 160), (130, 288), (256, 384)]
GOLDEN = os.path.join(os.path.dirname(__file__), "..", "golden", "mxfp8")
GOLDEN_CASES = ["mxfp8_256x384", "mxfp8_200x96", "mxfp8_fp16_128x128", "mxfp8_fp32_near_pow2"]


def check(w, what=""):
    assert_same(kernels.quantize(MXFP8, w), reference(MXFP8, w), f"MXFP8 {what}")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_shapes_bf16(shape, make_weight):
    check(make_weight(shape), str(shape))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_input_dtypes(dtype, make_weight):
    check(make_weight((100, 96), dtype, seed=1), str(dtype))


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_golden_modelopt(case, device):
    """The kernel reproduces ModelOpt's bytes directly (incl. fp32 amax just above 448 * 2^e and
    sub-normal d)."""
    g = load_file(os.path.join(GOLDEN, f"{case}.safetensors"))
    out = kernels.quantize(MXFP8, g["input.weight"].to(device))
    assert_same(out, {"weight": g["expected.weight"], "weight_scale": g["expected.weight_scale"]}, case)


def test_all_zero(device):
    w = torch.zeros(64, 128, dtype=torch.bfloat16, device=device)
    out = kernels.quantize(MXFP8, w)
    assert torch.all(out["weight_scale"] == 0) and torch.all(out["weight"].view(torch.uint8) == 0)
    check(w, "zeros")


def test_e4m3_ties_and_scale_edges(device):
    """Blocks whose max is 448 * 2^e exactly (scale 2^e) holding every e4m3 tie and its fp32
    neighbours scaled by 2^e, for e across the exponent range; then fp32 maxima a few ulps above."""
    ties = signed(e4m3_ties())
    rows = []
    for e in (-120, -20, -7, 0, 5, 60):
        vals = around(ties, 2.0**e, ulps=1)
        pad = (-vals.numel()) % 31
        vals = torch.cat([vals, torch.zeros(pad)]).reshape(-1, 31)
        rows.append(torch.cat([torch.full((vals.shape[0], 1), 448 * 2.0**e), vals], dim=1))
    w = torch.cat(rows).reshape(-1, 64)
    check(w.to(device), "ties")
    bits = torch.tensor([((e + 127) << 23) + m for e in range(-126, 120, 7) for m in range(48)], dtype=torch.int32)
    amax = (bits.view(torch.float32).double() * 448).float()
    w = torch.rand(amax.numel(), 32, generator=torch.Generator().manual_seed(3)) * amax[:, None]
    w[:, 0] = amax
    check(w.to(device), "near powers of two")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=str)
def test_non_finite_block_gets_the_out_of_range_scale_byte(value, device):
    """The executor refuses a block whose scale byte no finite amax gives (> 247): NaN and Inf must
    reach it on every device (the GPU's max would drop a NaN)."""
    from quantize_cli.schemes.mxfp8 import E8M0_MAX_FINITE_BYTE

    w = torch.randn(4, 64)
    w[2, 40] = value
    s = kernels.quantize(MXFP8, w.to(device))["weight_scale"].cpu()
    ref = MXFP8.quantize(w)["weight_scale"]
    assert s[2, 1] > E8M0_MAX_FINITE_BYTE and ref[2, 1] > E8M0_MAX_FINITE_BYTE
    mask = torch.ones_like(s, dtype=torch.bool)
    mask[2, 1] = False
    assert torch.equal(s[mask], ref[mask]) and bool((s[mask] <= E8M0_MAX_FINITE_BYTE).all())


def test_stack_equals_each_item(device, make_weight):
    w = torch.stack([make_weight((64, 96), seed=e) * (e + 1) for e in range(3)])
    out = kernels.quantize_stack(MXFP8, w)
    for e in range(3):
        assert_same({k: v[e] for k, v in out.items()}, reference(MXFP8, w[e]), f"expert {e}")


def test_k_not_multiple_of_32_is_refused(device):
    with pytest.raises(ValueError, match="divisible by 32"):
        kernels.quantize(MXFP8, torch.ones(4, 48, device=device))


@pytest.mark.parametrize("case", GOLDEN_CASES)
@pytest.mark.parametrize("soft", [False, True], ids=["hw_e4m3", "soft_e4m3"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_golden_modelopt_gpu(case, soft):
    """GPU twin of test_golden_modelopt for both e4m3 paths (hardware cvt and the software one)."""
    from quantize_cli.kernels import mxfp8_quant

    g = load_file(os.path.join(GOLDEN, f"{case}.safetensors"))
    q, s = mxfp8_quant.quantize(g["input.weight"].cuda().unsqueeze(0), soft)
    assert_same({"weight": q[0], "weight_scale": s[0]}, {"weight": g["expected.weight"], "weight_scale": g["expected.weight_scale"]}, case)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_edges_gpu():
    """GPU twin of the tie / near-power-of-two / all-zero / NaN-Inf checks."""
    test_e4m3_ties_and_scale_edges(torch.device("cuda"))
    test_all_zero(torch.device("cuda"))
    for value in (float("nan"), float("inf"), float("-inf")):
        test_non_finite_block_gets_the_out_of_range_scale_byte(value, torch.device("cuda"))
