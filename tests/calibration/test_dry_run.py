"""`convert --dry-run --calib-data`: the data and the architecture are checked, the model never runs."""

from __future__ import annotations

import json
import os

import pytest

from quantize_cli import api
from tests.conftest import convert
from quantize_cli.calibration import forward
from quantize_cli.errors import CalibrationError, SourceError
from tests.calibration import builders


@pytest.fixture
def no_forward(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the calibration forward ran during a dry run")

    monkeypatch.setattr(forward, "run", refuse)


def _data(tmp_path, lines: bytes) -> str:
    p = tmp_path / "c.jsonl"
    p.write_bytes(lines)
    return str(p)


def test_dry_run_checks_and_reports_without_forward(tmp_path, capsys, no_forward):
    src = builders.llama(str(tmp_path / "src"))
    res = convert(src, None, algo="NVFP4", device="cpu", dry_run=True, calib_data="default", calib_seq_len=32)
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("dry run: would calibrate"))
    assert "(llama, 3 blocks, one at a time on cpu)" in line and "at most 32 each" in line and "no forward run" in line
    assert "no calibration data was given" not in err  # calibration is asked for: not the "uncalibrated" warning
    assert res.dst is None
    assert not [f for f in res.plan.findings if f.code == "uncalibrated"]


def test_dry_run_refuses_bad_data_and_unknown_architecture(tmp_path, no_forward):
    src = builders.llama(str(tmp_path / "src"))
    with pytest.raises(CalibrationError, match="outside the model's vocabulary"):
        convert(src, None, algo="FP8", device="cpu", quiet=True, dry_run=True,
                    calib_data=_data(tmp_path, b'{"input_ids": [1, 2, 99999]}\n'))
    with pytest.raises(CalibrationError, match="line 1: not valid JSON"):
        convert(src, None, algo="FP8", device="cpu", quiet=True, dry_run=True, calib_data=_data(tmp_path, b"{oops\n"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["model_type"] = "my_secret_arch"
    json.dump(cfg, open(os.path.join(src, "config.json"), "w"))
    with pytest.raises(SourceError, match="model_type 'my_secret_arch'"):
        convert(src, None, algo="FP8", device="cpu", quiet=True, dry_run=True,
                    calib_data=_data(tmp_path, b'{"input_ids": [1, 2, 3]}\n'))
