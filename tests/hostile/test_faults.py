"""Faults and interruptions: a full disk, a source changing under us, Ctrl-C, SIGTERM, a second
run on the same DST, a stale work folder, SIGKILL then --resume. Whatever happens, a DST that
exists is complete, nothing outside DST's work folder is touched, and there is no traceback."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import output_files

import quantize_cli.checkpoint.writer as writer_mod
from quantize_cli.output.destination import LOCK_NAME
from quantize_cli.checkpoint.writer import ShardWriter
from quantize_cli.signals import Terminated, deferred, stop_on_signals

from .helpers import (
    SHARD2,
    assert_clean_failure,
    assert_no_finished_dst,
    convert,
    make_src,
    outside_work_folders,
    tree_state,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def src(tmp_path):
    return make_src(tmp_path / "src")


def partials(tmp_path):
    return [e for e in os.listdir(tmp_path) if e.startswith(".") and "partial" in e]


# -- out of disk space ------------------------------------------------------------------------------
class _FullDiskOs:
    """Stands in for the ``os`` module inside writer.py: pwrite fails with ENOSPC after `budget` calls."""

    def __init__(self, budget: int):
        self.budget = budget
        self.calls = 0

    def pwrite(self, fd, data, offset):
        self.calls += 1
        if self.calls > self.budget:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.pwrite(fd, data, offset)

    def __getattr__(self, name):
        return getattr(os, name)


def _pwrite_calls(src, tmp_path, monkeypatch) -> int:
    counter = _FullDiskOs(10**9)
    monkeypatch.setattr(writer_mod, "os", counter)
    tmp_path.mkdir(exist_ok=True)
    r = convert(src, tmp_path / "count")
    assert r.exit_code == 0, r.output
    monkeypatch.setattr(writer_mod, "os", os)
    return counter.calls


@pytest.mark.parametrize("where", ["header", "first-tensor", "middle", "last-tensor"])
def test_disk_full_mid_write(tmp_path, src, monkeypatch, where):
    total = _pwrite_calls(src, tmp_path / "probe", monkeypatch)
    assert total > 10
    budget = {"header": 0, "first-tensor": 1, "middle": total // 2, "last-tensor": total - 1}[where]
    before = tree_state(tmp_path)
    monkeypatch.setattr(writer_mod, "os", _FullDiskOs(budget))
    r = convert(src, tmp_path / "out")
    if where == "header":
        assert_clean_failure(r, 1, "model.safetensors", "No space left on device", "space")
    else:
        assert_clean_failure(r, 1, "model.safetensors", "write failed", "No space left on device", "free disk space")
    assert_no_finished_dst(tmp_path / "out")  # a hidden work folder may stay for --resume
    assert outside_work_folders(tree_state(tmp_path)) == outside_work_folders(before)


def test_disk_full_then_space_freed_converts(tmp_path, src, monkeypatch):
    monkeypatch.setattr(writer_mod, "os", _FullDiskOs(3))
    assert convert(src, tmp_path / "out").exit_code == 1
    monkeypatch.setattr(writer_mod, "os", os)
    r = convert(src, tmp_path / "out")  # a plain rerun (no --resume) starts over and succeeds
    assert r.exit_code == 0, r.output
    assert partials(tmp_path) == []


def test_metadata_write_failure_leaves_no_destination(tmp_path, src, monkeypatch):
    """ENOSPC while writing config.json (WorkFolder.finish): exit 1, no traceback, no DST."""
    import quantize_cli.output.workfolder as workfolder

    real = workfolder.write_atomic

    def fail(path, data):
        if path.endswith("config.json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, data)

    monkeypatch.setattr(workfolder, "write_atomic", fail)
    r = convert(src, tmp_path / "out")
    assert r.exit_code == 1 and "Traceback" not in r.output and "error: " in r.stderr
    assert_no_finished_dst(tmp_path / "out")


def test_source_truncated_during_the_run(tmp_path, src, monkeypatch):
    """The plan was made from a good file; the bytes vanish before they are read."""
    import quantize_cli.run.execute as execute

    original = execute.Executor.run

    def truncate_then_run(self):
        os.truncate(os.path.join(src, SHARD2), 1000)
        return original(self)

    monkeypatch.setattr(execute.Executor, "run", truncate_then_run)
    r = convert(src, tmp_path / "out")
    assert_clean_failure(r, 1, SHARD2, "truncated during the run", "re-download")
    assert not os.path.exists(tmp_path / "out") and partials(tmp_path) == []


def test_source_deleted_during_the_run(tmp_path, src, monkeypatch):
    import quantize_cli.run.execute as execute

    original = execute.Executor.run

    def delete_then_run(self):
        os.unlink(os.path.join(src, SHARD2))
        return original(self)

    monkeypatch.setattr(execute.Executor, "run", delete_then_run)
    r = convert(src, tmp_path / "out")
    assert_clean_failure(r, 1, SHARD2, "cannot open", "source changed")
    assert not os.path.exists(tmp_path / "out") and partials(tmp_path) == []


# -- interruptions in-process -------------------------------------------------------------------------
def _interrupt_on_write(monkeypatch, exc, after: int = 3):
    original = ShardWriter.write_bytes
    calls = [0]

    def write_bytes(self, *a, **k):
        calls[0] += 1
        if calls[0] == after:
            raise exc
        return original(self, *a, **k)

    monkeypatch.setattr(ShardWriter, "write_bytes", write_bytes)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), Terminated(signal.SIGTERM)], ids=["SIGINT", "SIGTERM"])
def test_interrupt_mid_write_in_process(tmp_path, src, monkeypatch, exc):
    before = tree_state(tmp_path)
    _interrupt_on_write(monkeypatch, exc)
    r = convert(src, tmp_path / "out")
    assert_clean_failure(r, 130, "error: interrupted")
    assert_no_finished_dst(tmp_path / "out")
    assert outside_work_folders(tree_state(tmp_path)) == outside_work_folders(before)


def test_interrupt_with_overwrite_keeps_the_old_destination(tmp_path, src, monkeypatch):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "model.safetensors").write_bytes(b"old but complete")
    before = tree_state(tmp_path)
    _interrupt_on_write(monkeypatch, KeyboardInterrupt())
    r = convert(src, dst, "--overwrite")
    assert_clean_failure(r, 130, "error: interrupted")
    assert outside_work_folders(tree_state(tmp_path)) == outside_work_folders(before)


# -- signals to a real process ------------------------------------------------------------------------
PARK_HOOK = textwrap.dedent(
    """
    # Test hook (tests/hostile/test_faults.py): log every tensor write and park the run after
    # write number QUANTIZE_TEST_PARK_AT, so a signal lands at a known point. Inert unless set.
    import os, time
    if os.environ.get("QUANTIZE_TEST_PROGRESS"):
        import quantize_cli.checkpoint.writer as _w
        _orig = _w.ShardWriter.write_bytes
        _park = int(os.environ.get("QUANTIZE_TEST_PARK_AT", "0"))
        _count = [0]
        def _logged(self, *a, **k):
            _orig(self, *a, **k)
            _count[0] += 1
            with open(os.environ["QUANTIZE_TEST_PROGRESS"], "a") as f:
                f.write(".")
            if _count[0] == _park:
                time.sleep(120)
        _w.ShardWriter.write_bytes = _logged
    """
)


def _reset_sigint():  # a background job may inherit SIGINT ignored; a terminal user's run does not
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_parked_convert(tmp_path, src, dst, park_at: int, *extra):
    """``python -m quantize_cli convert`` in a subprocess that parks after tensor write `park_at`."""
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir(exist_ok=True)
    (hook_dir / "sitecustomize.py").write_text(PARK_HOOK)
    progress = tmp_path / "progress.log"
    if progress.exists():
        progress.unlink()
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join([str(hook_dir), REPO]), QUANTIZE_TEST_PROGRESS=str(progress),
               QUANTIZE_TEST_PARK_AT=str(park_at))
    cmd = [sys.executable, "-m", "quantize_cli", "convert", str(src), "-o", str(dst), "--algo", "FP8_PB_WO", "-q", *extra]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(tmp_path),
                            preexec_fn=_reset_sigint)
    return proc, progress


def wait_progress(proc, progress, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if progress.exists() and len(progress.read_text()) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early (rc {proc.returncode}): {proc.stderr.read().decode()}")
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("the run never got going")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` has used so far, all its threads (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop_limit_s(quiet_s: float = 5.0) -> float:
    """The wall-clock limit for stopping: `quiet_s` on a machine with a CPU per runnable task, scaled
    by the load (1-minute load average per CPU) on a loaded one, and always under half the 120 s
    park, so a run that waits for the parked write still fails. (5.7 s was once seen at load ~8 per
    CPU: the limit measured wall time that the machine, not the code, decided.)"""
    per_cpu = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(60.0, quiet_s * max(1.0, per_cpu))


STOP_CPU_S = 2.5  # CPU the stopping process may spend after the signal, loaded machine or not (measured 0.3-0.6 s)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_a_running_conversion_cleanly(tmp_path, src, sig):
    """Stops at once: the CPU spent after the signal is small whatever the load (nothing more is
    converted), and the wall time is under the load-scaled limit (nothing waits for the parked write)."""
    dst = tmp_path / "out"
    proc, progress = start_parked_convert(tmp_path, src, dst, park_at=3)
    wait_progress(proc, progress, 3)
    cpu_before = _cpu_seconds(proc.pid)
    limit = stop_limit_s()
    sent = time.monotonic()
    proc.send_signal(sig)
    deadline, usage = sent + 100, None
    while time.monotonic() < deadline:  # reaped here (not by Popen), to read the CPU it used
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.01)
    stopped_in = time.monotonic() - sent
    if proc.returncode is None:
        proc.kill()
        proc.wait()
        raise AssertionError(f"still running {stopped_in:.0f} s after the signal")
    err = proc.stderr.read().decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("warning: ")]
    assert lines == ["error: interrupted; no finished output was written"], err
    cpu_after = usage.ru_utime + usage.ru_stime - cpu_before
    assert cpu_after < STOP_CPU_S, f"spent {cpu_after:.1f} s of CPU stopping"
    assert stopped_in < limit, f"took {stopped_in:.1f} s to stop (limit {limit:.1f} s at load {os.getloadavg()[0]:.1f})"
    assert_no_finished_dst(dst)


# -- two runs, one DST ------------------------------------------------------------------------------
def test_second_run_on_a_locked_destination_is_refused(tmp_path, src):
    """Another run holds DST's lock (simulated by this test process): refuse, and leave its work alone."""
    partial = tmp_path / ".out.partial"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"the other run's work")
    fd = os.open(tmp_path / ".out.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        before = tree_state(tmp_path)
        r = convert(src, tmp_path / "out")
        assert_clean_failure(r, 1, "another quantize run is writing it", ".out.lock", "choose another -o")
        assert tree_state(tmp_path) == before  # the other run's work folder survives
    finally:
        os.close(fd)
    r = convert(src, tmp_path / "out")  # lock released: the stale folder is cleared and reused
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "model.safetensors").read_bytes() != b"the other run's work"
    assert partials(tmp_path) == [] and not (tmp_path / ".out.lock").exists()


