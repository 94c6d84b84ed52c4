"""Issue 35: GPTQ (``--rounding gptq``) and smoothing (``--smooth``) inside the one run lifecycle.

Each test reproduces one of the issue's items with the embedded examples and a tiny calibration
(`CAL`), as the issue did on the CPU."""

from __future__ import annotations

import glob
import os

import pytest
from click.testing import CliRunner
from safetensors import safe_open

from quantize_cli.cli import main

CAL = ["--calib-data", "default", "--calib-samples", "4", "--calib-seq-len", "32", "--device", "cpu"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _input_scales(dst) -> dict[str, float]:
    out = {}
    for path in glob.glob(os.path.join(dst, "*.safetensors")):
        with safe_open(path, "pt") as f:
            out.update({k: float(f.get_tensor(k).float().max()) for k in f.keys() if k.endswith(".input_scale")})
    return out


def test_item1_gptq_with_algo_for_keeps_the_rules_calibrated_input_scales(tmp_path):
    """Item 1: --rounding gptq + --algo-for '*mlp*=NVFP4' (static input scales) under a W4A16_NVFP4
    --algo: the mlp input_scales are calibrated (as without --rounding gptq), not the constant 1/6."""
    args = ["--algo", "W4A16_NVFP4", "--algo-for", "*mlp*=NVFP4", *CAL, "-q"]
    plain = invoke("convert", "example:tiny-llama", "-o", tmp_path / "plain", *args)
    assert plain.exit_code == 0, plain.output
    gptq = invoke("convert", "example:tiny-llama", "-o", tmp_path / "gptq", *args, "--rounding", "gptq")
    assert gptq.exit_code == 0, gptq.output
    want, got = _input_scales(tmp_path / "plain"), _input_scales(tmp_path / "gptq")
    assert want and set(got) == set(want) and all("mlp" in k for k in got)
    assert all(abs(v - 1 / 6) > 1e-4 for v in got.values()), got  # not the uncalibrated constant 1/6
    assert all(v < 0.01 for v in got.values()), got  # calibrated amax of the tiny model: ~1e-3
    assert "no calibration data" not in gptq.output


def test_item18_no_clock_times_in_hf_quant_config_and_a_finished_calibrated_output_resumes(tmp_path):
    """Item 18: two identical calibrated runs write identical hf_quant_config.json (the calibration's
    seconds go to the report only), and --resume of the finished output exits 0."""
    import json

    args = ["--algo", "FP8", *CAL, "-q"]
    for name in ("a", "b"):
        r = invoke("convert", "example:tiny-llama", "-o", tmp_path / name, *args, "--report", tmp_path / f"{name}.json")
        assert r.exit_code == 0, r.output
    config = [(tmp_path / n / "hf_quant_config.json").read_bytes() for n in ("a", "b")]
    assert b"seconds" not in config[0]
    assert config[0] == config[1]
    report = json.loads((tmp_path / "a.json").read_text())
    assert "forward_seconds" in json.dumps(report)  # the timing is kept, in the report
    again = invoke("convert", "example:tiny-llama", "-o", tmp_path / "a", *args, "--resume")
    assert again.exit_code == 0, again.output


@pytest.fixture(scope="module")
def gptq_scales(tmp_path_factory):
    """S.json (and S.weights/) made by `calibrate --rounding gptq --algo W4A16_NVFP4` on example:tiny-llama."""
    path = tmp_path_factory.mktemp("gptq-scales") / "S.json"
    r = invoke("calibrate", "example:tiny-llama", "-o", path, "--rounding", "gptq", "--algo", "W4A16_NVFP4", *CAL, "-q")
    assert r.exit_code == 0, r.output
    return path


def test_item10_gptq_act_scales_without_rounding_gptq_is_refused_naming_the_option(gptq_scales, tmp_path):
    """Item 10: --act-scales from a GPTQ calibrate, converted without --rounding gptq: refused (not
    "ignored" with the GPTQ weights dropped), naming --rounding gptq."""
    r = invoke("convert", "example:tiny-llama", "-o", tmp_path / "out", "--algo", "W4A16_NVFP4", "--act-scales", gptq_scales, "-q")
    assert r.exit_code == 2, r.output
    assert "--rounding gptq" in r.output and str(gptq_scales) in r.output and "ignored" not in r.output
    assert not (tmp_path / "out").exists()


def test_item11_smooth_mismatch_names_smooth_and_both_values(gptq_scales, tmp_path):
    """Item 11: the same file with --rounding gptq --smooth awq: refused naming --smooth, none and awq."""
    r = invoke("convert", "example:tiny-llama", "-o", tmp_path / "out", "--algo", "W4A16_NVFP4", "--act-scales", gptq_scales,
               "--rounding", "gptq", "--smooth", "awq", "-q")
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert '--smooth "none", this conversion has "awq"' in text, text
    assert "--rounding" not in text.split("made with")[1].split(";")[0]  # rounding agrees: not named as a difference


def test_item7_verify_on_a_finished_resume_checks_as_the_fresh_run_did(tmp_path):
    """Item 7: --verify of a finished GPTQ compressed-tensors output on --resume reports the same check
    as the fresh run (not compared with the source: the documents do not record the rounding)."""
    args = ["convert", "example:tiny-llama", "-o", tmp_path / "out", "--algo", "W4A16_NVFP4", "--format", "compressed-tensors",
            "--rounding", "gptq", "--verify", *CAL]
    lines = []
    for extra in ([], ["--resume"]):
        r = invoke(*args, *extra)
        assert r.exit_code == 0, r.output
        lines.append([line for line in r.output.splitlines() if line.startswith("verify:")])
    assert lines[1] and lines[1] == lines[0], lines
    assert "not compared with the source" in lines[1][0]


def test_item8_a_compressed_tensors_output_without_its_seal_is_not_accepted_as_complete(tmp_path):
    """Item 8: without .quantize-checksums, a calibrated compressed-tensors output (whose config records
    no calibration) resumed without the calibration is refused naming the seal and --overwrite."""
    dst = tmp_path / "out"
    made = invoke("convert", "example:tiny-llama", "-o", dst, "--algo", "FP8", "--format", "compressed-tensors", *CAL, "-q")
    assert made.exit_code == 0, made.output
    os.unlink(dst / ".quantize-checksums")
    r = invoke("convert", "example:tiny-llama", "-o", dst, "--algo", "FP8", "--format", "compressed-tensors", "--resume")
    assert r.exit_code == 1, r.output
    text = " ".join(r.output.split())
    assert ".quantize-checksums" in text and "--overwrite" in text and "already complete" not in text
