"""Start the disk before the heavy imports: read a local source ahead into the page cache.

A whole ``quantize convert`` spends its first seconds importing torch, creating the CUDA context
and loading the Triton kernels, while the disk sits idle. The plan needs only headers, and the
reads follow the shard order, so the first bytes the converter will read are known before torch
is imported. This module (standard library only, so it costs nothing to import) reads them on a
background thread into one reusable buffer, which leaves them in the page cache, bounded by a byte
cap so that a huge model does not evict what it will need later. It changes no output byte: it
only warms the cache, and every error is ignored (the real reads report problems).

Why reads and not ``posix_fadvise(WILLNEED)``: Linux caps each WILLNEED (and ``readahead(2)``)
call at the device's read-ahead window (128 KB to a few MB), so one call per 64 MB warmed almost
nothing: measured on the GPU machine, the converter's own reads took as long as without it.
"""

from __future__ import annotations

import json
import os
import stat
import threading

CHUNK = 8 << 20  # bytes per read into the scratch buffer (the GIL is released during each read)
DEFAULT_CAP = 8 << 30  # bytes: about what a 1.5 GB/s disk reads during a 5 s start-up


def source_files(src: str) -> list[str]:
    """The safetensors shards of local folder `src` in the order the converter reads them."""
    index = os.path.join(src, "model.safetensors.index.json")
    try:
        with open(index) as f:
            names = list(dict.fromkeys(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        names = [n for n in os.listdir(src) if n.endswith(".safetensors")]
    # The source reader opens shards in sorted name order and the plan reads in that order.
    names = sorted(n for n in names if isinstance(n, str) and "/" not in n and n not in ("", ".", ".."))
    return [os.path.join(src, n) for n in names]


def _available_bytes() -> int:
    """MemAvailable from /proc/meminfo, or 0 when it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _warm(paths: list[str], cap: int) -> None:
    """Read up to `cap` bytes of `paths` in order into a scratch buffer (the page cache keeps them)."""
    left = cap
    buf = bytearray(CHUNK)
    for path in paths:
        try:  # regular files only (a FIFO would block the open), never blocking, any odd name ignored
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except (OSError, ValueError):
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # a larger kernel read-ahead window
            while left > 0:
                n = os.readv(fd, [memoryview(buf)[: min(CHUNK, left)]])
                if n <= 0:
                    break
                left -= n
        except OSError:
            pass
        finally:
            os.close(fd)
        if left <= 0:
            return


def prefetch_source(src: str, cap: int = DEFAULT_CAP) -> threading.Thread | None:
    """Warm the page cache with up to `cap` bytes of local checkpoint `src` on a daemon thread.

    At most a quarter of the available memory is used. Returns the thread (tests join it), or
    None when there is nothing to do (a Hub id, an example).
    """
    if not os.path.isdir(src):
        return None
    avail = _available_bytes()
    cap = min(cap, avail // 4) if avail else cap
    paths = source_files(src)
    if cap <= 0 or not paths:
        return None
    thread = threading.Thread(target=_warm, args=(paths, cap), daemon=True, name="quantize-warmup")
    thread.start()
    return thread
