"""--algo MXFP8 --format compressed-tensors: compressed-tensors' exponent rule, byte for byte.

The golden tiny Llama and ``edge`` outputs are compared in test_ct_golden.py; here the exponent
edge cases (``mx-edge``, made by make_golden.py with llm-compressor 0.14's model_free_ptq), the
one deliberate difference (an fp16 group whose power of two overflows fp16 in compressed-tensors)
and the relation to ModelOpt's MXFP8 rule.
"""

from __future__ import annotations

import os

import torch

from tests.conftest import convert
from quantize_cli.formats import CT_SCHEMES
from quantize_cli.formats.ct_mxfp8 import ct_mx_scales
from quantize_cli.schemes import get_scheme
from tests.conftest import GOLDEN, assert_same_bytes, load_all

CT = os.path.join(GOLDEN, "compressed_tensors")
FP16 = "model.layers.0.mlp.mx1_proj"
OVERFLOW_GROUP = 4  # row 0, amax 60000 (fp16): compressed-tensors' power of two rounds to 65536 = inf in fp16


def test_exponent_edge_cases_equal_llm_compressor(tmp_path):
    convert(os.path.join(CT, "mx-edge"), str(tmp_path / "o"), algo="MXFP8", format="compressed-tensors", device="cpu", quiet=True)
    ours, theirs = load_all(tmp_path / "o"), load_all(os.path.join(CT, "mx-edge-MXFP8"))
    assert sorted(n for n in ours if n.endswith("weight_scale")) == sorted(n for n in theirs if n.endswith("weight_scale"))
    for name, t in theirs.items():
        if name.startswith(FP16):
            continue
        assert_same_bytes(ours[name], t, name)
    # bf16 row 0: zero, amax exactly 1.75 * 2^-5 (rounds up: 115), just below (114), two sub-normal amaxes (0), ...
    assert theirs["model.layers.0.mlp.mx0_proj.weight_scale"][0].tolist() == [0, 115, 114, 0, 0, 218, 130, 114, 114]
    # fp16: everything equal except the overflowing group
    o_s, t_s = ours[f"{FP16}.weight_scale"], theirs[f"{FP16}.weight_scale"]
    differs = (o_s != t_s).nonzero().tolist()
    assert differs == [[0, OVERFLOW_GROUP]]
    cols = slice(32 * OVERFLOW_GROUP, 32 * (OVERFLOW_GROUP + 1))
    o_w, t_w = ours[f"{FP16}.weight"].view(torch.uint8), theirs[f"{FP16}.weight"].view(torch.uint8)
    same = torch.ones_like(o_w, dtype=torch.bool)
    same[0, cols] = False
    assert torch.equal(o_w[same], t_w[same])
    # compressed-tensors: byte 127 (scale 1.0) over an all-zero group; ours: 2^16 -> byte 127 + 16 - 8
    assert t_s[0, OVERFLOW_GROUP].item() == 127 and ((t_w[0, cols] & 0x7F) == 0).all()  # +-0 codes
    assert o_s[0, OVERFLOW_GROUP].item() == 135
    src = load_all(os.path.join(CT, "mx-edge"))[f"{FP16}.weight"][0, cols].float()
    back = ours[f"{FP16}.weight"][0, cols].float() * 2.0**8
    assert (back - src).abs().max() <= src.abs().max() / 8  # e4m3 keeps 3 mantissa bits


def test_fp16_underflow_and_zero_groups_are_scale_one():
    """compressed-tensors' eps for a uint8 scale is 1: an fp16 scale below 2^-24 (and a zero group's
    2^-127) becomes 1.0, stored as 127; in bf16 / fp32 a zero group keeps byte 0 (2^-127 is representable)."""
    amax = torch.tensor([[0.0, 1e-6, 3e-5, 1.0]], dtype=torch.float16)
    stored, scale = ct_mx_scales(amax)
    assert stored.tolist() == [[127, 127, 127, 119]] and scale.tolist() == [[1.0, 1.0, 1.0, 2.0**-8]]
    for dt in (torch.bfloat16, torch.float32):
        stored, _ = ct_mx_scales(torch.tensor([[0.0, 1.0]], dtype=dt))
        assert stored.tolist() == [[0, 119]]


def test_equals_modelopt_mxfp8_except_at_one_and_three_quarters():
    """Both rules give 2^(e-8) for an amax in [2^e, 1.75 * 2^e) and 2^(e-7) above; at exactly
    1.75 * 2^e compressed-tensors rounds up and ModelOpt (ceil(log2(amax / 448))) does not."""
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(64, 256, generator=g) * 0.03).to(torch.bfloat16)
    w[3, 32:64] = 0.0
    for row, cols, tie in ((5, slice(0, 32), 1.75 * 2**-5), (6, slice(64, 96), 1.75 * 2**-3)):
        w[row, cols] = (w[row, cols].float() / w[row, cols].float().abs().max() * tie * 0.9).to(torch.bfloat16)
        w[row, cols.start + 7] = -tie  # an amax of exactly 1.75 * 2^e
    ct, mo = CT_SCHEMES["MXFP8"].quantize(w), get_scheme("MXFP8").quantize(w)
    amax = w.float().reshape(64, 8, 32).abs().amax(dim=2)
    mant = amax / torch.exp2(torch.floor(torch.log2(amax.clamp(min=1e-30))))
    tie = mant == 1.75
    zero = amax == 0
    assert tie.sum() >= 2
    d = ct["weight_scale"].int() - mo["weight_scale"].int()
    assert (d[tie] == 1).all() and (d[~tie & ~zero] == 0).all()
    same_rows = ~(tie | zero).any(dim=1)
    assert torch.equal(ct["weight"][same_rows].view(torch.uint8), mo["weight"][same_rows].view(torch.uint8))


def test_outputs_shapes_and_refusal_of_ragged_k():
    spec = CT_SCHEMES["MXFP8"].outputs((64, 96))
    assert spec == {"weight": ("F8_E4M3", (64, 96)), "weight_scale": ("U8", (64, 3))}
    assert "divisible by 32" in CT_SCHEMES["MXFP8"].shape_problem((64, 48))
