"""The command line through click's CliRunner: exit codes, one-line messages, files written or not."""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from quantize_cli.cli import main


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_convert_ok_and_quiet(tiny_llama, tmp_path):
    r = invoke("convert", tiny_llama, "-o", tmp_path / "out", "--algo", "fp8_pb_wo", "--quiet")
    assert r.exit_code == 0, r.output
    assert os.path.exists(tmp_path / "out" / "model.safetensors")
    assert "wrote" not in r.output


def test_unknown_algo_is_a_usage_error(tiny_llama, tmp_path):
    r = invoke("convert", tiny_llama, "-o", tmp_path / "out", "--algo", "FP9")
    assert r.exit_code == 2 and "FP9" in r.output
    assert not os.path.exists(tmp_path / "out")


def test_missing_output_is_a_usage_error(tiny_llama):
    r = invoke("convert", tiny_llama, "--algo", "FP8")
    assert r.exit_code == 2 and "-o DST" in r.output


def test_bad_size_is_a_usage_error(tiny_llama, tmp_path):
    r = invoke("convert", tiny_llama, "-o", tmp_path / "o", "--algo", "FP8", "--max-shard-size", "huge")
    assert r.exit_code == 2 and "--max-shard-size" in r.output


def test_existing_destination_is_refused_and_untouched(tiny_llama, tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    r = invoke("convert", tiny_llama, "-o", dst, "--algo", "FP8")
    assert r.exit_code == 1
    assert r.output.startswith("error: ") and "--overwrite" in r.output and len(r.output.strip().splitlines()) == 1
    assert os.listdir(dst) == ["keep.txt"]


def test_overwrite_replaces_only_when_complete(tiny_llama, tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "old.txt").write_text("old")
    r = invoke("convert", tiny_llama, "-o", dst, "--algo", "FP8", "--overwrite", "-q")
    assert r.exit_code == 0, r.output
    assert "old.txt" not in os.listdir(dst) and "model.safetensors" in os.listdir(dst)
    assert [e for e in os.listdir(tmp_path) if e.startswith(".")] == []


def test_dry_run_writes_nothing(tiny_llama, tmp_path):
    r = invoke("convert", tiny_llama, "-o", tmp_path / "out", "--algo", "NVFP4", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "model.layers.0.self_attn.q_proj" in r.output and "exclude_modules" in r.output
    assert os.listdir(tmp_path) == [os.path.basename(tiny_llama)]


def test_plan_problems_exit_1_with_every_offender(make_checkpoint, tmp_path):
    from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors

    cfg = llama_config(hidden=192, intermediate=320)
    src = make_checkpoint(llama_tensors(cfg), cfg)
    r = invoke("convert", src, "-o", tmp_path / "out", "--algo", "FP8_PB_WO")
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert lines[0].startswith("error: 14 problem(s)") and "nothing was written" in lines[0]
    assert sum("divisible by 128" in line for line in lines) == 14
    assert "Traceback" not in r.output and not os.path.exists(tmp_path / "out")


def test_failure_mid_run_leaves_no_finished_looking_destination(tiny_llama, tmp_path, monkeypatch):
    import quantize_cli.run.compute as compute

    calls = {"n": 0}
    real = compute.ComputeStage.run_task

    def boom(self, task, steps):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(28, "No space left on device")
        return real(self, task, steps)

    monkeypatch.setattr(compute.ComputeStage, "run_task", boom)
    r = invoke("convert", tiny_llama, "-o", tmp_path / "out", "--algo", "FP8")
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert not os.path.exists(tmp_path / "out")
    assert os.listdir(tmp_path) == ["src"]  # no DST, and the partial work folder was removed


def test_debug_shows_the_traceback(tmp_path):
    from quantize_cli.errors import SourceError

    r = invoke("convert", tmp_path / "missing", "-o", tmp_path / "out", "--algo", "FP8", "--debug")
    # --debug lets the library's exception through (without it the CLI would exit via SystemExit)
    assert isinstance(r.exception, SourceError) and "no such folder" in str(r.exception)


def test_missing_source_one_line(tmp_path):
    r = invoke("convert", tmp_path / "missing", "-o", tmp_path / "out", "--algo", "FP8")
    assert r.exit_code == 1 and r.output.startswith("error: ") and "missing" in r.output


def test_report_written_on_failure_too(make_checkpoint, tmp_path):
    from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors

    cfg = llama_config(hidden=192, intermediate=320)
    src = make_checkpoint(llama_tensors(cfg), cfg)
    r = invoke("convert", src, "-o", tmp_path / "out", "--algo", "FP8_PB_WO", "--report", tmp_path / "r.json")
    assert r.exit_code == 1
    doc = json.load(open(tmp_path / "r.json"))
    assert doc["status"] == "error" and "problem" in doc["error"]


def test_example_source_and_recipes_list(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    r = invoke("convert", "example:tiny-llama", "-o", tmp_path / "out", "--algo", "FP8_PB_WO", "-q")
    assert r.exit_code == 0, r.output
    r = invoke("convert", "example:nope", "-o", tmp_path / "o2", "--algo", "FP8")
    assert r.exit_code == 1 and "example:tiny-llama" in r.output
    r = invoke("recipes")
    assert r.exit_code == 0 and "llama" in r.output


def test_help_imports_neither_triton_nor_torch():
    code = "import sys; from quantize_cli.cli import main; import quantize_cli; print('triton' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
    r = subprocess.run([sys.executable, "-m", "quantize_cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "convert" in r.stdout


def test_convert_help_runs_without_torch_and_lists_every_algorithm():
    """--help parses the algorithm list from algorithms.py (torch-free), in a fresh process."""
    code = ("import sys\nfrom quantize_cli.cli import main\n"
            "try:\n    main(['convert', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
            "print('torch' in sys.modules, 'triton' in sys.modules, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stderr.split() == ["False", "False"]
    from quantize_cli.algorithms import ALGOS

    assert all(a in r.stdout for a in ALGOS)


def test_unwritable_report_path_fails_first(tiny_llama, tmp_path):
    r = invoke("convert", tiny_llama, "-o", tmp_path / "out", "--algo", "FP8", "--report", tmp_path / "no" / "r.json")
    assert r.exit_code == 2 and "--report" in r.output
    assert not os.path.exists(tmp_path / "out")


def test_inspect_summarises_plain_and_quantized(tiny_llama, tmp_path):
    r = invoke("inspect", tiny_llama)
    assert r.exit_code == 0 and "BF16" in r.output and "not quantized" in r.output and "model_type 'llama'" in r.output
    invoke("convert", tiny_llama, "-o", tmp_path / "q", "--algo", "NVFP4", "-q")
    r = invoke("inspect", tmp_path / "q")
    assert r.exit_code == 0 and "quant_algo 'NVFP4'" in r.output and "F8_E4M3" in r.output and "U8" in r.output
    assert invoke("inspect", tmp_path / "missing").exit_code == 1
