"""INT8 per-row reference == golden vectors (round half even, zero row -> 1.0)."""

import pytest
import torch

from quantize_cli.schemes import SCHEMES, get_scheme
from tests.conftest import assert_same_bytes, golden_case

INT8 = SCHEMES["INT8"]


@pytest.mark.parametrize("shape", ["256x384", "200x96"])
def test_golden(shape):
    g = golden_case(f"int8_per_channel_{shape}")
    out = INT8.quantize(g["input.weight"])
    assert_same_bytes(out["weight"], g["expected.weight"], "weight")
    assert_same_bytes(out["weight_scale"], g["expected.weight_scale"], "weight_scale")


def test_ties_round_to_even_and_clamp():
    w = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -127.0]])
    q = INT8.quantize(w)["weight"]
    assert q.tolist() == [[127, 0, 2, 2, 0, -2, -127]]


def test_zero_row_scale_one():
    out = INT8.quantize(torch.zeros(3, 8))
    assert torch.all(out["weight_scale"] == 1.0) and torch.all(out["weight"] == 0)


def test_written_as_w8a16_and_names_are_case_insensitive():
    assert INT8.quant_algo == "W8A16"
    assert get_scheme("int8") is INT8 and get_scheme("w8a16") is INT8 and get_scheme("fp8_pb_wo").algo == "FP8_PB_WO"
