"""The same calibration gives the same bytes with any CPU thread count (issue 36).

MKL's products and LAPACK's Cholesky split their sums by the thread count; before the calibration
forward and GPTQ ran on one thread (calibration/one_thread.py), ``example:tiny-llama`` with GPTQ gave
other bytes in 8 tensors with 1 and 2 threads, and calibrated input scales could differ too.
Each run is a fresh process: torch takes its thread count from OMP_NUM_THREADS at start.
"""

import os
import subprocess
import sys

import pytest

from tests.conftest import output_files

CAL = ["--calib-data", "default", "--calib-samples", "4", "--calib-seq-len", "64", "--device", "cpu", "-q"]


def _convert(tmp_path, threads: int, *extra) -> dict:
    (tmp_path / str(threads)).mkdir()
    dst = tmp_path / str(threads) / "out"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    p = subprocess.run([sys.executable, "-m", "quantize_cli", "convert", "example:tiny-llama", "-o", str(dst), *extra, *CAL],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr
    return output_files(dst)


@pytest.mark.parametrize("extra", [("--algo", "W4A16_NVFP4", "--rounding", "gptq"), ("--algo", "NVFP4")], ids=["gptq", "amax"])
def test_one_and_four_threads_write_the_same_bytes(tmp_path, extra):
    one, four = _convert(tmp_path, 1, *extra), _convert(tmp_path, 4, *extra)
    assert one.keys() == four.keys()
    assert [f for f in one if one[f] != four[f]] == []


def test_the_thread_count_is_restored_after_calibration():
    import torch

    from quantize_cli.calibration.one_thread import one_thread

    torch.set_num_threads(2)
    with one_thread(torch.device("cpu")):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with one_thread(torch.device("meta")):  # not the CPU: untouched
        assert torch.get_num_threads() == 2


def test_a_finished_calibrated_output_resumes_as_already_complete(tmp_path):
    """hf_quant_config.json held the calibration's clock times (issue 35, 18): a retry of the same
    command (`--resume`, the CI retry) found them changed and exited 1."""
    dst = tmp_path / "out"
    cmd = [sys.executable, "-m", "quantize_cli", "convert", "example:tiny-llama", "-o", str(dst), "--algo", "NVFP4", *CAL]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    config = (dst / "hf_quant_config.json").read_text()
    assert "seconds" not in config
    again = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert (dst / "hf_quant_config.json").read_text() == config
