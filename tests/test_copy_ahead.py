"""Verbatim tensors copied while torch loads (run/copy_ahead.py, issue 34).

The copies are journaled as the write stage journals them, so the executor then skips them as it
skips the tasks of a resumed run: the output, the seal and a later ``--resume`` are those of a run
without it. The NaN/Inf refusal of copied tensors still happens (once torch is there), and a
device refusal found only then leaves no DST and no work folder behind.
"""

import json
import os
import subprocess
import sys

import pytest

from quantize_cli.errors import NumericsError, UsageError
from quantize_cli.run import startup
from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors
from tests.conftest import convert, output_files


@pytest.fixture
def slow_device(monkeypatch):
    """The device is 'still loading' until every copy is done: copy-ahead copies every task."""
    monkeypatch.setattr(startup.Resolution, "done", lambda self: False)


@pytest.fixture
def no_copy_ahead(monkeypatch):
    import quantize_cli.convert as convert_module

    monkeypatch.setattr(convert_module, "_copies_ahead", lambda opts, finished: False)


def _run(src, tmp_path, name, **kw):
    (tmp_path / name).mkdir()
    dst = tmp_path / name / "out"
    res = convert(src, str(dst), quiet=True, max_shard_size="1MB", report=str(tmp_path / f"{name}.json"), **kw)
    return dst, res, json.loads((tmp_path / f"{name}.json").read_text())


@pytest.mark.parametrize("algo,device", [("FP8_PB_WO", "cpu"), ("NVFP4", "cpu"), ("NVFP4", "cpu,cpu")])
def test_copied_ahead_output_equals_a_run_without(tiny_llama, tmp_path, monkeypatch, algo, device):
    import quantize_cli.convert as convert_module

    real = convert_module._copies_ahead
    monkeypatch.setattr(convert_module, "_copies_ahead", lambda opts, finished: False)
    plain, _, _ = _run(tiny_llama, tmp_path, "plain", algo=algo)
    monkeypatch.setattr(convert_module, "_copies_ahead", real)
    monkeypatch.setattr(startup.Resolution, "done", lambda self: False)
    ahead, _, report = _run(tiny_llama, tmp_path, "ahead", algo=algo, device=device)  # cpu,cpu: one pipeline per device
    assert "copy_ahead" in report["timings_s"]["stages_s"]  # it did run
    assert output_files(plain) == output_files(ahead)  # shards, index, card, seal (journal digests)


def test_a_nan_in_a_copied_tensor_is_still_refused(make_checkpoint, tmp_path, slow_device):
    cfg = llama_config()
    t = llama_tensors(cfg, seed=3)
    t["model.norm.weight"][7] = float("inf")
    src = make_checkpoint(t, cfg)
    with pytest.raises(NumericsError, match=r"model\.norm\.weight .*NaN or Inf"):
        convert(src, str(tmp_path / "out"), algo="FP8_PB_WO", quiet=True)
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.partial").exists()


def test_an_interrupted_copied_ahead_run_resumes_to_the_same_bytes(tiny_llama, tmp_path, slow_device, monkeypatch):
    from tests.hostile.helpers import interrupt_after_tasks

    ref, _, _ = _run(tiny_llama, tmp_path, "ref", algo="FP8")
    (tmp_path / "x").mkdir()
    restore = interrupt_after_tasks(monkeypatch, 2)  # the executor's second task: after every copy
    with pytest.raises(KeyboardInterrupt):
        convert(tiny_llama, str(tmp_path / "x" / "out"), algo="FP8", quiet=True, max_shard_size="1MB")
    restore()
    convert(tiny_llama, str(tmp_path / "x" / "out"), algo="FP8", quiet=True, max_shard_size="1MB", resume=True)
    assert output_files(ref) == output_files(tmp_path / "x" / "out")


def test_a_device_refused_after_copying_leaves_nothing(tiny_llama, tmp_path, slow_device, monkeypatch):
    import quantize_cli.run.options as run_options

    def refuse(how, opts, fmt):
        raise UsageError("--device cuda: no CUDA GPU is available here; use --device cpu or auto")

    monkeypatch.setattr(run_options, "resolve_run", refuse)
    with pytest.raises(UsageError, match="no CUDA GPU"):
        convert(tiny_llama, str(tmp_path / "out"), algo="FP8_PB_WO", quiet=True)
    assert sorted(os.listdir(tmp_path)) == ["src"]  # no DST, no work folder


def test_a_whole_command_copies_while_torch_loads(tiny_llama, tmp_path):
    """As a user runs it: a fresh process, whose torch import the copies overlap."""
    report = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "quantize_cli", "convert", tiny_llama, "-o", str(tmp_path / "out"), "--algo",
                        "FP8_PB_WO", "--device", "cpu", "-q", "--report", str(report)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    stages = json.loads(report.read_text())["timings_s"]["stages_s"]
    assert stages.get("copy_ahead", 0) > 0  # torch took longer to load than the first copy
