"""Calibrated static activation scales in the compressed-tensors format (FP8 input_scale, NVFP4
input_global_scale), derived as llm-compressor derives them, shared by fused groups."""

from __future__ import annotations

import json
import math
import os
import struct

import pytest
import torch

from tests.conftest import convert
from quantize_cli import api
from tests.conftest import golden_checkpoint, load_all

CALIB = os.path.join(os.path.dirname(__file__), "golden", "checkpoints", "calibration.jsonl")
FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


@pytest.fixture(scope="module")
def scales(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("s") / "scales.json")
    api.calibrate(golden_checkpoint("tiny-llama"), calib_data=CALIB, output=out, device="cpu", quiet=True)
    with open(out) as f:
        return out, {m: e["amax"] for m, e in json.load(f)["modules"].items()}


def _bf16(x: float) -> float:
    """`x` rounded to bfloat16 by hand: 8 significant bits, ties to even (Python's round)."""
    if x == 0:
        return 0.0
    _, e = math.frexp(x)  # x = m * 2**e, 0.5 <= |m| < 1
    ulp = 2.0 ** (e - 8)
    return round(x / ulp) * ulp  # x / ulp is exact (a power-of-two scaling)


def _f32(x: float) -> float:
    """`x` rounded to fp32 (a float64 quotient of fp32 values rounds to the IEEE fp32 quotient)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _group_amax(amax: dict, module: str) -> float:
    """The max over `module`'s fused group (q/k/v, gate/up), as the plan shares it."""
    prefix, _, leaf = module.rpartition(".")
    if leaf not in FUSED:
        return amax[module]
    return max(a for m, a in amax.items() if m.rpartition(".")[0] == prefix and FUSED.get(m.rpartition(".")[2]) == FUSED[leaf])


@pytest.mark.parametrize("algo", ["FP8", "NVFP4"])
def test_compressed_tensors_takes_the_calibrated_scales(tmp_path, scales, algo):
    path, amax = scales
    dst = str(tmp_path / "out")
    convert(golden_checkpoint("tiny-llama"), dst, algo=algo, device="cpu", quiet=True, act_scales=path,
                format="compressed-tensors")
    out = load_all(dst)
    suffix = "input_scale" if algo == "FP8" else "input_global_scale"
    names = [k for k in out if k.endswith(suffix)]
    assert len(names) == 14
    for k in names:
        module = k.rpartition(".")[0]
        a = _group_amax(amax, module)
        if algo == "FP8":  # the weight's dtype (bf16), [1], = bf16(bf16(amax) / 448), as llm-compressor computes it
            want = _bf16(_bf16(a) / 448.0)
            assert out[k].dtype == torch.bfloat16 and out[k].shape == (1,)
        else:  # fp32 [1] = 2688 / fp32(amax), rounded once to fp32
            want = _f32(2688.0 / _f32(a))
            assert out[k].dtype == torch.float32 and out[k].shape == (1,)
        assert out[k].float().item() == want, (k, out[k].item(), want)
    constant = 1.0 if algo == "FP8" else 6.0
    assert all(out[k].item() != constant for k in names)  # calibrated, not the documented constant


def test_a_compressed_tensors_output_resumed_as_modelopt_is_refused(tmp_path):
    """A finished compressed-tensors DST, retried with --resume in the ModelOpt format: refused, not reused."""
    from quantize_cli.errors import QuantizeError

    dst = str(tmp_path / "o")
    convert(golden_checkpoint("tiny-llama"), dst, algo="FP8_PB_WO", format="compressed-tensors", quiet=True)
    before = load_all(dst)
    with pytest.raises(QuantizeError):
        convert(golden_checkpoint("tiny-llama"), dst, algo="FP8_PB_WO", quiet=True, resume=True)
    after = load_all(dst)
    assert before.keys() == after.keys() and all(torch.equal(before[k].view(-1).view(torch.uint8), after[k].view(-1).view(torch.uint8)) for k in before)


def test_verify_source_of_a_compressed_tensors_output_knows_its_weights_method(tmp_path):
    """The matrix's 35.M4: `verify --source` of a compressed-tensors output made with --rounding gptq
    --smooth awq held the weights to the round-to-nearest floors (exit 1 on a correct output) because
    config.json has no field for the method. The card records it (calibration/record.py); verify reads
    it there: smoothed weights are not compared. Without the record it compares as round to nearest."""
    from quantize_cli.calibration.record import METHOD_COMMENT
    from quantize_cli.errors import CheckFailed
    from tests.matrix.support import CALIB

    dst = tmp_path / "out"
    convert("example:tiny-llama", str(dst), algo="INT8", format="compressed-tensors", rounding="gptq", smooth="awq",
            calib_data=CALIB, calib_samples=4, calib_seq_len=32, device="cpu", quiet=True)
    card = (dst / "README.md").read_text()
    assert METHOD_COMMENT.search(card).group(1) == '{"rounding": "gptq", "smooth": "awq"}'
    res = api.verify(str(dst), source="example:tiny-llama", quiet=True)
    assert not res.errors and "--smooth awq" in res.source_note and not res.errors_by_tensor
    (dst / "README.md").write_text(METHOD_COMMENT.sub("", card))
    with pytest.raises(CheckFailed):  # compared with the floors: the smoothed weights fall under them
        api.verify(str(dst), source="example:tiny-llama", quiet=True)


def test_convert_verify_of_a_compressed_tensors_gptq_output_compares_with_the_source(tmp_path):
    """`convert --verify` runs before the card that records the weights method is written: it is given
    the method (convert._verify_folder), so a compressed-tensors GPTQ output is compared with its source
    (without the round-to-nearest floors, as `verify --source` does) instead of skipped; the finished
    DST checked again by --resume --verify gets the same answer."""
    from tests.matrix.support import CALIB

    dst = str(tmp_path / "out")
    kw = dict(algo="INT8", format="compressed-tensors", rounding="gptq", calib_data=CALIB, calib_samples=4,
              calib_seq_len=32, device="cpu", quiet=True, verify=True)
    first = convert("example:tiny-llama", dst, **kw).report["verify"]
    assert first["errors"] == 0 and first["compared_with_source"] and first["sqnr_db"], first
    again = convert("example:tiny-llama", dst, resume=True, **kw).report["verify"]
    assert again == first
    assert api.verify(dst, source="example:tiny-llama", quiet=True).errors == []
