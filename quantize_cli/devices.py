"""``--device``: resolving it (through torch) and warming a GPU up while the plan is made.

torch is imported inside the functions. A dry run reads no tensor, so ``cpu`` and ``auto`` need
no torch there unless calibration runs on it or something shows or checks what ``auto`` resolves
to (:func:`without_torch`): ``convert --dry-run`` then imports no torch at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import UsageError

if TYPE_CHECKING:
    import torch


def resolve_device(device: str) -> torch.device:
    """``auto`` -> the first CUDA GPU when present, else CPU; ``cpu``, ``cuda``, ``cuda:N`` as given."""
    import torch

    device = (device or "auto").lower()
    if "," in device:
        raise UsageError(f"--device {device}: one device here (several are for convert: one pipeline each)")
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


def resolve_devices(device: str):
    """:func:`resolve_device`, or for a comma-separated list (``cuda:0,cuda:1``: convert runs one
    pipeline per device, run/local_devices.py) a tuple of devices."""
    items = (device or "auto").lower().split(",")
    if len(items) == 1:
        return resolve_device(items[0])
    return tuple(resolve_device(d) for d in items)


def device_label(device) -> str:
    """A device, a tuple of them or a name, as the report and messages write it (``cuda:0,cuda:1``)."""
    return ",".join(map(str, device)) if isinstance(device, tuple) else str(device)


def check_device_name(device: str | None) -> str:
    """`device` normalised, or the usage error ``resolve_device`` would give, without importing torch:
    ``auto``, ``cpu``, ``cuda``, ``cuda:N``. Whether the GPU exists is ``resolve_device``'s question."""
    import re

    name = (device or "auto").strip().lower()
    if re.fullmatch(r"auto|cpu|cuda(:\d+)?", name):
        return name
    if re.fullmatch(r"(cpu|cuda(:\d+)?)(,(cpu|cuda(:\d+)?))+", name):  # one pipeline per device (convert)
        return name
    raise UsageError(f"--device {device!r} is not a device; use auto, cpu, cuda or cuda:N")


def without_torch(device: str | None, auto_is_read: bool) -> str | None:
    """`device` as a dry run may keep it without torch, or None where it must be resolved.

    ``cpu`` is ``cpu`` (``str(torch.device("cpu"))``, and it cannot fail). ``auto`` stays
    unresolved when `auto_is_read` is False, i.e. nothing reads what it resolves to (the report
    records it, ``--kernels triton`` checks it). Everything else (``cuda``,
    ``cuda:N``, a typo) is checked by :func:`resolve_device`, with its errors.
    """
    name = (device or "auto").lower()
    if set(name.split(",")) == {"cpu"} or (name == "auto" and not auto_is_read):
        return name
    return None
