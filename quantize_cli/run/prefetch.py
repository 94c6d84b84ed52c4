"""Warm the page cache with the source's first bytes while the process starts.

A fresh ``quantize convert`` spends seconds importing torch with its CUDA libraries (6 s cold on
the GPU machine, docs/performance.md) before the first byte of the checkpoint is read; on a cold
page cache the disk sits idle meanwhile. ``convert`` starts this before the heavy imports (this
module imports no torch): a daemon thread asks the kernel to read the source
shards ahead (``posix_fadvise(WILLNEED)``, in the read order of the plan: shard by shard, offset
0 up), 64 MB at a time, until the conversion's own reads start (:func:`stop`) or a cap is
reached. The pages land in the page cache, not in this process: RSS and ``--memory-budget`` are
untouched, and a warm source costs nothing (the advice finds its pages present).

The cap keeps the warm-up from evicting what it warmed before the reader gets there: a quarter of
the memory the kernel reports available. Only local folders are warmed (a Hub id is resolved
later, by the library); nothing here raises: any failure just means no warm-up.
"""

from __future__ import annotations

import glob
import json
import os
import threading

CHUNK = 64 << 20

_active: list["Warmup"] = []


class Warmup:
    """One warm-up thread over `files` (read in this order), at most `cap` bytes."""

    def __init__(self, files: list[str], cap: int):
        self.files = files
        self.cap = cap
        self.advised = 0  # bytes handed to the kernel so far
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="quantize-warmup", daemon=True)

    def start(self) -> "Warmup":
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop advising (what is already in flight completes); the bytes advised."""
        self._stop.set()
        return self.advised

    def _run(self) -> None:
        for path in self.files:
            try:
                fd = os.open(path, os.O_RDONLY)
            except (OSError, ValueError):  # ValueError: a hostile index names "a\0b"
                continue
            try:
                size = os.fstat(fd).st_size
                for off in range(0, size, CHUNK):
                    n = min(CHUNK, size - off, self.cap - self.advised)
                    if n <= 0 or self._stop.is_set():
                        return
                    # Blocks while the device queue is full, so the thread keeps pace with the disk
                    # and stop() takes effect within one chunk.
                    os.posix_fadvise(fd, off, n, os.POSIX_FADV_WILLNEED)
                    self.advised += n
            except OSError:
                return
            finally:
                os.close(fd)


def shards(src: str) -> list[str]:
    """The shards of local folder `src` the plan reads, in its read order (file name order): those
    its index names when it has one (a stray ``consolidated.safetensors`` beside them is never
    read, so it must not be warmed), else every ``.safetensors`` file. [] where unsure."""
    from ..checkpoint.source import INDEX_NAME  # torch-free, as is everything here

    if not os.path.isdir(src):
        return []
    index = os.path.join(src, INDEX_NAME)
    if not os.path.exists(index):
        return sorted(glob.glob(os.path.join(glob.escape(src), "*.safetensors")))
    try:
        with open(index, encoding="utf-8") as f:
            names = set(json.load(f)["weight_map"].values())
        return [os.path.join(src, n) for n in sorted(names) if isinstance(n, str) and os.sep not in n]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []  # a broken index: the plan refuses it with its own message


def available_memory() -> int:
    """``MemAvailable`` from /proc/meminfo in bytes (0 where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def start(src: str) -> Warmup | None:
    """Warm the first bytes of local checkpoint folder `src` in the background (None: nothing to do)."""
    if not hasattr(os, "posix_fadvise"):
        return None
    files = shards(src)
    cap = available_memory() // 4
    if not files or cap <= 0:
        return None
    warm = Warmup(files, cap).start()
    _active.append(warm)
    return warm


def stop() -> int:
    """Stop every warm-up of this process (the conversion's reads begin); bytes advised in all."""
    advised = sum(w.stop() for w in _active)
    _active.clear()
    return advised


__all__ = ["Warmup", "start", "stop", "shards", "available_memory", "CHUNK"]
