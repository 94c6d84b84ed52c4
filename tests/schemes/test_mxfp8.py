"""MXFP8 reference == ModelOpt 0.47 golden vectors; the e8m0 exponent rule against torch.log2."""

import math
import os

import pytest
import torch
from safetensors.torch import load_file

from quantize_cli.schemes import SCHEMES, get_scheme
from quantize_cli.schemes.mxfp8 import E8M0_BIAS, e8m0_exponent, e8m0_to_float, round_down_table
from quantize_cli.schemes.numerics import sqnr_db
from tests.conftest import GOLDEN, assert_same_bytes

MXFP8 = SCHEMES["MXFP8"]
MX_GOLDEN = os.path.join(GOLDEN, "mxfp8")


def mx_case(name: str) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(MX_GOLDEN, f"{name}.safetensors"))


@pytest.mark.parametrize("case", ["mxfp8_256x384", "mxfp8_200x96", "mxfp8_192x160", "mxfp8_fp16_128x128", "mxfp8_fp32_near_pow2"])
def test_golden(case):
    """Zero block and row (byte 0), power-of-two maxima, e4m3 ties and sub-normals, tiny blocks,
    fp16 and fp32 sources, fp32 amax a few ulps above 448 * 2^e (the log2 rounding)."""
    g = mx_case(case)
    out = MXFP8.quantize(g["input.weight"])
    assert set(out) == {"weight", "weight_scale"}  # dynamic activations: no input_scale
    for k in ("weight", "weight_scale"):
        assert_same_bytes(out[k], g[f"expected.{k}"], k)


def test_outputs_and_config_names():
    assert get_scheme("mxfp8") is MXFP8
    assert MXFP8.quant_algo == "MXFP8" and MXFP8.group_size == 32
    assert MXFP8.outputs((64, 96)) == {"weight": ("F8_E4M3", (64, 96)), "weight_scale": ("U8", (64, 3))}
    assert MXFP8.shape_problem((64, 96)) is None
    assert "divisible by 32" in MXFP8.shape_problem((64, 48))


def _torch_rule(d: torch.Tensor) -> torch.Tensor:
    """ModelOpt's own expression (MXFP8QTensor._compute_e8m0_exponent), as run on the CPU."""
    log2 = torch.where(d > 0, torch.log2(d), torch.tensor(-127.0))
    return torch.clamp(torch.ceil(log2), -127, 127).to(torch.int32)


def test_e8m0_exponent_equals_torch_log2_near_every_power_of_two():
    """Every exponent, mantissa offsets 0..200 above the power of two (where fl32(log2) rounds
    down) and just below it; sub-normals included."""
    bits = []
    for e in range(-126, 128):
        base = (e + 127) << 23
        bits += [base + m for m in range(0, 200)] + [base - m for m in range(1, 4)]
    d = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    d = torch.cat([d, torch.arange(0, 1 << 23, 4099, dtype=torch.int32).view(torch.float32),
                   torch.tensor([(1 << 22) + m for m in range(40)], dtype=torch.int32).view(torch.float32)])
    d = d[torch.isfinite(d)]
    assert torch.equal(e8m0_exponent(d), _torch_rule(d))


def test_e8m0_exponent_equals_torch_log2_on_random_values():
    g = torch.Generator().manual_seed(0)
    d = torch.exp2(torch.rand(200_000, generator=g) * 250 - 140)
    d[:1000] = 0.0
    assert torch.equal(e8m0_exponent(d), _torch_rule(d))


def test_round_down_table_grows_with_the_exponent():
    t = round_down_table()
    assert t[0 + 150] == 0 and t[3 + 150] == 0 and t[-4 + 150] == 0  # |e| < 4: any offset rounds up
    assert t[-15 + 150] == 2 and t[100 + 150] == 22
    assert max(t) == 44  # a few ulps at most (|e| >= 128: sub-normal d)


def test_all_zero_and_dequantize():
    out = MXFP8.quantize(torch.zeros(4, 64, dtype=torch.bfloat16))
    assert torch.all(out["weight_scale"] == 0) and torch.all(out["weight"].view(torch.uint8) == 0)
    assert torch.all(MXFP8.dequantize(out) == 0)
    w = torch.randn(128, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    assert sqnr_db(w.float(), MXFP8.dequantize(MXFP8.quantize(w))) > 28  # e4m3: ~31 dB on Gaussian data


def test_scale_bytes_are_powers_of_two_and_never_overflow():
    g = torch.Generator().manual_seed(2)
    w = (torch.randn(64, 128, generator=g) * torch.exp2(torch.randint(-30, 30, (64, 1), generator=g).float()))
    out = MXFP8.quantize(w)
    q = out["weight"].float().reshape(64, 4, 32)
    assert q.abs().amax() <= 448
    # every block uses its scale well: its max lands in [224, 448] after e4m3 rounding
    assert torch.all(q.abs().amax(-1) >= 224)
    assert torch.equal(e8m0_to_float(torch.tensor([0, 127, 254], dtype=torch.uint8)),
                       torch.tensor([2.0**-127, 1.0, 2.0**127]))
    assert E8M0_BIAS == 127 and math.isclose(float(e8m0_to_float(torch.tensor([130], dtype=torch.uint8))), 8.0)
