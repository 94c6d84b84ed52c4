"""NVFP4 kernel equals the torch reference byte for byte: payload nibbles, e4m3 group scales,
fp32 global scale, constant input_scale."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import E2M1_POINTS, E2M1_TIES, around, assert_same, e4m3_ties, reference, signed, weight

from quantize_cli import kernels
from quantize_cli.schemes import SCHEMES
from quantize_cli.schemes.nvfp4 import block_scales, global_scale

SHAPES = [(1, 16), (100, 96), (200, 176), (130, 272), (256, 384)]
UNIT = torch.tensor(2688.0)  # global amax 6 * 448 -> weight_scale_2 == 1 exactly


def check(w, global_amax=None, algo="NVFP4", what=""):
    scheme = SCHEMES[algo]
    assert_same(kernels.quantize(scheme, w, global_amax), reference(scheme, w, global_amax), f"{algo} {what}")


def groups(rows: list[list[float]]) -> torch.Tensor:
    """16-element groups (short ones zero-padded) laid out as one row of ``16 * len(rows)``."""
    out = torch.zeros(len(rows), 16)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
    return out.reshape(1, -1)


@pytest.mark.parametrize("algo", ["NVFP4", "W4A16_NVFP4"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_shapes_bf16(algo, shape, make_weight):
    check(make_weight(shape), algo=algo, what=str(shape))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(100, 96), (130, 272)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_input_dtypes(dtype, shape, make_weight):
    check(make_weight(shape, dtype, seed=1), what=f"{shape} {dtype}")


def test_all_zero(device):
    """Global amax 0 counts as 6: weight_scale_2 = 1/448, every block scale 1.0, payload all zero."""
    w = torch.zeros(100, 96, dtype=torch.bfloat16, device=device)
    out = kernels.quantize(SCHEMES["NVFP4"], w)
    assert out["weight_scale_2"].item() == torch.tensor(6.0 / 2688.0, dtype=torch.float32).item()
    assert torch.all(out["weight"] == 0) and torch.all(out["weight_scale"].float() == 1.0)
    check(w, what="zeros")
    check(w, torch.tensor(0.0), what="zeros, given amax 0")


def test_e2m1_ties(device):
    """weight_scale_2 = 1 and group amax 6 -> block scale 1 -> q = w: every E2M1 tie, its fp32
    neighbours, representable points, both signs (-0.0 -> 0x0, tiny negative -> 0x8)."""
    ties = torch.tensor(E2M1_TIES)
    inf = torch.tensor(float("inf"))
    values = torch.cat([ties, torch.nextafter(ties, inf), torch.nextafter(ties, -inf), torch.tensor(E2M1_POINTS)])
    values = torch.cat([signed(values), torch.tensor([-1e-30, -0.2, 1e-30])])
    rows = [[6.0] + values[i : i + 15].tolist() for i in range(0, values.numel(), 15)]
    check(groups(rows).to(device), UNIT, what="E2M1 ties")


def test_e2m1_saturation(device):
    """Group amax 6.37: its scale rounds down to 1.0 in e4m3, so q reaches 6.37 and saturates to 6."""
    check(groups([[6.37, 6.1, 6.0, 5.9, 5.01, -6.37, -6.2]]).to(device), UNIT, what="saturation")


def test_block_scale_ties(device):
    """Group amax 6 * t for t on and around every e4m3 tie: block scale = t exactly, so the e4m3
    rounding of block scales (normal, sub-normal, below the 2^-9 clamp, zero -> 1.0) is exercised."""
    t = e4m3_ties()
    rows = [[6.0 * x, 3.0 * x, -x] for x in t.tolist()]
    check(groups(rows).to(device), UNIT, what="block-scale ties")


def test_scale_clamped_above(device):
    """A given global amax below the block amax pushes block scales past 448: clamped, q saturates."""
    w = groups([[3000.0, 1.0], [-200.0, 0.5], [5.0]]).to(device)
    check(w, torch.tensor(1.0), what="clamp 448")


@pytest.mark.parametrize("gamax", [1000.0, 0.0123])
def test_division_is_exact(gamax, device):
    """Quotients on and next to E2M1 ties with a weight_scale_2 that is not a power of two: an
    approximate division lands on the other side of some ties."""
    g = torch.tensor(gamax)
    wsf2 = global_scale(g)
    amaxes = torch.linspace(0.5, 1.5, 12) * gamax
    bs8 = block_scales(amaxes.reshape(-1, 1).expand(-1, 16).contiguous(), wsf2)[:, 0]
    rows = []
    for a, b in zip(amaxes.tolist(), bs8.float().tolist()):
        denom = (torch.tensor(b) * wsf2).item()  # fp32 product, as the reference forms it
        v = signed(around(torch.tensor(E2M1_TIES), denom)).clamp(-a, a)
        rows += [[a] + v[i : i + 15].tolist() for i in range(0, v.numel(), 15)]
    check(groups(rows).reshape(-1, 64).to(device), g, what=f"gamax {gamax}")


def test_fused_group_global_amax(make_weight):
    """q/k/v members quantized against the group's amax share weight_scale_2 and match the reference."""
    members = [make_weight((64, 96), seed=s) * f for s, f in ((1, 1.0), (2, 0.25), (3, 4.0))]
    gamax = torch.stack([kernels.global_amax(m) for m in members]).amax()
    for algo in ("NVFP4", "W4A16_NVFP4"):
        outs = [kernels.quantize(SCHEMES[algo], m, gamax) for m in members]
        assert len({o["weight_scale_2"].item() for o in outs}) == 1
        for i, m in enumerate(members):
            check(m, gamax, algo, f"member {i}")


def test_stack_equals_items(make_weight):
    w = torch.stack([make_weight((48, 160), seed=s) * 4.0**s for s in range(3)])
    scheme = SCHEMES["NVFP4"]
    for gamax in (None, torch.tensor([1.0, 2.0, 300.0])):
        out = kernels.quantize_stack(scheme, w, gamax)
        for e in range(3):
            item = {k: v if k == "input_scale" else v[e] for k, v in out.items()}
            assert_same(item, reference(scheme, w[e], None if gamax is None else gamax[e]), f"stack item {e}")


def test_k_not_multiple_of_16(device):
    with pytest.raises(ValueError, match="divisible by 16"):
        kernels.quantize("NVFP4", torch.ones(4, 24, device=device))


def test_subnormal_global_scale(device):
    """Global amax ~1e-39: weight_scale_2 = gamax / 2688 is an fp32 sub-normal; no flush to zero."""
    check((weight((64, 96), torch.float32, seed=5) * 1e-40).to(device), what="sub-normal wsf2")
