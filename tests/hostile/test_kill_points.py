"""Death at many points, and two runs racing for one DST.

A real SIGKILL costs a fresh interpreter per point (seconds here), so test_faults.py kills real
processes at three points; this file covers many more points cheaply by dying *like* SIGKILL in
process: at tensor write N the run stops with no cleanup at all (no discard, no journal close,
the lock's descriptor closed as the kernel would), leaving the work folder exactly as a killed
process leaves it. ``--resume`` must then give the bytes of an uninterrupted run, and a second
``--resume`` must say "already complete" (idempotent retries)."""

from __future__ import annotations

import os
import random
import threading

import pytest

from tests.conftest import convert

from tests.conftest import output_files

import quantize_cli.api as api
from quantize_cli.output.destination import Destination
from quantize_cli.checkpoint.writer import ShardWriter
from quantize_cli.errors import DestinationError

from .helpers import make_src


class Killed(BaseException):
    """Stands for SIGKILL: nothing catches it, nothing cleans up."""


@pytest.fixture
def src(tmp_path):
    return make_src(tmp_path / "src")


def _files(folder) -> dict:
    return output_files(folder)


def _die_at_write(monkeypatch, n: int) -> None:
    real = ShardWriter.write_bytes
    count = [0]

    def write_bytes(self, *a, **k):
        count[0] += 1
        if count[0] == n:
            raise Killed
        return real(self, *a, **k)

    monkeypatch.setattr(ShardWriter, "write_bytes", write_bytes)
    # no cleanup of any kind, as after SIGKILL; the kernel drops the flock with the descriptor
    monkeypatch.setattr(Destination, "discard", lambda self: self.release())
    import quantize_cli.output.workfolder as workfolder

    monkeypatch.setattr(workfolder.WorkFolder, "keep_for_resume", lambda self, say, exc=None: self.dest.release())


def test_death_at_twelve_random_write_points_then_resume_is_byte_identical(tmp_path, src, monkeypatch):
    ref = tmp_path / "ref"
    count = [0]
    real = ShardWriter.write_bytes
    monkeypatch.setattr(ShardWriter, "write_bytes", lambda self, *a, **k: (count.__setitem__(0, count[0] + 1), real(self, *a, **k))[1])
    convert(src, str(ref), algo="NVFP4", quiet=True, max_shard_size="100KB")
    monkeypatch.undo()
    total = count[0]
    expected = _files(ref)
    points = sorted(random.Random(20261125).sample(range(1, total + 1), min(12, total)))
    for n in points:
        dst = tmp_path / f"out-{n}"
        _die_at_write(monkeypatch, n)
        with pytest.raises(Killed):
            convert(src, str(dst), algo="NVFP4", quiet=True, max_shard_size="100KB", memory_budget="1MB")
        monkeypatch.undo()
        assert not dst.exists() and (tmp_path / f".out-{n}.partial").is_dir()
        convert(src, str(dst), algo="NVFP4", quiet=True, max_shard_size="100KB", resume=True)
        assert _files(dst) == expected, f"died at write {n} of {total}"
        again = convert(src, str(dst), algo="NVFP4", quiet=True, max_shard_size="100KB", resume=True)
        assert again.report["status"] == "already-complete"
    assert len(points) >= 10


def test_two_converts_racing_for_one_dst(tmp_path, src):
    """Two library calls at once: one publishes a complete DST, the other is refused cleanly."""
    dst = str(tmp_path / "out")
    results: list = []
    barrier = threading.Barrier(2)

    def run():
        barrier.wait()
        try:
            results.append(convert(src, dst, algo="FP8", quiet=True, memory_budget="1MB"))
        except DestinationError as exc:
            results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    errors = [r for r in results if isinstance(r, DestinationError)]
    assert len(results) == 2 and len(errors) <= 1, results
    for e in errors:
        assert "another quantize run is writing it" in e.message or "already exists" in e.message or "appeared during the run" in e.message
    from quantize_cli.verify import verify_checkpoint

    assert not verify_checkpoint(dst, src).errors
    leftovers = sorted(f for f in os.listdir(tmp_path) if f.startswith(".out"))
    assert leftovers in ([], [".out.partial"]), leftovers  # "appeared during the run" keeps the loser's output, said where
