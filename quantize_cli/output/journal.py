"""The journal: which tasks' bytes are in the output files, and their digests.

One line per task, ``<task index> <digest>`` (xxh3-64 over the task's output tensors,
``run/checksum.py``), appended once all of the task's bytes are written, by every executor alike
(the local one from its writer thread; Ray's driver once every shard task holding a part of the
task has returned). On ``--resume`` each journaled task is *verified*: its bytes are read back
and digested again, and only tasks whose digest matches are skipped. Shards are written at fixed
offsets, so redoing a task rewrites exactly its bytes: the result equals an uninterrupted run.

A finished output keeps the digests in its seal (``workfolder.CHECKSUMS``); the same
:func:`task_digest_on_disk` checks them on a ``--resume`` of a finished DST.
"""

from __future__ import annotations

import os
import threading

from ..checkpoint.safetensors_header import shard_header
from ..run import checksum

JOURNAL = ".quantize-journal"


def read_journal(path: str) -> dict[int, str]:
    """``{task index: digest}`` from a journal file (malformed lines, e.g. a torn last one, are skipped)."""
    claimed = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[0].isdigit():
                    claimed[int(parts[0])] = parts[1]
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        pass
    return claimed


class Journal:
    """Append-only ``<task> <digest>`` lines (thread-safe: the local executor's write lanes and copy-ahead threads call it)."""

    def __init__(self, folder: str, truncate: bool):
        self._f = open(os.path.join(folder, JOURNAL), "w" if truncate else "a")
        self._lock = threading.Lock()

    def append(self, index: int, digest: str) -> None:
        with self._lock:
            self._f.write(f"{index} {digest}\n")
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.close()


class ShardLayout:
    """Where each planned output tensor's bytes start in the files of `folder` (headers from the plan)."""

    def __init__(self, folder: str, plan):
        self.outputs = plan.outputs
        self.paths = [os.path.join(folder, n) for n in plan.shard_names]
        per_shard: list[list] = [[] for _ in plan.shard_names]
        for o in sorted(plan.outputs.values(), key=lambda o: o.offset):
            per_shard[o.shard].append(o)
        self.headers = [shard_header(tensors) for tensors in per_shard]
        self.sizes = [len(h) + sum(t.nbytes for t in tensors) for h, tensors in zip(self.headers, per_shard)]

    def shard_problem(self, shard: int) -> str | None:
        """Why shard `shard` is not the planned file (missing, short or another header), or None."""
        try:
            with open(self.paths[shard], "rb") as f:
                if os.fstat(f.fileno()).st_size != self.sizes[shard]:
                    return "has another size than planned"
                if f.read(len(self.headers[shard])) != self.headers[shard]:
                    return "has another header than planned"
        except OSError:
            return "is missing or unreadable"
        return None

    def task_digest_on_disk(self, names) -> str:
        """The task digest (as the writer computes it) of the bytes now in the files, or ``"missing"``."""
        parts = {}
        for name in names:
            o = self.outputs[name]
            try:
                digest = checksum.file_range(self.paths[o.shard], len(self.headers[o.shard]) + o.offset, o.nbytes)
            except OSError:  # the shard is gone (or unreadable): the task is redone
                digest = None
            if digest is None:
                return "missing"
            parts[name] = digest
        return checksum.task_digest(parts)


def verified_tasks(layout: ShardLayout, plan, claimed: dict[int, str]) -> set[int]:
    """The journaled tasks whose bytes on disk still give their digest (the rest are redone)."""
    return {i for i, digest in claimed.items()
            if i < len(plan.tasks) and layout.task_digest_on_disk(plan.tasks[i].outputs) == digest}


__all__ = ["JOURNAL", "Journal", "read_journal", "ShardLayout", "verified_tasks"]
