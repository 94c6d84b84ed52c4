"""INT4 W4A16 reference (ModelOpt W4A16_AWQ) == ModelOpt 0.47's exporter, and the grid GPTQ reuses."""

import os

import pytest
import torch
from safetensors.torch import load_file

from quantize_cli.schemes.int4 import (INT4_GROUP, Int4Group, dequantize_codes, expand_groups, group_scales,
                                       pack_row_pairs, round_codes, unpack_row_pairs)
from tests.conftest import GOLDEN, assert_same_bytes

INT4 = Int4Group("INT4", "W4A16_AWQ", group_size=INT4_GROUP, row_align=2)
CASES = ["int4_256x384", "int4_fp16_128x256", "int4_fp32_64x128", "int4_200x256"]


def case(name):
    return load_file(os.path.join(GOLDEN, "int4", f"{name}.safetensors"))


@pytest.mark.parametrize("name", CASES)
def test_equal_to_modelopt_export(name):
    g = case(name)
    out = INT4.quantize(g["input.weight"])
    assert set(out) == {"weight", "weight_scale"}
    assert_same_bytes(out["weight"], g["expected.weight"], "weight")
    assert_same_bytes(out["weight_scale"], g["expected.weight_scale"], "weight_scale")
    assert out["weight"].shape == INT4.outputs(tuple(g["input.weight"].shape))["weight"][1]


def test_golden_holds_the_documented_cases():
    """Guards a silent regeneration: ties, an all-zero group and row are in the bf16 case."""
    w = case("int4_256x384")["input.weight"]
    assert (w[0, :128] == 0).all() and (w[1] == 0).all() and torch.signbit(w[3, :128]).all()
    scale = group_scales(w)
    assert scale[0, 0] == 1.0 and (scale[1] == 1.0).all()
    x = w[2].float() / expand_groups(scale[2:3])[0]
    assert ((x - x.floor()) == 0.5).sum() >= 14 * 3  # every code's tie in every group


def test_ties_round_half_to_even_and_the_range():
    w = torch.zeros(2, 128)
    w[0, :9] = torch.tensor([7.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 6.5, -7.0])
    q = unpack_row_pairs(INT4.quantize(w)["weight"])
    assert q[0, :9].tolist() == [7, 0, 2, 2, 0, -2, -2, 6, -7]  # scale 7 / 7 = 1: ties to even, never -8
    assert (q[1] == 0).all()


def test_row_pairs_pack_low_nibble_first_and_invert():
    q = torch.tensor([[-8, 7, 0], [1, -1, 5]], dtype=torch.int8)
    p = pack_row_pairs(q)
    assert p.dtype == torch.uint8 and p.tolist() == [[0x18, 0xF7, 0x50]]
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(-8, 8, (6, 10), generator=g, dtype=torch.int8)
    assert torch.equal(unpack_row_pairs(pack_row_pairs(codes)), codes)


def test_dequantize_is_codes_times_scales():
    w = (torch.randn(4, 256, generator=torch.Generator().manual_seed(1)) * 0.1).to(torch.bfloat16)
    out = INT4.quantize(w)
    deq = INT4.dequantize(out)
    scale = expand_groups(out["weight_scale"])
    assert torch.equal(deq, unpack_row_pairs(out["weight"]).float() * scale)
    assert ((deq - w.float()).abs() <= scale / 2 * (1 + 1e-6)).all()  # round to nearest on the grid (ties: exactly half)


def test_grid_column_by_column_equals_whole_rows():
    """GPTQ rounds one column (or block) at a time with the group scales fixed: same codes."""
    w = torch.randn(8, 256, generator=torch.Generator().manual_seed(2))
    scale = group_scales(w)
    whole = round_codes(w, expand_groups(scale))
    cols = torch.cat([round_codes(w[:, j:j + 1], scale[:, j // 128:j // 128 + 1]) for j in range(256)], dim=1)
    assert torch.equal(whole, cols)
    assert torch.equal(dequantize_codes(whole, expand_groups(scale)), unpack_row_pairs(INT4.quantize(w)["weight"]).float() * expand_groups(scale))
    zp = torch.full((8, 1), 3.0)  # an asymmetric grid shifts the codes before the clamp
    assert round_codes(torch.full((8, 1), 6.0), torch.ones(8, 1), zp).tolist() == [[7]] * 8


def test_shape_rules():
    assert INT4.shape_problem((256, 384)) is None
    assert "divisible by 128" in INT4.shape_problem((256, 96))
    assert "divisible by 2" in INT4.shape_problem((255, 128))
    assert INT4.logical_shape((128, 256)) == (256, 256)
