"""A numeric rule that changes the bytes must bump ``quantize_cli.NUMERICS_VERSION`` (issue 35, 4).

The run identity records the version (``converter`` = ``0.1.0+numerics.N``), so a ``--resume``
across a change is refused, never mixed (an interrupted run of the old rules finished by the new
ones wrote shards that equal neither). This test hashes the weight shards of one small output per
algorithm (and of a GPTQ one): when a hash changes, bump NUMERICS_VERSION in quantize_cli/__init__.py
(with a line of history) and record the new hashes here with it.
"""

import hashlib

import pytest

from quantize_cli import NUMERICS_VERSION
from quantize_cli.algorithms import ALGOS
from tests.conftest import convert

RECORDED_AT = 4  # the NUMERICS_VERSION the hashes below were recorded with
CASES = {algo: {"algo": algo} for algo in ALGOS}
CASES["INT4_ASYM"]["format"] = "compressed-tensors"  # ModelOpt writes no zero points
CASES["GPTQ"] = {"algo": "W4A16_NVFP4", "rounding": "gptq", "calib_data": "default", "calib_samples": 4, "calib_seq_len": 32}
EXPECTED = {
    "FP8": "0b2584cd0ec0c0cd",
    "FP8_PB_WO": "942c375164c20d46",
    "FP8_PER_CHANNEL_PER_TOKEN": "55ac51abadc8c42f",
    "GPTQ": "0a7ad4c87f20d550",
    "INT4": "5cf65647eb301158",
    "INT4_ASYM": "622dd169b47862ce",
    "INT8": "9f36c41f12e5b9cb",
    "MXFP8": "4083b78b7ffc7317",
    "NVFP4": "92767d9ca3482334",
    "W4A16_NVFP4": "3a1bfaff37809ae0",
}


def _shards_sha256(folder) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.glob("*.safetensors")):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_bytes_of_every_algorithm_are_those_of_this_numerics_version(tmp_path, case):
    convert("example:tiny-llama", str(tmp_path / "out"), quiet=True, device="cpu", **CASES[case])
    got = _shards_sha256(tmp_path / "out")
    assert NUMERICS_VERSION == RECORDED_AT, "NUMERICS_VERSION was bumped: record the new hashes (and RECORDED_AT) here"
    assert got == EXPECTED[case], (f"{case}: the output bytes changed ({EXPECTED[case]} -> {got}); a numeric rule changed: "
                                   "bump NUMERICS_VERSION in quantize_cli/__init__.py and record the new hashes here")
