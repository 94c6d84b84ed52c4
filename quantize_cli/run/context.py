"""What every executor receives besides the plan and the work folder: one small value.

Executors only produce bytes: given the plan, the work folder (``partial``, the tasks already
``done``, ``journal``) and this context, they write every output tensor at its planned offset and
journal each task. Everything before (planning, the identity, the work folder's start) and after
(finishing, verify, the card, the seal, the commit, push) is the output lifecycle's (output/).
"""

from __future__ import annotations

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


def executor_sizes(budget: int) -> dict:
    """How an executor splits `budget` (--memory-budget): chunk, held-group and in-flight bytes."""
    return dict(chunk_bytes=min(512 << 20, max(64 << 10, budget // 16)), hold_bytes=budget // 5, budget_bytes=budget)


def warm_device(dev) -> None:
    """Create the CUDA context and import the Triton kernels on a daemon thread, so that they
    overlap with planning and the first reads instead of delaying the first quantized tensor.
    (torch's lazy CUDA initialisation is locked, so the executor simply waits if it is early.)
    Nothing for the CPU, nor for a device left unresolved (a dry run)."""
    if getattr(dev, "type", None) != "cuda":
        return

    def warm():
        try:
            import torch

            torch.empty(1, device=dev)
            from .. import kernels  # noqa: F401  (imports Triton)
        except Exception:  # noqa: BLE001 - the executor reports real device errors itself
            pass

    import threading

    threading.Thread(target=warm, daemon=True, name="quantize-cuda-init").start()


__all__ = ["RunContext", "executor_sizes", "warm_device"]
