"""--layout marlin for INT4: equal to vLLM 0.33's MarlinLinearKernel preparation (uint4b8, group 128),
golden cases made by tests/golden/int4/generate.py; unpack exact; the layout's refusals."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from quantize_cli import layouts as L
from quantize_cli.layouts import marlin as M
from quantize_cli.schemes import SCHEMES
from tests.conftest import GOLDEN, assert_same_bytes

CASES = {"marlin_int4_256x384": torch.bfloat16, "marlin_int4_fp16_256x384": torch.float16,
         "marlin_int4_200x256": torch.bfloat16}


@pytest.mark.parametrize("name", list(CASES))
def test_equal_to_vllm_marlin_prep(name):
    g = load_file(os.path.join(GOLDEN, "int4", f"{name}.safetensors"))
    act = CASES[name]
    plain = {"weight": g["input.weight"], "weight_scale": g["input.weight_scale"]}
    packed = L.pack("marlin", "INT4", plain, act)
    assert_same_bytes(packed["weight_marlin"], g["expected.marlin_qweight"], "weight_marlin")
    assert_same_bytes(packed["weight_scale_marlin"], g["expected.marlin_scales"], "weight_scale_marlin")
    assert packed["weight_scale"] is plain["weight_scale"]  # the fp32 scales kept beside: unpack is exact
    back = L.unpack("marlin", "INT4", packed, act)
    assert_same_bytes(back["weight"], plain["weight"], "weight")
    n, k = 2 * plain["weight"].shape[0], plain["weight"].shape[1]
    assert packed["weight_shape_marlin"].tolist() == [n, k]


def test_padded_case_pads_with_zero_scales():
    g = load_file(os.path.join(GOLDEN, "int4", "marlin_int4_200x256.safetensors"))
    packed = L.pack("marlin", "INT4", {"weight": g["input.weight"], "weight_scale": g["input.weight_scale"]}, torch.bfloat16)
    assert tuple(packed["weight_scale_marlin"].shape) == (2, 256)  # [Kp/128, Np]: N 200 -> 256
    wk = L.dequantize("marlin", "INT4", packed, torch.bfloat16)
    assert wk.shape == (256, 256) and wk[200:].count_nonzero() == 0
    plain = SCHEMES["INT4"].dequantize({"weight": g["input.weight"], "weight_scale": g["input.weight_scale"].to(torch.bfloat16).float()})
    assert torch.equal(wk[:200], plain)


def test_codes_are_uint4b8():
    q = torch.tensor([[-8, 7], [0, -1]], dtype=torch.int8)  # [N=2, K=2] codes
    from quantize_cli.schemes.int4 import pack_row_pairs

    assert M.weight_codes("INT4", pack_row_pairs(q)).tolist() == [[0, 15], [8, 7]]
    assert torch.equal(M.codes_to_weight("INT4", M.weight_codes("INT4", pack_row_pairs(q))), pack_row_pairs(q))


@pytest.mark.parametrize("layout,algo,moe", [("cutlass", "INT4", False), ("flashinfer", "INT4", False),
                                             ("marlin", "INT4", True), ("marlin", "INT4_ASYM", False)])
def test_refusals_say_why(layout, algo, moe):
    reason = L.supported(layout, algo, moe)
    assert reason and "Marlin" in reason and "--layout" in reason
    assert L.supported("marlin", "INT4") is None and L.supported("plain", "INT4_ASYM") is None
