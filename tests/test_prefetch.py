"""The start-up warm-up (prefetch.py): the source's first bytes are handed to the kernel in the
plan's read order while torch imports, capped, stopped when the conversion reads, never in the way."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from click.testing import CliRunner

from quantize_cli.run import prefetch
from quantize_cli.cli import main


def _files(tmp_path, sizes: dict[str, int]) -> str:
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(b"\0" * size)
    return str(tmp_path)


def _record(monkeypatch) -> list[tuple[str, int, int]]:
    calls = []
    monkeypatch.setattr(prefetch.os, "posix_fadvise", lambda fd, off, n, advice: calls.append(
        (os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), off, n, advice)))
    return calls


def test_shards_in_read_order_and_nothing_else(tmp_path):
    src = _files(tmp_path, {"model-00002-of-00002.safetensors": 1, "model-00001-of-00002.safetensors": 1, "config.json": 1})
    assert [os.path.basename(p) for p in prefetch.shards(src)] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert prefetch.shards("meta-llama/Llama-3.1-8B") == [] and prefetch.shards(str(tmp_path / "absent")) == []
    assert prefetch.start("example:tiny-llama") is None  # nothing local to warm


def test_chunks_in_order_up_to_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(prefetch, "CHUNK", 10)
    calls = _record(monkeypatch)
    a, b = os.path.join(tmp_path, "a"), os.path.join(tmp_path, "b")
    _files(tmp_path, {"a": 25, "b": 30})
    w = prefetch.Warmup([a, b], cap=42)
    w._run()
    assert [c[:3] for c in calls] == [("a", 0, 10), ("a", 10, 10), ("a", 20, 5), ("b", 0, 10), ("b", 10, 7)]
    assert {c[3] for c in calls} == {os.POSIX_FADV_WILLNEED} and w.advised == 42


def test_stop_ends_the_thread_and_reports_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(prefetch, "CHUNK", 10)
    calls = _record(monkeypatch)
    _files(tmp_path, {"x.safetensors": 100})
    w = prefetch.Warmup(prefetch.shards(str(tmp_path)), cap=1000)
    w.stop()
    w._run()  # stopped before it began: advises nothing
    assert calls == [] and w.advised == 0
    monkeypatch.setattr(prefetch, "available_memory", lambda: 4 * 35)  # cap = a quarter of MemAvailable
    w = prefetch.start(str(tmp_path))
    w._thread.join(5)
    assert w.advised == 35 and prefetch.stop() == 35 and prefetch._active == []


def test_unreadable_files_are_skipped_quietly(tmp_path, monkeypatch):
    calls = _record(monkeypatch)
    _files(tmp_path, {"b": 5})
    w = prefetch.Warmup([str(tmp_path / "missing"), str(tmp_path / "nul\0byte"), str(tmp_path / "b")], cap=100)
    w._run()
    assert [c[:3] for c in calls] == [("b", 0, 5)]


def test_convert_warms_the_source_then_stops(tiny_llama, tmp_path, monkeypatch):
    """The CLI starts the warm-up before the library (and torch) load, the library stops it when its
    reads begin, and the report says how many bytes were advised."""
    started = []
    real_start = prefetch.start

    def start(src):
        w = real_start(src)
        w._thread.join(5)  # tiny files: all advised before the conversion reads
        started.append(w)
        return w

    monkeypatch.setattr(prefetch, "start", start)
    out, report = tmp_path / "out", tmp_path / "r.json"
    res = CliRunner().invoke(main, ["convert", tiny_llama, "-o", str(out), "--algo", "FP8", "--quiet", "--report", str(report)])
    assert res.exit_code == 0, res.output
    shards = prefetch.shards(tiny_llama)
    assert started and started[0].files == shards
    assert json.loads(report.read_text())["bytes"]["warmed_before_start"] == sum(os.path.getsize(p) for p in shards)
    assert prefetch._active == []
    started.clear()
    res = CliRunner().invoke(main, ["convert", tiny_llama, "--algo", "FP8", "--dry-run", "--quiet"])
    assert res.exit_code == 0 and started == []  # a dry run reads no weights: nothing to warm


def test_prefetch_imports_no_torch(tmp_path):
    """It runs before the heavy imports: starting it (index read included) must not pull them in."""
    _files(tmp_path, {"a.safetensors": 1})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "a.safetensors"}}))
    code = (f"import sys, quantize_cli.run.prefetch as p; assert p.shards({str(tmp_path)!r}); "
            "print(sorted(m for m in ('torch', 'triton', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_shards_follow_the_index(tmp_path):
    """With an index, only the shards it names are warmed: a consolidated copy beside them is never read."""
    src = _files(tmp_path, {"consolidated.safetensors": 1, "model-00002-of-00002.safetensors": 1, "model-00001-of-00002.safetensors": 1})
    index = {"weight_map": {"b": "model-00002-of-00002.safetensors", "a": "model-00001-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert [os.path.basename(p) for p in prefetch.shards(src)] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    (tmp_path / "model.safetensors.index.json").write_text("{broken")
    assert prefetch.shards(src) == []


def test_no_warmup_on_resume(tiny_llama, tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(prefetch, "start", lambda src: started.append(src))
    res = CliRunner().invoke(main, ["convert", tiny_llama, "-o", str(tmp_path / "out"), "--algo", "FP8", "--quiet", "--resume"])
    assert res.exit_code == 0, res.output
    assert started == []  # its first bytes are likely converted already
    res = CliRunner().invoke(main, ["convert", tiny_llama, "-o", str(tmp_path / "out2"), "--algo", "FP8", "--quiet"])
    assert res.exit_code == 0 and started == [tiny_llama]


def test_calibrate_warms_the_source(tiny_llama, tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(prefetch, "start", lambda src: started.append(src))
    import quantize_cli.api as api

    monkeypatch.setattr(api, "calibrate", lambda src, **kw: None)  # the forward is tested elsewhere
    res = CliRunner().invoke(main, ["calibrate", tiny_llama, "--calib-data", "default", "-o", str(tmp_path / "s.json")])
    assert res.exit_code == 0, res.output
    assert started == [tiny_llama]
