"""Execute a plan: stream tensors from the source, quantize, write at planned offsets.

Memory stays bounded whatever the model size: copies move in fixed-size chunks, and a weight
larger than one chunk is quantized in row chunks (multiples of the scheme's ``row_align``; every
output is 0-d or row-indexed, so chunks concatenate). Schemes with a per-tensor scale need the
global amax first: a fused group that fits in the hold limit is read once and kept; a larger one
is read twice (an amax pass, then the quantize pass).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from .checkpoint.safetensors_io import TensorInfo, byte_view, read_bytes_into, read_tensor
from .checkpoint.writer import ShardWriter
from .errors import NumericsError
from .experts import ViewedTensor
from .plan import Member, Plan, Task
from .schemes.numerics import relative_error, sqnr_db

COPY_CHUNK = 64 * 1024 * 1024  # bytes per read+write of a copied tensor


@dataclass
class ErrorStats:
    """Running sums for a quantized tensor's error (||ref||^2, ||ref - deq||^2)."""

    signal: float = 0.0
    noise: float = 0.0

    def add(self, ref: torch.Tensor, deq: torch.Tensor) -> None:
        ref = ref.double()
        self.signal += float(ref.square().sum())
        self.noise += float((ref - deq.double()).square().sum())

    def summary(self) -> dict:
        rel = 0.0 if self.noise == 0 else (math.sqrt(self.noise / self.signal) if self.signal else math.inf)
        sqnr = math.inf if self.noise == 0 else (10 * math.log10(self.signal / self.noise) if self.signal else -math.inf)
        return {"rel_error": rel, "sqnr_db": sqnr}


@dataclass
class RunStats:
    bytes_read: int = 0
    seconds: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)  # module -> ErrorStats


