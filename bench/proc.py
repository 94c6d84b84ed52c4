"""Subprocesses for the benchmarks: every one with a timeout, and nothing left running after it.

``subprocess.run(timeout=...)`` kills only the direct child: a shell's ``cat || dd``, a wrapper's
``quantize convert`` or a Ray head's workers would go on. :func:`run` starts the command in its own
process group and kills the whole group when the time is up (or on Ctrl-C), then raises
``subprocess.TimeoutExpired`` naming the command. :func:`start` is the same for a long-lived child
(a Ray head) whose output goes to a file, never to a pipe nobody reads (a full pipe blocks it).
"""

from __future__ import annotations

import os
import signal
import subprocess

TIMEOUT_S = 1800  # the default for one benchmark command (a whole conversion of a large input)


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(cmd, timeout: float = TIMEOUT_S, check: bool = False, **kw) -> subprocess.CompletedProcess:
    """``subprocess.run`` with `timeout` enforced on the command's whole process group."""
    if kw.pop("capture_output", False):
        kw.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with subprocess.Popen(cmd, start_new_session=True, **kw) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except BaseException:  # the timeout, or Ctrl-C: the command's whole group goes
            _kill_group(p)
            p.communicate()
            raise
        rc = p.poll()
    if check and rc:
        raise subprocess.CalledProcessError(rc, cmd, out, err)
    return subprocess.CompletedProcess(cmd, rc, out, err)


def start(cmd, log: str, **kw) -> subprocess.Popen:
    """A long-lived child in its own process group, its output appended to `log`."""
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, start_new_session=True, stdout=f, stderr=subprocess.STDOUT, **kw)


def stop(p: subprocess.Popen, timeout: float = 60) -> None:
    """SIGINT to the child (it cleans up), then its whole group is killed after `timeout` s."""
    try:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        _kill_group(p)
        p.wait()


__all__ = ["run", "start", "stop", "result", "TIMEOUT_S"]


def result(cmd, what: str, timeout: float = TIMEOUT_S, **kw) -> dict:
    """Run a child that prints one ``RESULT {json}`` line; its dict, or exit naming `what` with the
    end of its stderr."""
    import json
    import sys

    out = run(cmd, timeout=timeout, capture_output=True, text=True, **kw)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        sys.exit(f"{what} failed:\n{out.stderr[-4000:]}")
    return json.loads(line[len("RESULT "):])

