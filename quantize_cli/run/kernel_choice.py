"""``--kernels auto|triton|torch``: which implementation quantizes the weights.

The Triton kernels (``quantize_cli.kernels``) and the torch references (``quantize_cli.schemes``)
write the same bytes (tests/kernels prove it per algorithm); the choice changes speed only.

* ``auto`` (default): the Triton kernels on a CUDA GPU when Triton works there, else the torch
  reference (with a warning on a GPU: same bytes, slower).
* ``torch``: the torch reference everywhere, the GPU included (a user who wants the reference, or
  to rule the kernels out while debugging).
* ``triton``: the Triton kernels or nothing: a usage error where they cannot run (the CPU without
  Triton's interpreter, ``TRITON_INTERPRET=1``; Triton not installed; a format whose math has no
  kernel).
"""

from __future__ import annotations

import os

KERNELS = ("auto", "triton", "torch")


def check_kernels(kernels: str | None, device, ct_format: bool = False) -> str:
    """The normalised choice; a UsageError naming the fix when `kernels` cannot run on `device`.

    `device`: a resolved ``torch.device`` or a device string (``cpu``/``cuda``/``auto``: Ray's, decided per task).
    `ct_format`: the output is compressed-tensors, whose math runs as its torch reference only.
    """
    from ..errors import UsageError

    choice = (kernels or "auto").lower()
    if choice not in KERNELS:
        raise UsageError(f"--kernels {kernels!r}: choose auto, triton or torch")
    if choice != "triton":
        return choice
    if ct_format:
        raise UsageError("--kernels triton --format compressed-tensors: compressed-tensors math runs as its torch reference "
                         "only; use --kernels auto or torch")
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind == "auto":  # Ray tasks on whatever the cluster has: each task checks its own device (quantize_fn)
        return choice
    if kind != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise UsageError(f"--kernels triton on {kind}: the Triton kernels need a CUDA GPU (--device cuda), or Triton's "
                         "CPU interpreter (set TRITON_INTERPRET=1, slow); or use --kernels auto or torch")
    from importlib.util import find_spec

    if find_spec("triton") is None:
        raise UsageError("--kernels triton: Triton is not installed; pip install triton, or use --kernels auto or torch")
    return choice


def quantize_fn(kernels: str, device, warn=None, ct_format: bool = False):
    """The executor's ``quantize_fn`` for the choice (None: the torch reference).

    `warn`: called with a message when ``auto`` falls back to the reference on a GPU.
    """
    import torch

    device = torch.device(device)
    if kernels == "torch" or ct_format or (kernels == "auto" and device.type != "cuda"):
        return None
    from .. import kernels as triton_kernels
    from ..errors import UsageError

    if triton_kernels.can_run(device):
        return triton_kernels.quantize
    if kernels == "triton":
        raise UsageError(f"--kernels triton: the Triton kernels cannot run on {device} here; use --kernels auto or torch")
    if warn is not None:
        warn("Triton is unavailable: quantizing with the torch reference on the GPU (same bytes, slower)")
    return None


__all__ = ["KERNELS", "check_kernels", "quantize_fn"]
