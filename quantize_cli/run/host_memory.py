"""--memory-budget counts the whole process, not only the bytes in flight.

A converting process holds a baseline before it moves a byte: torch and its libraries, and on a
GPU the CUDA context and the Triton kernels (0.63-0.70 GB RSS on the GPU machine once warm,
docs/performance.md "Memory"). The executor's byte budgets bound only what is in flight, so the
baseline is measured once the device is warm (less the buffers already read into, which are in
flight: :func:`held_in_flight`) and taken off the budget: in flight = budget -
baseline, never under a floor (a budget smaller than the baseline cannot be met; the run says so
and goes on with the floor). Pinned buffers come from torch's caching host allocator, whose pool
is kept within the in-flight limit by :class:`PinnedPool`.
"""

from __future__ import annotations

import os

MIN_INFLIGHT = 256 << 20  # in-flight floor: below it reads and writes stop overlapping usefully
# What creating the CUDA context (with the Triton kernels) adds to the RSS of a process that has
# imported torch: measured ~0.15-0.2 GB on the GPU machine (0.52 GB after `import torch`, 0.63-0.70
# GB once warm; bench/rss_probe.py), rounded up. Counted until the context exists and the real
# baseline is measured, because reads start at once and would otherwise fill what it takes.
CUDA_CONTEXT_ESTIMATE = 512 << 20


# torch's pinned host allocator pins each new block with cudaHostAlloc, one block at a time: on the
# GPU machine pinning the 4 GB a default --memory-budget keeps in flight took ~2 s of the first
# task (the read threads and the compute thread queue on the driver), and unpinning it at exit
# 0.9 s. Allocating plain memory and registering it with CUDA from several threads (torch's own
# settings, docs "CUDA semantics: memory management") took 0.4 s and 0.5 s (bench/teardown.py).
PINNED_REGISTER_THREADS = 8  # at most; torch takes a power of two


def configure_pinned_allocator(environ=None) -> str | None:
    """Ask torch's pinned host allocator to register plain memory from several threads
    (``pinned_use_cuda_host_register``, ``pinned_num_register_threads``), before torch is imported
    by this process: the CLI's and the Ray workers' (processes of ours, never a library caller's).

    Each setting the user has not given is added to ``PYTORCH_ALLOC_CONF`` when it is set (torch
    reads it first), else to ``PYTORCH_CUDA_ALLOC_CONF``; a value the user gave is kept. Returns the
    variable written, or None when nothing was added. Bytes are unaffected: only how host memory is
    pinned."""
    environ = os.environ if environ is None else environ
    name = "PYTORCH_ALLOC_CONF" if environ.get("PYTORCH_ALLOC_CONF") else "PYTORCH_CUDA_ALLOC_CONF"
    parts = [p.strip() for p in environ.get(name, "").split(",") if p.strip()]
    given = {p.split(":", 1)[0].strip() for p in parts}
    cap = min(PINNED_REGISTER_THREADS, os.cpu_count() or 1)
    wanted = {"pinned_use_cuda_host_register": "True", "pinned_num_register_threads": str(1 << (cap.bit_length() - 1))}
    missing = [f"{k}:{v}" for k, v in wanted.items() if k not in given]
    if not missing:
        return None
    environ[name] = ",".join(parts + missing)
    return name


def rss_bytes() -> int:
    """This process's resident set size now (0 where /proc is not available)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def startup_baseline(device) -> int:
    """The RSS to count before the device is warm: now, plus :data:`CUDA_CONTEXT_ESTIMATE` when
    `device` is a GPU whose context does not exist yet (created on a start-up thread meanwhile)."""
    pending = 0
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        pending = 0 if torch.cuda.is_initialized() else CUDA_CONTEXT_ESTIMATE
    return rss_bytes() + pending


def warm_baseline(device, in_flight: int = 0, floor: int = 0) -> int:
    """The process's own RSS once `device` is ready to compute: on CUDA the context is created
    first (waiting for the start-up thread of ``run.context.warm_device`` if it is still at it), so
    that it counts. Reads have started by then: what they hold is not baseline
    (:func:`held_in_flight`; `in_flight`: the bytes the read budget has granted). Never below
    `floor`, the RSS before the first read."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        torch.empty(1, device=device)
        torch.cuda.synchronize(device)
    return max(rss_bytes() - held_in_flight(device, in_flight), floor)


