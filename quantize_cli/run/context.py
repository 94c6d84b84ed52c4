"""What every executor receives besides the plan and the work folder: one small value.

Executors only produce bytes: given the plan, the work folder (``partial``, the tasks already
``done``, ``journal``) and this context, they write every output tensor at its planned offset and
journal each task. Everything before (planning, the identity, the work folder's start) and after
(finishing, verify, the card, the seal, the commit, push) is the output lifecycle's (output/).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Callable


def _quiet(msg: str) -> None:
    pass


@dataclass(frozen=True)
class RunContext:
    """How to execute (never what is written: that is the plan's).

    Attributes:
        device: the local torch device (the Ray driver's ``cpu``); ray_device: the Ray tasks'
            device name (``cpu`` / ``cuda`` / ``auto``), None for the local executor.
        budget: --memory-budget in bytes (the process's whole RSS counts, run/host_memory.py).
        kernels: --kernels (run/kernel_choice.py); measure: error statistics for --report.
        hub: ``(repo_id, revision, low_disk)`` when the workers read a Hub source themselves.
        ray_address: --ray-address. quiet: no progress bar. info / warn: messages for people.
        copied_ahead: copy tasks written while torch loaded (run/copy_ahead.py), in the executor's
            ``done``; their NaN/Inf check is still due (the executor runs it beside its work).
    """

    device: object
    budget: int
    kernels: str = "auto"
    measure: bool = False
    hub: tuple | None = None
    ray_device: str | None = None
    ray_address: str | None = None
    quiet: bool = True
    info: Callable[[str], None] = field(default=_quiet)
    warn: Callable[[str], None] = field(default=_quiet)
    copied_ahead: frozenset = frozenset()


def executor_sizes(budget: int) -> dict:
    """How an executor splits `budget` (--memory-budget): chunk, held-group and in-flight bytes."""
    return dict(chunk_bytes=min(512 << 20, max(64 << 10, budget // 16)), hold_bytes=budget // 5, budget_bytes=budget)


def io_threads(kind: str) -> int:
    """Threads for the host side of one pipeline: ``read`` (concurrent ``preadv`` into pinned
    buffers) or ``write`` (output lanes, each ``pwrite`` + digest). One thread moved page-cache
    bytes at ~2 GB/s on the GPU machine where ``cat`` reaches ~7 GB/s (issue 34); a few in
    parallel reach the memory bus. ``QUANTIZE_IO_THREADS`` overrides both (1: the old serial stages)."""
    forced = os.environ.get("QUANTIZE_IO_THREADS", "")
    if forced.isdigit() and int(forced) > 0:
        return int(forced)
    cpus = os.cpu_count() or 1
    return max(2, min(READ_THREADS if kind == "read" else WRITE_LANES, cpus))


READ_THREADS = 8  # reads in flight at once (each a whole planned read: a row chunk or a 64 MB copy piece)
WRITE_LANES = 4  # output lanes: an output always goes to the same lane, so its digest sees its bytes in order


def warm_device(dev, wait: bool = False) -> None:
    """Create the CUDA context and import the Triton kernels on a daemon thread (`wait`: on this
    one), so that they overlap with planning and the first reads instead of delaying the first
    quantized tensor. (torch's lazy CUDA initialisation is locked, so the executor simply waits if
    it is early.) Nothing for the CPU, nor for a device left unresolved (a dry run)."""
    if getattr(dev, "type", None) != "cuda":
        return

    def warm():
        try:
            import torch

            torch.empty(1, device=dev)
            from .. import kernels  # noqa: F401  (imports Triton)

            triton_version_key()
        except Exception:  # noqa: BLE001 - the executor reports real device errors itself
            pass

    if wait:
        warm()
        return
    threading.Thread(target=warm, daemon=True, name="quantize-cuda-init").start()


__all__ = ["RunContext", "executor_sizes", "warm_device", "triton_version_key", "io_threads"]


def triton_version_key() -> None:
    """Compute Triton's own version key now, on the warm-up thread. Triton hashes its compiler
    sources and the whole ``libtriton`` library (sha256, hundreds of MB) once per process, at the
    first kernel launch: 2.5 s of the compute thread's time in a py-spy profile of a 9 GB
    conversion on the GPU machine (Triton 3.6). The result is cached (``functools.lru_cache``), and
    hashlib releases the GIL, so here it overlaps with the work folder's start and the first reads."""
    with _TRITON_KEY:  # a second caller waits for the first, then finds the result cached
        try:
            from triton.runtime.cache import triton_key
        except Exception:  # noqa: BLE001 - no Triton, or another layout: the first launch pays for it, as before
            return
        triton_key()


_TRITON_KEY = threading.Lock()
