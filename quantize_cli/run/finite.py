"""NaN/Inf: refuse them before a scale or a copied tensor carries them into the output.

A NaN or Inf in a weight propagates into its group's amax and so into every scale; the executor
checks one flag per task (:func:`finite_flag`, no device sync per chunk) and, when it is false,
names the tensor and its first bad element (:func:`raise_non_finite`, scanning in row chunks so
memory stays bounded on this path too). Tensors copied unquantized are checked as they stream.
"""

from __future__ import annotations

import torch

from ..checkpoint.safetensors_io import TensorInfo, torch_dtype
from ..errors import NumericsError
from ..modules.experts import ViewedTensor, read_rows
from ..schemes.numerics import all_finite
from ..schemes.mxfp8 import E8M0_MAX_FINITE_BYTE


_COPIED_FLOATS = ("BF16", "F16", "F32", "F64")


def refuse_non_finite_copy(info: TensorInfo, data: torch.Tensor) -> None:
    """A tensor copied unquantized (lm_head, a norm) with NaN/Inf would make the output compute
    garbage (and ``verify`` reject it): refuse it like a quantized one. `data`: raw bytes or typed."""
    if info.dtype not in _COPIED_FLOATS or not data.numel():
        return
    typed = data.view(torch_dtype(info.dtype)) if data.dtype == torch.uint8 else data
    if not all_finite(typed):
        raise NumericsError(
            f"{info.name} in {info.path}: contains NaN or Inf; it is copied unquantized, but the checkpoint would compute "
            "garbage (verify rejects it). Fix the source weights"
        )


def finite_flag(out: dict[str, torch.Tensor]) -> torch.Tensor:
    """0-d bool (on the device, no sync): every scale finite. NaN/Inf in a weight propagate into
    the amax, hence into the scales of its group."""
    device = next(iter(out.values())).device  # the payload's (the constant input_scale lives on the CPU)
    checks = [torch.isfinite(t.float()).all() for s, t in out.items() if "scale" in s and t is not None and t.is_floating_point()]
    # MXFP8's e8m0 scales are uint8 exponents: NaN/Inf in a block shows as a byte no finite amax gives
    checks += [(t <= E8M0_MAX_FINITE_BYTE).all() for s, t in out.items() if s == "weight_scale" and t.dtype == torch.uint8]
    # A host tensor's flag is read here (cheap, no device work); moving it to the device instead made a
    # pageable copy that waited for everything queued before it: one device sync per Linear.
    if not all(bool(c) for c in checks if c.device != device):
        return torch.zeros((), dtype=torch.bool, device=device)
    flags = [c for c in checks if c.device == device]
    return torch.stack(flags).all() if flags else torch.ones((), dtype=torch.bool, device=device)


def check_finite(info: TensorInfo, out: dict[str, torch.Tensor], resolve=None) -> None:
    """Refuse NaN/Inf at once (used where whole members are quantized)."""
    if not bool(finite_flag(out)):
        raise_non_finite(info, resolve=resolve)


def raise_non_finite(info: TensorInfo, chunk_bytes: int = 64 << 20, must_find: bool = True, resolve=None):
    """Name the tensor and its first NaN/Inf, scanning in row chunks (bounded memory here too).

    With ``must_find=False`` a tensor without NaN/Inf returns quietly (a group member checked
    because another member's scale was not finite). `resolve` maps `info` to where its bytes are
    (the --low-disk resolver); the message still names the source as planned."""
    named, info = info, (resolve(info) if resolve is not None else info)
    n = info.shape[0]
    rows = n if isinstance(info, ViewedTensor) else max(1, chunk_bytes // max(1, info.nbytes // max(n, 1)))
    where = ""
    for start in range(0, n, rows):
        bad = (~torch.isfinite(read_rows(info, start, min(rows, n - start)).float())).nonzero()
        if bad.numel():
            first = bad[0].tolist()
            first[0] += start
            where = f" (first at {first})"
            break
    if not where and not must_find:
        return
    raise NumericsError(
        f"{named.name} in {named.path}: contains NaN or Inf{where}; quantization scales would be NaN. "
        f"Fix the source weights or --exclude {named.module!r}"
    )


__all__ = ["finite_flag", "check_finite", "raise_non_finite", "refuse_non_finite_copy"]