def held_in_flight(device, granted: int) -> int:
    """The resident bytes of the buffers in flight. On CUDA every read buffer is pinned and pinned
    pages are resident: torch's pinned pool is the exact figure. The bytes the read budget has
    granted are not: a read granted is allocated (and its pages touched) only when a read thread
    performs it, so subtracting them made the baseline negative on the GPU machine (-0.36 to -1.0
    GB with 2.4 GB granted while the CUDA context started), the in-flight limit larger than the
    budget, and the peak RSS 5.3 GB under a 4 GB budget (docs/performance.md, session 12). On the
    CPU (buffers not pinned) the granted bytes are the estimate, bounded by the caller's floor."""
    if getattr(device, "type", "cpu") == "cuda":
        return _pinned_pool_bytes()
    return granted


def _pinned_pool_bytes() -> int:
    import torch

    return int(torch.cuda.host_memory_stats().get("allocated_bytes.current", 0))


def _empty_host_cache():
    """torch's call that returns the pinned pool's cached (unused) blocks to CUDA, or None."""
    import torch

    for name in ("_accelerator_emptyHostCache", "_host_emptyCache"):  # newer torch, older torch
        fn = getattr(torch._C, name, None)
        if fn is not None:
            return fn
    return None


class PinnedPool:
    """Keeps torch's pinned host pool within the bytes allowed in flight.

    Pinned buffers (reads ahead, device-to-host copies behind) come from torch's host caching
    allocator, which rounds every block up to a power of two and keeps freed blocks for reuse,
    per size. The byte budgets bound the bytes in use, but the pool also keeps every size class
    once needed: measured on the GPU machine, warm, 4.9 GB of pinned pool for 3.3 GB in flight
    (bench/rss_probe.py), which pushed RSS past the budget. :meth:`trim` (before each read,
    after each task) gives the cached blocks back to CUDA when the pool exceeds `limit`, the
    bytes allowed in flight (torch frees only blocks no longer in use).

    Why the limit and not the bytes in flight plus a slack: every block given back must be
    pinned again later, and pinning is slow; trimming down to what is in flight (tried) made the
    reads 1.5x (cold) to 2x (warm) slower on the GPU machine.
    """

    def __init__(self, device, limit: int):
        self.limit = limit
        self.trims = 0
        self._empty = _empty_host_cache() if getattr(device, "type", "cpu") == "cuda" else None

    def trim(self) -> None:
        if self._empty is None:
            return
        # Not torch's "active" bytes: a freed block counts as active until the allocator next
        # processes its stream events, which emptying the cache does first (measured: never trimmed).
        if _pinned_pool_bytes() > self.limit:
            self._empty()
            self.trims += 1


def inflight_limit(budget: int, baseline: int, flag_value: str | int = "") -> tuple[int, str | None]:
    """``(bytes allowed in flight, warning or None)`` for --memory-budget `budget` and a process
    `baseline` RSS. The floor is MIN_INFLIGHT or a quarter of the budget, whichever is smaller."""
    floor = min(MIN_INFLIGHT, max(1, budget // 4))
    limit = budget - baseline
    if limit >= floor:
        return limit, None
    return floor, (f"--memory-budget {flag_value or budget}: this process already holds {baseline / 1e9:.2f} GB before reading "
                   f"(torch{', CUDA' if baseline > 1e9 else ''}); {floor / 1e9:.2f} GB more will be in flight, so peak memory is "
                   f"about {(baseline + floor) / 1e9:.1f} GB; give a budget above {(baseline + floor) / 1e9:.1f} GB to stay within it")


__all__ = ["configure_pinned_allocator", "PINNED_REGISTER_THREADS", "PinnedPool", "rss_bytes", "startup_baseline", "warm_baseline", "held_in_flight", "inflight_limit", "MIN_INFLIGHT", "CUDA_CONTEXT_ESTIMATE"]