def test_stale_work_folder_from_a_killed_run_is_cleared(tmp_path, src):
    partial = tmp_path / ".out.partial"
    partial.mkdir()
    (partial / LOCK_NAME).write_text("12345\n")  # an older version's lock inside the folder
    (tmp_path / ".out.lock").write_text("12345\n")  # its process is gone: flock is free
    (partial / "junk.safetensors").write_bytes(b"half")
    r = convert(src, tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "junk.safetensors" not in os.listdir(tmp_path / "out") and LOCK_NAME not in os.listdir(tmp_path / "out")
    assert not (tmp_path / ".out.lock").exists()


def test_work_folder_that_is_a_link_is_refused(tmp_path, src):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("keep")
    os.symlink(elsewhere, tmp_path / ".out.partial")
    before = tree_state(tmp_path)
    r = convert(src, tmp_path / "out")
    assert_clean_failure(r, 1, ".out.partial", "not a work folder")
    assert tree_state(tmp_path) == before


# -- the signal helpers themselves -------------------------------------------------------------------
def test_sigterm_and_sighup_raise_terminated_and_handlers_are_restored(default_stop_handlers):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(Terminated):
            stop_on_signals(lambda sig=sig: (signal.raise_signal(sig), time.sleep(1)))()
    with pytest.raises(KeyboardInterrupt):
        stop_on_signals(lambda: (signal.raise_signal(signal.SIGINT), time.sleep(1)))()
    assert {s: signal.getsignal(s) for s in before} == before


def test_deferred_holds_a_signal_until_the_block_ends(default_stop_handlers):
    events = []

    def body():
        with deferred():
            signal.raise_signal(signal.SIGTERM)
            events.append("block finished")
        events.append("after")  # never reached: the held signal lands when the block ends

    with pytest.raises(Terminated):
        stop_on_signals(body)()
    assert events == ["block finished"]


def test_second_signal_exits_at_once(monkeypatch):
    """The first signal raises (cleanup runs); a second one during cleanup exits immediately."""
    import quantize_cli.signals as signals

    exits, said = [], []

    class FakeOs:  # stands in for os inside signals.py only
        @staticmethod
        def _exit(code):
            exits.append(code)

        @staticmethod
        def write(fd, data):
            said.append(data)
            return len(data)

    monkeypatch.setattr(signals, "os", FakeOs)
    handler = signals._Handler()
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGINT, None)
    handler(signal.SIGTERM, None)
    assert exits == [130] and b"interrupted again" in said[0]


