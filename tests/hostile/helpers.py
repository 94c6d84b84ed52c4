"""Shared tools for the hostile-input tests: synthetic checkpoints, header surgery, CLI runs that
must fail cleanly, and snapshots proving that no file was created, changed or removed."""

from __future__ import annotations

import hashlib
import json
import os
import struct

from click.testing import CliRunner

from quantize_cli.cli import main
from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors, write_checkpoint

# Small enough to convert in a fraction of a second, every Linear dim a multiple of 128 (FP8_PB_WO).
CFG = llama_config(hidden=128, intermediate=256, layers=1, heads=2, kv_heads=2, vocab=256)
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"


def tensors(seed: int = 0):
    return llama_tensors(CFG, seed=seed)


def make_src(path, shards: int = 2, tensors_=None, config=None, seed: int = 0) -> str:
    """A valid bf16 Llama checkpoint at `path` (2 shards + index by default)."""
    return write_checkpoint(str(path), tensors_ if tensors_ is not None else tensors(seed), config or CFG, shards=shards)


def invoke(*args, env=None):
    """Run the CLI in-process; stderr and stdout are kept apart."""
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def convert(src, dst, *extra, algo="FP8_PB_WO", env=None):
    return invoke("convert", src, "-o", dst, "--algo", algo, "-q", *extra, env=env)


# -- header surgery --------------------------------------------------------------------------------
def split_file(path) -> tuple[dict, bytes]:
    """(header JSON as a dict, data section bytes) of a safetensors file."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def pack(header: dict | bytes | str, data: bytes = b"") -> bytes:
    """A safetensors file from a header (dict -> compact JSON; str/bytes used verbatim) and data."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode("utf-8")
    return struct.pack("<Q", len(header)) + header + data


def rewrite(path, mutate) -> None:
    """Apply ``mutate(header_dict)`` (in place, or returning a replacement header) to a file."""
    header, data = split_file(path)
    out = mutate(header)
    open(path, "wb").write(pack(out if out is not None else header, data))


def first_tensor(header: dict) -> str:
    return next(k for k in header if k != "__metadata__")


# -- outcomes --------------------------------------------------------------------------------------
def tree_state(root) -> dict:
    """Every entry under `root`: relative path -> (kind, size, mtime_ns, sha256 | link target)."""
    state = {}
    root = str(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if os.path.islink(path):
                state[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                state[rel] = ("dir",)
            elif os.path.isfile(path):
                state[rel] = ("file", st.st_size, st.st_mtime_ns, hashlib.sha256(open(path, "rb").read()).hexdigest())
            else:
                state[rel] = ("other", st.st_mode)
    return state


def outside_work_folders(state: dict) -> dict:
    """`state` without the hidden work folders (``.NAME.partial``): a failed run may keep one
    for ``--resume``; it never looks like a finished DST."""
    return {k: v for k, v in state.items() if not k.split(os.sep)[0].endswith(".partial")}


def assert_no_finished_dst(dst) -> None:
    """DST does not exist; any work folder left beside it is hidden and holds no finished marker."""
    dst = str(dst)
    assert not os.path.lexists(dst), f"{dst} exists after a failed run"
    partial = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.partial")
    if os.path.isdir(partial):
        assert os.path.basename(partial).startswith(".")


def assert_clean_failure(result, code: int = 1, *fragments: str) -> str:
    """Exit `code`, a single ``error: ...`` line (detail lines ``  - `` allowed), no traceback,
    each of `fragments` in that line (or its details). Returns the error line."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    err = result.stderr
    assert "Traceback" not in result.output and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if not ln.startswith("warning: ")]
    assert lines and lines[0].startswith("error: "), err
    assert all(ln.startswith("  ") for ln in lines[1:]), f"more than one message line: {err!r}"
    text = "\n".join(lines)
    if os.environ.get("HOSTILE_SHOW"):  # print the messages (used to write docs/robustness.md)
        print(f"\n[exit {result.exit_code}] {text}")
    for frag in fragments:
        assert frag in text, f"{frag!r} not in {text!r}"
    return lines[0]


def assert_refused(tmp_path, src, *fragments, code: int = 1, algo: str = "FP8_PB_WO", dst=None, extra=()):
    """Convert must fail cleanly naming `fragments`, leave no DST (nor work folder) and touch nothing."""
    dst = dst or os.path.join(str(tmp_path), "out")
    before = tree_state(tmp_path)
    result = convert(src, dst, *extra, algo=algo)
    line = assert_clean_failure(result, code, *fragments)
    after = tree_state(tmp_path)
    assert after == before, f"files changed: {sorted(set(after.items()) ^ set(before.items()))}"
    return line


def interrupt_after_tasks(monkeypatch, n: int):
    """Raise KeyboardInterrupt (what Ctrl-C / SIGTERM become) when the writer reaches the n-th finished
    task; returns a function that puts the real writer back (for the resumed run)."""
    import quantize_cli.run.pipeline as pipeline

    real = pipeline.AsyncWriter._do
    count = [0]

    def do(self, item):
        if item[0] == "task":
            count[0] += 1
            if count[0] == n:
                raise KeyboardInterrupt
        return real(self, item)

    monkeypatch.setattr(pipeline.AsyncWriter, "_do", do)
    return lambda: monkeypatch.setattr(pipeline.AsyncWriter, "_do", real)


def kill_once_journaled(code: str, argv: list[str], journal, at_least: int, cwd: str, timeout: float = 180) -> list[str]:
    """Run ``python -c code *argv`` (a convert whose journal grows slowly), SIGKILL it once `journal`
    holds `at_least` lines (some tasks done, not all) and return the journal's lines then."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", code, *argv], cwd=cwd, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.exists() and len(journal.read_text().splitlines()) >= at_least:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return journal.read_text().splitlines()


def spy_fsync_before_publish(monkeypatch) -> list[set[str]]:
    """Record which files were fsynced (by name; temporaries written as NAME.tmp-PID count as NAME)
    each time a work folder (``*.partial``) is renamed into place. Returns the list it fills: one set
    per rename."""
    import quantize_cli.output.destination as dmod

    synced: set[str] = set()
    at_rename: list[set[str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        try:
            synced.add(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).split(".tmp-")[0])
        except OSError:
            pass
        return real_fsync(fd)

    def rename(a, b):
        if str(a).endswith(".partial"):
            at_rename.append(set(synced))
        return real_rename(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(dmod.os, "rename", rename)
    return at_rename
