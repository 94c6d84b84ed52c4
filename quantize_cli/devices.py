"""``--device``: resolving it (through torch) and warming a GPU up while the plan is made.

torch is imported inside the functions. A dry run reads no tensor, so ``cpu`` and ``auto`` need
no torch there unless calibration runs on it or something shows or checks what ``auto`` resolves
to (:func:`without_torch`): ``convert --dry-run`` then imports no torch at all.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .errors import UsageError

if TYPE_CHECKING:
    import torch


def resolve_device(device: str) -> torch.device:
    """``auto`` -> the first CUDA GPU when present, else CPU; ``cpu``, ``cuda``, ``cuda:N`` as given."""
    import torch

    device = (device or "auto").lower()
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise UsageError(f"--device {device!r} is not a device; use auto, cpu, cuda or cuda:N") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {device}: no CUDA GPU is available here; use --device cpu or auto")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"--device {device}: only {torch.cuda.device_count()} GPU(s) present")
    elif dev.type != "cpu":
        raise UsageError(f"--device {device!r}: only cpu and cuda devices are supported")
    return dev


_NAME = re.compile(r"auto|cpu|cuda(:\d+)?")


def check_name(device: str | None) -> str:
    """`device` lower-cased if it is ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (torch-free: whether a
    GPU is there is :func:`resolve_device`'s to say); a UsageError otherwise."""
    name = (device or "auto").strip().lower()
    if not _NAME.fullmatch(name):
        raise UsageError(f"--device {device!r} is not a device; use auto, cpu, cuda or cuda:N")
    return name


def without_torch(device: str | None, auto_is_read: bool) -> str | None:
    """`device` as a dry run may keep it without torch, or None where it must be resolved.

    ``cpu`` is ``cpu`` (``str(torch.device("cpu"))``, and it cannot fail). ``auto`` stays
    unresolved when `auto_is_read` is False, i.e. nothing reads what it resolves to (the report
    records it, ``--kernels triton`` checks it). Everything else (``cuda``,
    ``cuda:N``, a typo) is checked by :func:`resolve_device`, with its errors.
    """
    name = (device or "auto").lower()
    if name == "cpu" or (name == "auto" and not auto_is_read):
        return name
    return None


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
            from . import kernels  # noqa: F401  (imports Triton)
        except Exception:  # noqa: BLE001 - the executor reports real device errors itself
            pass

    import threading

    threading.Thread(target=warm, daemon=True, name="quantize-cuda-init").start()
