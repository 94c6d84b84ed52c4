"""Raw tensor reads from safetensors files: bytes into caller buffers, or new CPU tensors.

The header side (parsing, validation, :class:`TensorInfo`) is :mod:`.safetensors_header`, which is
torch-free; its names are re-exported here for the readers. The converter reads tensor bytes with
large ``readinto`` calls straight into (pinned) buffers of its own, which the safetensors library's
mmap interface does not offer.
"""

from __future__ import annotations

import ctypes
import os

import torch

from ..errors import SourceError
from .safetensors_header import (  # noqa: F401  (re-exported: one import for the readers)
    DTYPES,
    FLOAT_SOURCE_DTYPES,
    MAX_HEADER_BYTES,
    MAX_RANK,
    Header,
    TensorInfo,
    nbytes_of,
    read_bytes_into,
    read_header,
)

_TORCH_TO_ST = {v: k for k, (_, v) in DTYPES.items() if v}


def torch_dtype(st_dtype: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype name (``"BF16"`` -> ``torch.bfloat16``)."""
    name = DTYPES[st_dtype][1]
    if name is None or not hasattr(torch, name):
        raise SourceError(f"dtype {st_dtype} is not supported by this torch build; upgrade torch")
    return getattr(torch, name)


def st_dtype(dtype: torch.dtype) -> str:
    """The safetensors dtype name of a torch dtype (``torch.float8_e4m3fn`` -> ``"F8_E4M3"``)."""
    return _TORCH_TO_ST[str(dtype).removeprefix("torch.")]


def read_tensor(info: TensorInfo, start_row: int = 0, rows: int | None = None) -> torch.Tensor:
    """Read a tensor (or rows ``[start_row, start_row + rows)`` of its first dim) into a new CPU tensor.

    Example: a ``BF16[4, 8, 16]`` tensor read with ``start_row=1, rows=2`` gives a ``[2, 8, 16]`` bf16 tensor.
    """
    shape = info.shape
    row_bytes = info.nbytes // shape[0] if shape and shape[0] else info.nbytes
    if rows is None:
        rows = (shape[0] - start_row) if shape else 1
    nbytes = rows * row_bytes if shape else info.nbytes
    buf = torch.empty(nbytes, dtype=torch.uint8)
    if nbytes:
        read_bytes_into(info, byte_view(buf), start_row * row_bytes, nbytes)
    out_shape = ((rows,) + tuple(shape[1:])) if shape else ()
    return buf.view(torch_dtype(info.dtype)).reshape(out_shape)


def byte_view(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's storage (no numpy needed).

    The view does not keep `t` alive: the caller holds `t` for as long as the view is used.
    """
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("byte_view needs a contiguous CPU tensor")
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(bytearray(0))
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")
