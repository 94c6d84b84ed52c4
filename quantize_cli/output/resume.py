"""Resume: continue an interrupted conversion from what is complete and verified.

The work folder keeps two small files beside the shards:

- ``.quantize-state.json``: a fingerprint of everything that decides the output bytes (converter
  version, algorithm, KV and layout options, the planned output layout, and the identity of every
  source shard: size, mtime and a hash of its header). Resuming with other options or a changed
  source is refused.
- ``.quantize-journal``: one line ``<task index> <digest>`` (xxh3-64, :mod:`.checksum`) appended after each task's bytes are
  written. On ``--resume`` every journaled task is *verified* by re-reading its output bytes and
  comparing the digest; only verified tasks are skipped, everything else is redone. Shards are written
  at fixed offsets, so redoing a task rewrites exactly its bytes: the result equals an
  uninterrupted run byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading

from .. import __version__
from ..run import checksum
from ..checkpoint.durable import write_atomic
from ..checkpoint.safetensors_header import TensorInfo
from ..errors import DestinationError
from ..jsonfile import read_json_or_none

STATE = ".quantize-state.json"
JOURNAL = ".quantize-journal"


def _shard_identity(info_path: str) -> dict:
    st = os.stat(info_path)
    with open(info_path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = f.read(min(n, 100 << 20))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "header_sha256": hashlib.sha256(header).hexdigest()}


def fingerprint(plan, options: dict) -> str:
    """SHA-256 over the options that decide the bytes, the output layout and the source identity."""
    paths = sorted({t.path for t in plan.source.tensors.values() if not t.path.startswith("hub://")})
    doc = {
        "converter": __version__,
        "options": {k: options.get(k) for k in ("algo", "kv_cache_dtype", "layout", "calibration", "scale_search", "algo_for")},
        "outputs": [(o.name, o.dtype, list(o.shape), o.shard, o.offset) for o in plan.outputs.values()],
        "shards": plan.shard_names,
        "source": {os.path.basename(p): _shard_identity(p) for p in paths},
        "source_label": plan.source.root or plan.source.label,
        "source_revision": getattr(plan.source, "revision", None),  # --low-disk: the pinned Hub commit
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def start(folder: str, fp: str) -> "Journal":
    """A fresh run: record the fingerprint, start an empty journal."""
    write_atomic(os.path.join(folder, STATE), json.dumps({"fingerprint": fp, "converter": __version__}).encode())
    return Journal(folder, truncate=True)


def resume(folder: str, fp: str, plan, task_outputs, writer) -> tuple[set[int], "Journal"]:
    """Check the fingerprint and return the verified completed task indices and the journal."""
    state = read_json_or_none(os.path.join(folder, STATE)) or {}
    if not isinstance(state, dict) or not isinstance(state.get("fingerprint"), str):
        err = DestinationError(f"{folder}: its resume state ({STATE}) is missing or unreadable; rerun without --resume to start over")
    elif state["fingerprint"] != fp:
        err = DestinationError(
            f"{folder}: the earlier run used other options or another source (fingerprint differs); "
            f"rerun with the earlier options, or without --resume to start over"
        )
    else:
        err = None
    if err is not None:
        err.quiet_keep = True  # the folder is kept, but "rerun with --resume" would be the wrong advice
        raise err
    claimed = read_journal(os.path.join(folder, JOURNAL))
    done = {i for i, crc in claimed.items() if i < len(plan.tasks) and _crc_on_disk(writer, task_outputs(plan.tasks[i])) == crc}
    journal = Journal(folder, truncate=True)
    for i in sorted(done):  # rewrite the journal with the verified tasks only
        journal.append(i, claimed[i])
    return done, journal


def read_journal(path: str) -> dict[int, str]:
    """``{task index: crc}`` from a journal file (malformed lines, e.g. a torn last one, are skipped)."""
    claimed = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[0].isdigit():
                    claimed[int(parts[0])] = parts[1]
    except (FileNotFoundError, IsADirectoryError):
        pass
    return claimed


def _crc_on_disk(writer, names: list[str]) -> str:
    """The task digest (as AsyncWriter computes it) of the bytes now in the output files."""
    parts = {}
    for name in names:
        o = writer.outputs[name]
        digest = checksum.file_range(writer.paths()[o.shard], writer.data_start(o.shard) + o.offset, o.nbytes)
        if digest is None:
            return "missing"
        parts[name] = digest
    return checksum.task_digest(parts)


class Journal:
    """Append-only ``<task> <crc>`` lines (thread-safe; called from the writer thread)."""

    def __init__(self, folder: str, truncate: bool):
        self._f = open(os.path.join(folder, JOURNAL), "w" if truncate else "a")
        self._lock = threading.Lock()

    def append(self, index: int, crc: str) -> None:
        with self._lock:
            self._f.write(f"{index} {crc}\n")
            self._f.flush()

    def close(self) -> None:
        self._f.close()


def remove_files(folder: str) -> None:
    """Drop the resume bookkeeping once the output is complete (retry.seal keeps its CRCs first)."""
    for name in (STATE, JOURNAL):
        try:
            os.unlink(os.path.join(folder, name))
        except FileNotFoundError:
            pass


__all__ = ["fingerprint", "start", "resume", "read_journal", "remove_files", "TensorInfo"]
