"""Resume: continue an interrupted conversion from what is complete and verified.

The work folder keeps two small files beside the shards:

- ``.quantize-state.json``: a fingerprint of everything that decides the output bytes (converter
  version, algorithm, KV and layout options, the planned output layout, and the identity of every
  source shard: size, mtime and a hash of its header). Resuming with other options or a changed
  source is refused.
- ``.quantize-journal``: one line ``<task index> <crc32>`` appended after each task's bytes are
  written. On ``--resume`` every journaled task is *verified* by re-reading its output bytes and
  comparing the CRC; only verified tasks are skipped, everything else is redone. Shards are written
  at fixed offsets, so redoing a task rewrites exactly its bytes: the result equals an
  uninterrupted run byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import zlib

from . import __version__
from .checkpoint.safetensors_io import TensorInfo
from .errors import DestinationError

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
        "options": {k: options.get(k) for k in ("algo", "kv_cache_dtype", "layout", "algo_for")},
        "outputs": [(o.name, o.dtype, list(o.shape), o.shard, o.offset) for o in plan.outputs.values()],
        "shards": plan.shard_names,
        "source": {os.path.basename(p): _shard_identity(p) for p in paths},
        "source_label": plan.source.root or plan.source.label,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def start(folder: str, fp: str) -> "Journal":
    """A fresh run: record the fingerprint, start an empty journal."""
    with open(os.path.join(folder, STATE), "w") as f:
        json.dump({"fingerprint": fp, "converter": __version__}, f)
    return Journal(folder, truncate=True)


def resume(folder: str, fp: str, plan, task_outputs, writer) -> tuple[set[int], "Journal"]:
    """Check the fingerprint and return the verified completed task indices and the journal."""
    try:
        with open(os.path.join(folder, STATE)) as f:
            state = json.load(f)
    except (OSError, ValueError):
        state = {}
    if state.get("fingerprint") != fp:
        raise DestinationError(
            f"{folder}: the earlier run used other options or another source (fingerprint differs); "
            f"rerun without --resume to start over"
        )
    claimed = {}
    try:
        with open(os.path.join(folder, JOURNAL)) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[0].isdigit():
                    claimed[int(parts[0])] = parts[1]
    except FileNotFoundError:
        pass
    done = {i for i, crc in claimed.items() if i < len(plan.tasks) and _crc_on_disk(writer, task_outputs(plan.tasks[i])) == crc}
    journal = Journal(folder, truncate=True)
    for i in sorted(done):  # rewrite the journal with the verified tasks only
        journal.append(i, claimed[i])
    return done, journal


def _crc_on_disk(writer, names: list[str]) -> str:
    """The task CRC (as AsyncWriter computes it) of the bytes now in the output files."""
    parts = []
    for name in sorted(names):
        o = writer.outputs[name]
        path = writer.paths()[o.shard]
        crc, pos, left = 0, writer.data_start(o.shard) + o.offset, o.nbytes
        with open(path, "rb") as f:
            f.seek(pos)
            while left:
                block = f.read(min(left, 64 << 20))
                if not block:
                    return "missing"
                crc = zlib.crc32(block, crc)
                left -= len(block)
        parts.append(f"{name}:{crc:08x}")
    return f"{zlib.crc32(';'.join(parts).encode()):08x}"


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
    """Drop the resume bookkeeping once the output is complete."""
    for name in (STATE, JOURNAL):
        try:
            os.unlink(os.path.join(folder, name))
        except FileNotFoundError:
            pass


__all__ = ["fingerprint", "start", "resume", "remove_files", "TensorInfo"]
