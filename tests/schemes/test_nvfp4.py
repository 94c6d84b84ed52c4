"""NVFP4 reference == golden vectors; E2M1 rounding table; shared global scale; zero tensor."""

import pytest
import torch

from quantize_cli.schemes import SCHEMES
from quantize_cli.schemes.numerics import E2M1_VALUES, e2m1_codes, e2m1_values, pack_nibbles, sqnr_db, unpack_nibbles
from tests.conftest import assert_same_bytes, golden_case

NVFP4 = SCHEMES["NVFP4"]


@pytest.mark.parametrize("case", ["nvfp4_256x384", "nvfp4_200x176", "nvfp4_e2m1_table_k8"])
def test_golden(case):
    """Zero block (scale 1.0), zero row, e4m3-subnormal block scale, clamp to 2^-9, every tie, -0.0, 6.25 -> 6."""
    g = golden_case(case)
    out = NVFP4.quantize(g["input.weight"])
    for k in ("weight", "weight_scale", "weight_scale_2"):
        assert_same_bytes(out[k], g[f"expected.{k}"], k)
    assert out["input_scale"].shape == () and out["input_scale"].item() == pytest.approx(1 / 6)


def test_golden_fused_qkv_shares_one_global_scale():
    g = golden_case("nvfp4_fused_qkv")
    ws = {m: g[f"input.{m}.weight"] for m in ("q_proj", "k_proj", "v_proj")}
    gamax = torch.stack([NVFP4.global_amax(w) for w in ws.values()]).amax()
    for m, w in ws.items():
        out = NVFP4.quantize(w, gamax)
        for k in ("weight", "weight_scale", "weight_scale_2"):
            assert_same_bytes(out[k], g[f"expected.{m}.{k}"], f"{m}.{k}")


def test_e2m1_ties_go_to_even_code_and_signs():
    q = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 6.0, 100.0, -0.0, 0.0, -1e-9, -0.75, -5.0])
    codes = e2m1_codes(q).tolist()
    assert codes == [0, 2, 2, 4, 4, 6, 6, 7, 7, 7, 0, 0, 8, 10, 14]


def test_e2m1_round_trip_of_exact_values():
    vals = torch.tensor(E2M1_VALUES)
    assert torch.equal(e2m1_values(e2m1_codes(vals)).abs(), vals.abs())


def test_nibble_order_low_first():
    codes = torch.tensor([[1, 2, 3, 4]], dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0x43]]
    assert torch.equal(unpack_nibbles(packed), codes)


@pytest.mark.parametrize("algo", ["NVFP4", "W4A16_NVFP4"])
def test_all_zero_tensor_has_no_nan_or_inf(algo):
    out = SCHEMES[algo].quantize(torch.zeros(32, 64, dtype=torch.bfloat16))
    assert torch.all(out["weight"] == 0)
    assert torch.all(out["weight_scale"].float() == 1.0)
    assert out["weight_scale_2"].item() == pytest.approx(1 / 448)  # amax 0 counts as 6: 6/2688
    for t in out.values():
        assert torch.isfinite(t.float()).all()
    assert torch.all(SCHEMES[algo].dequantize(out) == 0)


def test_w4a16_has_no_input_scale():
    assert "input_scale" not in SCHEMES["W4A16_NVFP4"].quantize(torch.randn(16, 32))
    assert "input_scale" not in SCHEMES["W4A16_NVFP4"].outputs((16, 32))


def test_shape_rule_needs_k_multiple_of_16():
    assert NVFP4.shape_problem((64, 40)) is not None
    assert NVFP4.shape_problem((63, 48)) is None


def test_row_chunks_concatenate_to_the_whole():
    w = torch.randn(96, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    whole = NVFP4.quantize(w)
    g = NVFP4.global_amax(w)
    parts = [NVFP4.quantize(w[:40], g), NVFP4.quantize(w[40:], g)]
    for k, t in whole.items():
        joined = parts[0][k] if t.dim() == 0 else torch.cat([p[k] for p in parts])
        assert_same_bytes(joined, t, k)


def test_dequantized_error_is_reasonable():
    w = torch.randn(128, 256, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    assert sqnr_db(w.float(), NVFP4.dequantize(NVFP4.quantize(w))) > 15