class Executor:
    """Runs every task of `plan` on `device`, writing through `writer`.

    Args:
        chunk_bytes: source bytes quantized at once (rows are chunked to stay under it).
        hold_bytes: a fused group up to this size is read once and held for its shared amax.
        measure_error: accumulate per-tensor relative error / SQNR (for --report).
        progress: a callable taking the number of source bytes just consumed.
    """

    def __init__(self, plan: Plan, writer: ShardWriter, device: torch.device, chunk_bytes: int = 256 << 20,
                 hold_bytes: int = 1 << 30, measure_error: bool = False, progress=None, done: set[int] | None = None,
                 on_task_done=None):
        self.plan = plan
        self.scheme = plan.scheme
        self.writer = writer
        self.device = device
        self.chunk_bytes = chunk_bytes
        self.hold_bytes = hold_bytes
        self.measure_error = measure_error
        self.progress = progress or (lambda n: None)
        self.stats = RunStats()
        self.done = done or set()
        self.on_task_done = on_task_done or (lambda i: None)
        self._slab_key: tuple | None = None
        self._slab: torch.Tensor | None = None

    def run(self) -> RunStats:
        for index, task in enumerate(self.plan.tasks):
            if index in self.done:
                self.progress(task.bytes_in)
                continue
            if task.kind == "copy":
                self._copy(task.copy)  # type: ignore[arg-type]
            else:
                self._quantize(task)
            self._slab_key = self._slab = None
            self.on_task_done(index)
        return self.stats

    # -- copies ---------------------------------------------------------------------------
    def _copy(self, info: TensorInfo) -> None:
        if isinstance(info, ViewedTensor):  # a transposed expert slice: materialise it
            self.writer.write(info.name, self._read(info))
            self._consumed(info.nbytes)
            return
        buf = torch.empty(min(info.nbytes, COPY_CHUNK), dtype=torch.uint8)
        view = byte_view(buf) if buf.numel() else memoryview(b"")
        for start in range(0, info.nbytes, COPY_CHUNK):
            n = min(COPY_CHUNK, info.nbytes - start)
            read_bytes_into(info, view, start, n)
            self.writer.write_bytes(info.name, view[:n], start)
            self._consumed(n)
        if info.nbytes == 0:
            self.writer.write_bytes(info.name, memoryview(b""), 0)

    # -- quantization ---------------------------------------------------------------------
    def _rows_per_chunk(self, info: TensorInfo) -> int:
        n = info.shape[0]
        if isinstance(info, ViewedTensor):
            return n  # a view of one expert's slab is read whole
        row_bytes = max(1, info.nbytes // max(n, 1))
        align = self.scheme.row_align
        rows = max(align, (self.chunk_bytes // row_bytes) // align * align)
        return min(rows, n)

    def _read(self, info: TensorInfo, start: int = 0, rows: int | None = None) -> torch.Tensor:
        """Rows of a source tensor on the CPU; views of a fused-expert slab share one slab read."""
        if not isinstance(info, ViewedTensor):
            return read_tensor(info, start, rows)
        key = (info.path, info.offset)
        if self._slab_key != key:
            self._slab_key, self._slab = key, read_tensor(info.slab)
        t = info.apply(self._slab)
        return t if rows is None else t[start : start + rows]

    def _load(self, info: TensorInfo, start: int = 0, rows: int | None = None) -> torch.Tensor:
        t = self._read(info, start, rows)
        if self.device.type != "cpu":
            t = t.pin_memory().to(self.device, non_blocking=True)
        return t

    def _quantize(self, task: Task) -> None:
        members = task.members
        total = sum(m.source.nbytes for m in members)
        fits = all(self._rows_per_chunk(m.source) == m.source.shape[0] for m in members)
        if not self.scheme.shares_global_amax:
            for m in members:
                self._quantize_member(m, None, None)
            return
        if fits and total <= self.hold_bytes:
            held = {m.module: self._load(m.source) for m in members}
            gamax = self._group_amax({m.module: self.scheme.global_amax(held[m.module]) for m in members}, members)
            for m in members:
                self._quantize_member(m, gamax, held.pop(m.module))
            return
        amaxes = {m.module: self._streamed_amax(m.source) for m in members}
        gamax = self._group_amax(amaxes, members)
        for m in members:
            self._quantize_member(m, gamax, None)

    def _group_amax(self, amaxes: dict[str, torch.Tensor], members: tuple[Member, ...]) -> torch.Tensor:
        for m in members:
            if not torch.isfinite(amaxes[m.module]).item():
                raise_non_finite(m.source)
        return torch.stack([a.reshape(()) for a in amaxes.values()]).amax()

    def _streamed_amax(self, info: TensorInfo) -> torch.Tensor:
        rows = self._rows_per_chunk(info)
        amax = torch.zeros((), device=self.device)
        for start in range(0, info.shape[0], rows):
            chunk = self._load(info, start, min(rows, info.shape[0] - start))
            amax = torch.maximum(amax, self.scheme.global_amax(chunk))
        return amax

    def _quantize_member(self, m: Member, gamax: torch.Tensor | None, held: torch.Tensor | None) -> None:
        info = m.source
        n = info.shape[0]
        rows = n if held is not None else self._rows_per_chunk(info)
        cursors: dict[str, int] = {}
        err = ErrorStats() if self.measure_error else None
        for start in range(0, n, rows):
            count = min(rows, n - start)
            w = held if held is not None else self._load(info, start, count)
            out = self.scheme.quantize(w, gamax)
            check_finite(info, out)
            for suffix, t in out.items():
                name = f"{m.module}.{suffix}"
                if t.dim() == 0:
                    if start == 0:
                        self.writer.write(name, t)
                    continue
                t = t.cpu()
                self.writer.write(name, t, cursors.get(name, 0))
                cursors[name] = cursors.get(name, 0) + t.numel() * t.element_size()
            if err is not None:
                err.add(w.float(), self.scheme.dequantize(out))
            self._consumed(count * (info.nbytes // max(n, 1)))
        if err is not None:
            self.stats.errors[m.module] = err

    def _consumed(self, n: int) -> None:
        self.stats.bytes_read += n
        self.progress(n)


def check_finite(info: TensorInfo, out: dict[str, torch.Tensor]) -> None:
    """Refuse NaN/Inf: they propagate into the amax, hence into every scale of their group."""
    for suffix, t in out.items():
        if "scale" in suffix and t.is_floating_point() and not bool(torch.isfinite(t.float()).all()):
            raise_non_finite(info)


def raise_non_finite(info: TensorInfo):
    w = (info.apply(read_tensor(info.slab)) if isinstance(info, ViewedTensor) else read_tensor(info)).float()
    bad = (~torch.isfinite(w)).nonzero()
    where = f" (first at {bad[0].tolist()}, {int(bad.shape[0])} element(s))" if bad.numel() else ""
    raise NumericsError(
        f"{info.name} in {info.path}: contains NaN or Inf{where}; quantization scales would be NaN. "
        f"Fix the source weights or --exclude {info.module!r}"
    )


__all__ = ["Executor", "RunStats", "relative_error", "sqnr_db"]
