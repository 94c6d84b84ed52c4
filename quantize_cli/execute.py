"""Execute a plan: stream tensors from the source, quantize, write at planned offsets.

Memory stays bounded whatever the model size: copies move in fixed-size chunks, and a weight
larger than one chunk is quantized in row chunks (multiples of the scheme's ``row_align``; every
output is 0-d or row-indexed, so chunks concatenate). Schemes with a per-tensor scale need the
global amax first: a fused group that fits in the hold limit is read once and kept; a larger one
is read twice (an amax pass, then the quantize pass).

Every read the executor will make is derived from the plan up front (:meth:`Executor.reads`), so
the :class:`~quantize_cli.pipeline.Prefetcher` reads ahead while the compute runs and the
:class:`~quantize_cli.pipeline.AsyncWriter` writes behind it (``overlap=True``). The bytes
written are the same either way; only the timing differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import torch

from .checkpoint.safetensors_io import TensorInfo, byte_view, read_bytes_into, read_tensor, torch_dtype
from .experts import ViewedTensor
from .finite import check_finite, finite_flag, raise_non_finite, refuse_non_finite_copy
from .pipeline import AsyncWriter, ByteBudget, Prefetcher, Read, Timers, load
from .plan import Member, Plan, Task
from .schemes.search import error_reduction, searched_baseline

COPY_CHUNK = 64 * 1024 * 1024  # bytes per read+write of a copied tensor
# A fused-group member under this fraction of the group's shared amax quantizes to (almost) zero:
# 448 x 1e-4 is under e4m3's smallest normal step (2^-6), so its values are subnormal or zero.
DROWNED = 1e-4


@dataclass
class ErrorStats:
    """Running sums for a quantized tensor's error (||ref||^2, ||ref - deq||^2 and, with a searched
    scale, ||ref - rtn||^2 of the round-to-nearest baseline)."""

    signal: float = 0.0
    noise: float = 0.0
    noise_rtn: float | None = None

    def add(self, ref: torch.Tensor, deq: torch.Tensor, rtn: torch.Tensor | None = None) -> None:
        ref = ref.double()
        self.signal += float(ref.square().sum())
        self.noise += float((ref - deq.double()).square().sum())
        if rtn is not None:
            self.noise_rtn = (self.noise_rtn or 0.0) + float((ref - rtn.double()).square().sum())

    def summary(self) -> dict:
        rel = 0.0 if self.noise == 0 else (math.sqrt(self.noise / self.signal) if self.signal else math.inf)
        sqnr = math.inf if self.noise == 0 else (10 * math.log10(self.signal / self.noise) if self.signal else -math.inf)
        out = {"rel_error": rel, "sqnr_db": sqnr}
        if self.noise_rtn is not None:
            out.update(error_reduction(self.signal, self.noise, self.noise_rtn))
        return out


@dataclass
class RunStats:
    bytes_read: int = 0
    peak_inflight: int = 0
    peak_held: int = 0  # quantized MoE experts held for packing (one slice of a layer; see Executor._moe)
    errors: dict = field(default_factory=dict)  # module -> ErrorStats
    stages: dict = field(default_factory=dict)  # pipeline stage -> seconds (threads overlap)
    warnings: list = field(default_factory=list)  # printed by the caller after the run


def read_rows(info: TensorInfo, start: int, count: int, pin: bool = False) -> torch.Tensor:
    """Rows ``[start, start+count)`` of a source tensor into a new (pinned) CPU tensor.

    A :class:`ViewedTensor` (a transposed expert slice) reads its whole slab and takes the view.
    """
    if isinstance(info, ViewedTensor):
        t = info.apply(read_tensor(info.slab))[start : start + count]
        return t.pin_memory() if pin else t
    if not info.shape:
        return read_tensor(info)
    row = info.nbytes // max(info.shape[0], 1)
    buf = torch.empty(count * row, dtype=torch.uint8, pin_memory=pin)
    if buf.numel():
        read_bytes_into(info, byte_view(buf), start * row, count * row)
    return buf.view(torch_dtype(info.dtype)).reshape((count,) + tuple(info.shape[1:]))


class Executor:
    """Runs every task of `plan` on `device`, writing through `writer` (a ShardWriter).

    Args:
        chunk_bytes: source bytes quantized at once (rows are chunked to stay under it).
        hold_bytes: a fused group up to this size is read once and held for its shared amax.
        budget_bytes: host bytes in flight (reads ahead + writes behind) when overlapping.
        overlap: read ahead / write behind on background threads.
        quantize_fn: ``(scheme, w, global_amax) -> dict`` (the Triton kernels on a GPU), default the reference.
        measure_error: accumulate per-tensor relative error / SQNR (for --report).
        progress: a callable taking the number of source bytes just consumed.
        done: indices of tasks already complete (resume); on_task_written(i, crc) journals new ones.
    """

    def __init__(self, plan: Plan, writer, device: torch.device, chunk_bytes: int = 256 << 20, hold_bytes: int = 1 << 30,
                 budget_bytes: int = 4 << 30, overlap: bool = True, quantize_fn=None, measure_error: bool = False,
                 progress: Callable[[int], None] | None = None, done: set[int] | None = None,
                 on_task_written: Callable[[int, str], None] | None = None, resolver=None):
        self.plan = plan
        self.scheme = plan.scheme
        self.writer = writer
        self.device = device
        self.chunk_bytes = chunk_bytes
        self.hold_bytes = hold_bytes
        self.budget_bytes = budget_bytes
        self.overlap = overlap
        self.quantize_fn = quantize_fn or (lambda scheme, w, g: scheme.quantize(w, g))
        self.measure_error = measure_error
        self.progress = progress or (lambda n: None)
        self.done = done or set()
        self.on_task_written = on_task_written or (lambda i, crc: None)
        self.stats = RunStats()
        self.pin = device.type == "cuda"
        self._dense_packing = plan.packing is not None and plan.packing.dense
        self._finite: list = []  # (source, 0-d bool tensor) of the current task, checked once per task
        self.writer_stopped = True  # False after a failure that left the write thread inside a write
        self.resolver = resolver  # low-disk Hub mode: fetches a source shard on first read, drops it after its last

    # -- the read schedule ------------------------------------------------------------------
    def scheme_of(self, task: Task):
        """The task's own scheme (mixed precision) or the plan's."""
        return task.scheme or self.scheme

    def _rows_per_chunk(self, info: TensorInfo, scheme) -> int:
        n = info.shape[0]
        if isinstance(info, ViewedTensor) or self._dense_packing:
            return n  # a view of one expert's slab is read whole; packing needs whole tensors
        row_bytes = max(1, info.nbytes // max(n, 1))
        align = scheme.row_align
        return min(n, max(align, (self.chunk_bytes // row_bytes) // align * align))

    def _chunks(self, info: TensorInfo, scheme) -> list[Read]:
        n, rows = info.shape[0], self._rows_per_chunk(info, scheme)
        return [Read(info, s, min(rows, n - s)) for s in range(0, n, rows)]

    def _held(self, task: Task) -> bool:
        members, scheme = task.members, self.scheme_of(task)
        return (scheme.shares_global_amax and sum(m.source.nbytes for m in members) <= self.hold_bytes
                and all(self._rows_per_chunk(m.source, scheme) == m.source.shape[0] for m in members))

    def reads(self, task: Task) -> list[Read]:
        """Every read `task` makes, in the order the executor makes them."""
        if task.kind == "const":
            return []
        if task.kind == "copy":
            info = task.copy
            if isinstance(info, ViewedTensor):
                return [Read(info, 0, info.shape[0])]
            return [Read(info, s, min(COPY_CHUNK, info.nbytes - s), raw=True) for s in range(0, info.nbytes, COPY_CHUNK)] or [Read(info, 0, 0, raw=True)]
        scheme = self.scheme_of(task)
        if task.kind == "moe":
            ms = task.members
            return [r for e in range(0, len(ms), 3)
                    for r in self._whole_reads(ms[e : e + 2], scheme) + self._whole_reads(ms[e + 2 : e + 3], scheme)]
        if self._dense_packing:
            return self._whole_reads(task.members, scheme)
        if self._held(task):
            return [Read(m.source, 0, m.source.shape[0]) for m in task.members]
        chunks = [r for m in task.members for r in self._chunks(m.source, scheme)]
        return chunks + chunks if scheme.shares_global_amax else chunks  # amax pass, then quantize pass

    def _whole_reads(self, members, scheme) -> list[Read]:
        """Reads of :meth:`_whole`: each member whole, twice when a shared amax cannot be held."""
        reqs = [Read(m.source, 0, m.source.shape[0]) for m in members]
        return reqs + reqs if scheme.shares_global_amax and not self._held_members(members) else reqs

    def _schedule(self) -> Iterator[Read]:
        for index, task in enumerate(self.plan.tasks):
            if index not in self.done:
                yield from self.reads(task)

    # -- running ------------------------------------------------------------------------------
    def run(self):
        read_share = self.budget_bytes * 3 // 5  # reads ahead; the rest bounds writes behind
        self.read_budget, self.write_budget = ByteBudget(read_share), ByteBudget(self.budget_bytes - read_share)
        self.timers = Timers()
        self._prefetch = Prefetcher(self._schedule(), self.read_budget, self._load, self.timers) if self.overlap else None
        self._out = AsyncWriter(self.writer, self.write_budget, self.on_task_written, threaded=self.overlap, timers=self.timers)
        try:
            for index, task in enumerate(self.plan.tasks):
                if index in self.done:
                    self.progress(task.bytes_in)
                    continue
                if task.kind == "const":
                    self._const(task)
                elif task.kind == "copy":
                    self._copy(task.copy)  # type: ignore[arg-type]
                elif task.kind == "moe":
                    self._moe(task)
                else:
                    self._quantize(task)
                self._check_finite()
                self._out.task_done(index, self.task_outputs(task))
            with self.timers.time("wait_write_flush"):
                self._out.flush()
        except BaseException as exc:
            # A library caller must not be left with a thread still writing. An interruption waits
            # at most a moment for the write in progress (the process is about to exit).
            self.writer_stopped = self._out.abort(30.0 if isinstance(exc, Exception) else 0.05)
            raise
        finally:
            if self._prefetch is not None:
                self._prefetch.close()
        self.stats.peak_inflight = self.read_budget.peak + self.write_budget.peak + self.stats.peak_held
        self.stats.stages = {k: round(v, 3) for k, v in sorted(self.timers.seconds.items())}
        return self.stats

    @staticmethod
    def task_outputs(task: Task) -> list[str]:
        """The output tensor names `task` writes."""
        return list(task.outputs)

    def _fetch(self, req: Read) -> torch.Tensor:
        """The data of the next planned read (from the prefetcher, or read now)."""
        if self._prefetch is not None:
            data = self._prefetch.get(req)
        else:
            self.read_budget.acquire(req.nbytes)
            data = self._load(req)
        if not req.raw and self.device.type != "cpu":
            data = data.to(self.device, non_blocking=True)
        return data

    def _check_finite(self) -> None:
        """One device sync per task: were all of its scales finite? (NaN/Inf propagate into them.)"""
        if self._finite:
            ok = torch.stack([flag for _, flag in self._finite]).all().item()
            infos = [info for info, _ in self._finite]
            self._finite = []
            if not ok:
                for info in infos:
                    raise_non_finite(info, must_find=False, resolve=self._scan_resolve())

    def _load(self, req: Read) -> torch.Tensor:
        """Perform one planned read (through the low-disk resolver when the source is remote)."""
        if self.resolver is None:
            return load(req, self.pin, read_rows)
        try:
            return load(replace(req, info=self.resolver.resolve(req.info)), self.pin, read_rows)
        finally:
            self.resolver.release(req.info)

    def _scan_resolve(self):
        """Where a NaN scan reads a tensor: the downloaded shard in --low-disk mode (never the hub:// name)."""
        return self.resolver.resolve if self.resolver is not None else None

    def _done_with(self, req: Read) -> None:
        self.read_budget.release(req.nbytes)

    def _copy(self, info: TensorInfo) -> None:
        for req in self.reads(Task("copy", copy=info)):
            data = self._fetch(req)
            refuse_non_finite_copy(info, data)
            if req.raw:
                self._out.write(info.name, data, req.start)
                self._consumed(req.count)
            else:
                self._out.write(info.name, data)
                self._consumed(info.nbytes)
            self._done_with(req)

    def _quantize(self, task: Task) -> None:
        if self._dense_packing:
            self._quantize_packed(task)
            return
        scheme = self.scheme_of(task)
        if not scheme.shares_global_amax:
            for m in task.members:
                for req in self._chunks(m.source, scheme):
                    self._quantize_chunk(m, req, None, scheme=scheme)
            return
        if self._held(task):
            reqs = [Read(m.source, 0, m.source.shape[0]) for m in task.members]
            held = [self._fetch(r) for r in reqs]
            gamax = self._group_amax([self._amax(w) for w in held], task.members)
            for m, req, w in zip(task.members, reqs, held):
                self._quantize_chunk(m, req, gamax, w, scheme)
            return
        amaxes = []
        for m in task.members:
            amax = torch.zeros((), device=self.device)
            for req in self._chunks(m.source, scheme):
                amax = torch.maximum(amax, self._amax(self._fetch(req)))
                self._done_with(req)
            amaxes.append(amax)
        gamax = self._group_amax(amaxes, task.members)
        for m in task.members:
            for req in self._chunks(m.source, scheme):
                self._quantize_chunk(m, req, gamax, scheme=scheme)

    def _whole(self, members) -> list[dict[str, torch.Tensor]]:
        """Quantize whole members (sharing one global amax where the scheme does): plain outputs.
        Only for packed layouts, which are written for the plan's one scheme."""
        reqs = [Read(m.source, 0, m.source.shape[0]) for m in members]
        shared = self.scheme.shares_global_amax
        if shared and not self._held_members(members):  # too big to hold: an amax pass first
            amaxes = []
            for req in reqs:
                amaxes.append(self._amax(self._fetch(req)))
                self._done_with(req)
        outs, held = [], [self._fetch(r) for r in reqs] if shared and self._held_members(members) else None
        gamax = None
        if shared:
            gamax = self._group_amax([self._amax(w) for w in held] if held else amaxes, members)
        for k, (m, req) in enumerate(zip(members, reqs)):
            w = held[k] if held else self._fetch(req)
            out = self._calibrated(m.module, self.quantize_fn(self.scheme, w, gamax))
            check_finite(m.source, out, self._scan_resolve())
            if self.measure_error:
                self.stats.errors.setdefault(m.module, ErrorStats()).add(w.float(), self.scheme.dequantize(out), searched_baseline(self.scheme, w, out))
            outs.append(out)
            self._consumed(req.nbytes)
            self._done_with(req)
        return outs

    def _held_members(self, members) -> bool:
        return sum(m.source.nbytes for m in members) <= self.hold_bytes

    def _quantize_packed(self, task: Task) -> None:
        plain = dict(zip((m.module for m in task.members), self._whole(task.members)))
        for module, tensors in self.plan.packing.pack_group(plain).items():  # type: ignore[union-attr]
            for suffix, t in tensors.items():
                self._out.write(f"{module}.{suffix}", t)

    def _moe(self, task: Task) -> None:
        """One MoE layer: quantize expert by expert (gate/up share their amax), write the plain
        per-expert scales, then the packed stacks.

        The stacks are packed in slices of experts that fit the hold limit (a fifth of
        --memory-budget): every layout packs each expert independently along the stacked dim 0,
        so a slice's packed bytes land at ``first expert x bytes per expert`` and the result is
        the same as packing the whole layer at once, while at most one slice is held.
        """
        members = task.members
        n = len(members) // 3
        per_expert = max(1, max(sum(m.source.nbytes for m in members[3 * e : 3 * e + 3]) for e in range(n)))
        step = max(1, min(n, self.hold_bytes // per_expert))
        for first in range(0, n, step):
            experts = []
            for e in range(first, min(n, first + step)):
                gate, up, down = members[3 * e : 3 * e + 3]
                q_gate, q_up = self._whole((gate, up))
                (q_down,) = self._whole((down,))
                for m, q in ((gate, q_gate), (up, q_up), (down, q_down)):
                    for suffix, t in q.items():
                        if suffix != "weight" and t is not None:
                            self._out.write(f"{m.module}.{suffix}", t)
                experts.append({"gate": q_gate, "up": q_up, "down": q_down})
            held = sum(t.numel() * t.element_size() for x in experts for q in x.values() for t in q.values() if t is not None)
            self.stats.peak_held = max(self.stats.peak_held, held)
            for name, t in self.plan.packing.pack_layer(task.group, experts).items():  # type: ignore[union-attr]
                assert t.shape[0] == len(experts), (name, tuple(t.shape))  # stacked on dim 0, one row per expert
                self._out.write(name, t, first * (self.plan.outputs[name].nbytes // n))

    def _calibrated(self, module: str, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The plan's calibrated static activation tensors for `module` in place of the scheme's
        constants (the scheme says which tensors and how: ModelOpt and compressed-tensors differ)."""
        scales = self.plan.act_scales
        static = out.get("input_scale") is not None or out.get("input_global_scale") is not None
        if scales is not None and static and module in scales.input_amax:
            out.update(self.plan.scheme_of(module).calibrated_inputs(scales.input_amax[module], out))
        return out

    def _const(self, task: Task) -> None:
        """Tensors the plan already holds (calibrated KV scales)."""
        values = self.plan.act_scales.kv_tensors()  # type: ignore[union-attr]
        for name in task.outputs:
            self._out.write(name, values[name])

    def _amax(self, w: torch.Tensor) -> torch.Tensor:
        return self.scheme.global_amax(w)

    def _group_amax(self, amaxes: list[torch.Tensor], members: tuple[Member, ...]) -> torch.Tensor:
        for m, a in zip(members, amaxes):
            if not torch.isfinite(a).item():
                raise_non_finite(m.source, resolve=self._scan_resolve())
        gamax = torch.stack([a.reshape(()) for a in amaxes]).amax()
        if len(members) > 1:
            self._warn_drowned(members, amaxes, gamax)
        return gamax

    def _warn_drowned(self, members, amaxes, gamax) -> None:
        """A member whose largest value is under DROWNED x the group's shared amax keeps (almost)
        nothing after quantization (its values fall under the format's smallest step): say so, as
        ``verify --source`` would reject it."""
        top = float(gamax)
        for m, a in zip(members, amaxes):
            amax = float(a)
            if top > 0 and 0 < amax < DROWNED * top:
                self.stats.warnings.append(
                    f"{m.source.name}: its largest value {amax:.3g} is {top / amax:.3g}x below the scale it shares with its fused group "
                    f"(amax {top:.3g}); after {self.scheme.algo} it is (almost) all zero. Check the source weights; verify --source will fail it"
                )

    def _quantize_chunk(self, m: Member, req: Read, gamax, w: torch.Tensor | None = None, scheme=None) -> None:
        scheme = scheme or self.scheme
        if w is None:
            w = self._fetch(req)
        with self.timers.time("compute"):
            out = self._calibrated(m.module, self.quantize_fn(scheme, w, gamax))
            self._finite.append((m.source, finite_flag(out)))
        for suffix, t in out.items():
            name = f"{m.module}.{suffix}"
            if t.dim() == 0:
                if req.start == 0:
                    self._out.write(name, t)
                continue
            # Row-indexed outputs hold a fixed number of bytes per source row (chunks start at row_align multiples).
            self._out.write(name, t, req.start * self.plan.outputs[name].nbytes // m.source.shape[0])
        if self.measure_error:
            self.stats.errors.setdefault(m.module, ErrorStats()).add(w.float(), scheme.dequantize(out), searched_baseline(scheme, w, out))
        self._consumed(req.nbytes)
        self._done_with(req)

    def _consumed(self, n: int) -> None:
        self.stats.bytes_read += n
        self.progress(n)


__all__ = ["Executor", "RunStats", "read_rows"]
