"""The serve-time activation rules (eval/activations.py) on hand-computed cases."""

from __future__ import annotations

import torch

from quantize_cli.eval import activations as A


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_fp8_static_tensor_multiplies_by_the_reciprocal_and_saturates():
    # x * (1 / 0.5): 2, -0.6, 600, 2000 -> e4m3 2, -0.625 (0.6 is past the 0.59375 midpoint), 448, 448
    out = A.fp8_tensor(t([[1.0, -0.3, 300.0, 1000.0]]), 0.5)
    assert out.tolist() == [[1.0, -0.3125, 224.0, 224.0]]


def test_fp8_token_scales_each_row_and_an_all_zero_row_stays_finite():
    x = t([[448.0, 1.0, 0.5, -2.0], [0.0, 0.0, 0.0, 0.0], [3.0, 1.0, 0.0, 0.0]])
    out = A.fp8_token(x)
    assert out[0].tolist() == [448.0, 1.0, 0.5, -2.0]  # amax 448: scale 1, values exact
    assert out[1].tolist() == [0.0] * 4  # scale floored at 1 / (448 * 512): no 0 / 0
    s = t(3.0) / 448
    assert out[2, 0] == 3.0 and out[2, 1] == 144 * s  # 1 / s = 149.33 -> e4m3 144 (steps of 16 in [128, 256))
    assert out[2, 1] != 1.0


def test_fp8_group_has_one_scale_per_128_columns():
    x = torch.ones(2, 256)
    x[0, 5] = 100.0  # group 0 of row 0: scale 100 / 448, 1.0 -> 4.48 -> e4m3 4.5
    x[0, 128:] = 0.001
    x[1, 128:] = 0.0  # an all-zero group: eps scale, stays zero
    out = A.fp8_group(x)
    s = t(100.0) / 448
    assert out[0, 5] == 100.0 and out[0, 0] == 4.5 * s
    assert torch.equal(out[0, 128:], torch.full((128,), 0.001))  # its own scale: 0.001 maps to 448 exactly
    assert torch.equal(out[1, :128], torch.ones(128)) and torch.equal(out[1, 128:], torch.zeros(128))


def test_nvfp4_rounds_like_vllm_cast_to_fp4_under_the_global_scale():
    # global scale 1 and block max 6: block scale e4m3(1 * 6/6) = 1, so q = E2M1(x) with vLLM's interval ends
    x = t([[0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -6.0, 0.3, -0.76, 2.6, 4.9, 5.1, -0.25]])
    out = A.nvfp4(x, 1.0)
    assert out.tolist() == [[0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -6.0, 0.5, -1.0, 3.0, 4.0, 6.0, 0.0]]
    # global 448: block max 3 -> scale e4m3(448 * 3/6) = 224 -> x * 1/(224/448) = 2x, dequantized by 224/448
    y = t([[3.0, 1.0, 0.3] + [0.0] * 13])
    assert A.nvfp4(y, 448.0)[0, :3].tolist() == [3.0, 1.0, 0.25]  # 2 * 0.3 = 0.6 -> 0.5 -> 0.25


def test_mxfp8_picks_the_power_of_two_that_fits_the_group():
    x = torch.zeros(3, 32)
    x[0, 0], x[0, 1] = 448.0, 3.3  # amax 448: exponent 0, values as e4m3
    x[1, 0], x[1, 1] = 449.0, 3.3  # amax 449: 2^1, so 449 / 2 -> 224 and 3.3 / 2 -> 1.625
    out = A.mxfp8(x)  # row 2: all zero -> byte 0 (2^-127) and zeros, no NaN
    assert out[0, :2].tolist() == [448.0, 3.25]
    assert out[1, :2].tolist() == [448.0, 3.25]
    assert torch.equal(out[2], torch.zeros(32))


def test_int8_token_rounds_half_to_even_and_keeps_zero_rows():
    x = t([[127.0, 63.5, -0.5, 1.5, 0.0], [0.0] * 5])
    assert A.int8_token(x).tolist() == [[127.0, 64.0, 0.0, 2.0, 0.0], [0.0] * 5]


def test_kv_fp8_divides_by_the_scale_and_saturates():
    k = t([[1000.0, 0.3]]).to(torch.bfloat16)
    out = A.kv_fp8(k, 2.0)
    assert out.dtype == torch.bfloat16  # the cache's values go back into the attention's dtype
    assert out.float().tolist() == [[896.0, 0.3125]]  # 500 -> 448; 0.15 -> 0.15625


def test_quantize_activation_keeps_the_shape_and_none_is_identity():
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert torch.equal(A.quantize_activation(A.NONE, x), x.float())
    for rule in (A.ActRule("mxfp8"), A.ActRule("fp8_token"), A.ActRule("nvfp4", 100.0), A.ActRule("fp8_tensor", 0.01)):
        out = A.quantize_activation(rule, x)
        assert out.shape == x.shape and out.dtype == torch.float32
        flat = A._RULES[rule.kind](x.reshape(-1, 64).float(), rule.scale)
        assert torch.equal(out.reshape(-1, 64), flat)  # rows are tokens, whatever the leading dims
        assert not torch.equal(out, x.float())
