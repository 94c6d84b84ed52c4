"""Start the disk before the heavy imports: page-cache read-ahead of a local source.

A whole ``quantize convert`` spends its first seconds importing torch, creating the CUDA context
and loading the Triton kernels, while the disk sits idle. The plan needs only headers, and the
reads follow the shard order, so the first bytes the converter will read are known before torch
is imported. This module (standard library only, so it costs nothing to import) asks the kernel
to read them into the page cache in the background (``posix_fadvise(WILLNEED)``), bounded by a
byte cap so that a huge model does not evict what it will need later. It changes no output byte:
it only warms the cache, and every error is ignored (the real reads report problems).
"""

from __future__ import annotations

import json
import os
import stat
import threading

CHUNK = 64 << 20  # bytes per fadvise call: the thread yields between calls
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


def _advise(paths: list[str], cap: int) -> None:
    left = cap
    for path in paths:
        try:  # regular files only (a FIFO would block the open), never blocking, any odd name ignored
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except (OSError, ValueError):
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue
            size = st.st_size
            pos = 0
            while pos < size and left > 0:
                n = min(CHUNK, size - pos, left)
                os.posix_fadvise(fd, pos, n, os.POSIX_FADV_WILLNEED)
                pos += n
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
    None when there is nothing to do (a Hub id, an example, no fadvise on this platform).
    """
    if not hasattr(os, "posix_fadvise") or not os.path.isdir(src):
        return None
    avail = _available_bytes()
    cap = min(cap, avail // 4) if avail else cap
    paths = source_files(src)
    if cap <= 0 or not paths:
        return None
    thread = threading.Thread(target=_advise, args=(paths, cap), daemon=True, name="quantize-warmup")
    thread.start()
    return thread