def test_ignored_signal_stays_ignored():
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert stop_on_signals(lambda: (signal.raise_signal(signal.SIGHUP), "ran")[1])() == "ran"
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)


# -- SIGKILL at random points, then --resume ------------------------------------------------------------
def test_sigkill_then_resume_gives_byte_identical_output(tmp_path, src, monkeypatch):
    """Kill a run (SIGKILL: no cleanup at all) after the first, a middle and the last tensor write;
    ``--resume`` must then finish with exactly the bytes of an uninterrupted run."""
    ref = tmp_path / "ref"
    calls = [0]
    original = ShardWriter.write_bytes

    def counting(self, *a, **k):
        calls[0] += 1
        return original(self, *a, **k)

    monkeypatch.setattr(ShardWriter, "write_bytes", counting)
    assert convert(src, ref).exit_code == 0
    monkeypatch.setattr(ShardWriter, "write_bytes", original)
    total = calls[0]
    expected = {f: (ref / f).read_bytes() for f in sorted(os.listdir(ref))}
    for n in sorted({1, total // 2, total}):
        dst = tmp_path / f"out-{n}"
        proc, progress = start_parked_convert(tmp_path, src, dst, park_at=n)
        wait_progress(proc, progress, n)
        proc.kill()  # SIGKILL
        proc.communicate(timeout=20)
        assert not dst.exists(), "a killed run must not leave a finished-looking DST"
        r = convert(src, dst, "--resume")
        assert r.exit_code == 0, r.output
        got = {f: (dst / f).read_bytes() for f in sorted(os.listdir(dst))}
        assert sorted(got) == sorted(expected), f"killed after write {n}"
        for f, data in output_files(ref).items():  # not the card nor the bookkeeping: they name their own DST
            assert got[f] == data, f"{f} differs after a kill at write {n} and --resume"
        assert partials(tmp_path) == []


def test_disk_full_report_too_keeps_the_one_line_error(tmp_path, src, monkeypatch):
    """The disk fills up mid-write and the --report JSON cannot be written either (seen for real: a
    second OSError traceback replaced the error): the write failure stays the one error, the report
    is a warning, exit 1."""
    import quantize_cli.convert as convert_mod

    monkeypatch.setattr(writer_mod, "os", _FullDiskOs(1))
    def full(path, doc):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(convert_mod, "write_json", full)
    report = tmp_path / "report.json"
    r = convert(src, tmp_path / "out", "--report", str(report))
    assert_clean_failure(r, 1, "model.safetensors", "write failed", "No space left on device")
    assert f"--report {report}: not written (No space left on device)" in r.output
    assert not report.exists()
    assert_no_finished_dst(tmp_path / "out")
