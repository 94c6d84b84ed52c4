"""``--device cuda:0,cuda:1``: several devices in one process, one pipeline per device.

Design note. The alternatives were (a) one read stage shared by per-device compute threads, (b)
one whole pipeline per device, each writing whole output shards, and (c) Ray with one worker per
GPU. (a) kept one reader and one writer thread for all devices, and those two threads (page-cache
copies, digests) were what bounded one GPU's pipeline already (docs/performance.md), so it could not
scale (each pipeline now has a pool of read threads and several write lanes: run/pipeline.py). (b) is what a Ray worker runs, minus Ray: each device gets its own
:class:`~.shard_stream.ShardStream` (read, compute and write threads, pinned buffers, its own
CUDA stream of work), the shards are handed out by the same dispatcher as Ray's (largest first, a
dynamic queue, :mod:`.dispatch`), and the same journal lines come out, so the bytes and a
``--resume`` are those of every executor. It costs no Ray start (seconds) and no second process
importing torch; the threads share one interpreter, but every stage spends its time in code that
releases the GIL (``pread``/``pwrite``, torch kernels, xxh3). (b) it is. ``--memory-budget`` still
counts the whole process: each pipeline takes an equal share of it.
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading

from .context import RunContext, executor_sizes
from .dispatch import dispatch
from .partition import partition
from .stats import merge


class _StreamPool:
    """dispatch.py's view of the per-device pipelines (their futures never report a lost worker)."""

    def __init__(self, streams: list):
        self.streams = streams
        self.workers = list(range(len(streams)))

    def submit(self, w: int, unit, unit_done: frozenset):
        return self.streams[w].submit(unit, unit_done)

    def wait(self, handles: list, timeout: float) -> list:
        return list(concurrent.futures.wait(handles, timeout, return_when=concurrent.futures.FIRST_COMPLETED).done)

    def result(self, handle) -> dict:
        return handle.result()

    def replace(self, w: int) -> None:  # a pipeline is not lost: its errors are the run's
        pass

    def joined(self) -> list:
        return []

    def starting(self) -> int:
        return 0

    def cancel(self, handles: list) -> None:
        for s in self.streams:
            s.abort()

    def tick(self) -> None:
        pass


def produce(plan, work, done: set[int], ctx: RunContext):
    """Write `plan`'s remaining tasks into ``work.partial`` with one pipeline per device of
    ``ctx.device`` (a tuple of torch devices); returns the run's statistics (RunStats)."""
    from tqdm import tqdm

    from .shard_stream import ShardStream

    devices = list(ctx.device)
    bar = tqdm(total=plan.bytes_in, unit="B", unit_scale=True, desc=f"quantize ({len(devices)} devices)",
               disable=ctx.quiet or not sys.stderr.isatty())
    bar.update(sum(plan.tasks[i].bytes_in for i in done))
    lock = threading.Lock()

    def progress(n: int) -> None:
        with lock:
            bar.update(n)

    streams = [ShardStream(plan, work.partial, d, ctx.budget, kernels=ctx.kernels, measure=ctx.measure, hub=ctx.hub,
                           share=len(devices), progress=progress, warn=ctx.warn, where={"device": str(d), "pipeline": k}, budget_warning=k == 0)
               for k, d in enumerate(devices)]
    ahead = executor_sizes(ctx.budget // len(devices))["budget_bytes"] * 3 // 5
    try:
        results = dispatch(_StreamPool(streams), plan, partition(plan), done, work.journal, ahead, ctx.warn)
    except BaseException:
        for s in streams:
            s.abort()
        raise
    finally:
        bar.close()
    parts = [s.close() for s in streams]
    stats = merge(parts)
    stats.peak_inflight = sum(p.peak_inflight for p in parts)  # one process: the pipelines' bytes add up
    stats.devices = {"devices": [str(d) for d in devices],
                     "shards": [{k: r.get(k) for k in ("shard", "device", "pipeline", "bytes_in", "seconds", "skipped", "kept")}
                                for _, r in sorted(results.items())]}
    return stats


__all__ = ["produce"]
