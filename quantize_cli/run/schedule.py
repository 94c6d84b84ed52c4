"""The read schedule: every step a task takes, derived once from the plan, before any read.

A task becomes a list of small frozen *steps*. Each step names the reads it consumes (at most
one) and what to do with their data; the compute stage (:mod:`~quantize_cli.run.compute`) runs the
steps in order and the read stage performs exactly ``reads(steps)`` ahead of it. There is no
second description of the order to keep in sync: the reads a run makes are the steps' reads.

How a task's steps are chosen (memory stays bounded whatever the model size):

* ``copy``: the tensor's bytes in :data:`COPY_CHUNK` pieces (a transposed expert view: whole).
* ``quantize``: each member in row chunks of about ``chunk_bytes`` (multiples of the scheme's
  ``row_align``). A scheme whose fused members share a global amax needs it first: a group that
  fits ``hold_bytes`` (and whose members are read whole) is read once and held (:class:`Hold`),
  a larger one is read twice (:class:`Amax` pass, then the :class:`Quantize` pass).
* packed dense layouts and ``moe``: members are quantized whole and their plain outputs collected
  (``collect=True``) for a :class:`PackGroup` / :class:`PackExperts` step; MoE experts are packed
  in slices of experts that fit ``hold_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..modules.experts import ViewedTensor
from .pipeline import Read
from ..plan.build import Member, Plan, Task

COPY_CHUNK = 64 * 1024 * 1024  # bytes per read+write of a copied tensor
CHUNK_BYTES = 256 << 20  # default source bytes quantized at once
HOLD_BYTES = 1 << 30  # default bytes of a fused group held for its shared amax


@dataclass(frozen=True)
class Copy:
    """Write the bytes of `read` (a copied tensor, or a whole transposed expert view) unchanged."""

    read: Read


@dataclass(frozen=True)
class Const:
    """Write tensors the plan already holds (calibrated KV scales); reads nothing."""

    read = None


@dataclass(frozen=True)
class Amax:
    """Fold the amax of `read` (a chunk of member `slot`) into that member's running amax; the data
    is dropped at once (the amax pass of a group too large to hold)."""

    slot: int
    read: Read


@dataclass(frozen=True)
class Hold:
    """Read member `slot` whole, keep it for its :class:`Quantize` step and take its amax."""

    slot: int
    read: Read


@dataclass(frozen=True)
class Share:
    """The members `slots` share one global amax from here on (their running amaxes' max)."""

    slots: tuple[int, ...]
    read = None


@dataclass(frozen=True)
class Quantize:
    """Quantize `read` (rows of `member`, index `slot` in its task).

    held: take the data kept by the member's :class:`Hold` (else read it now).
    shared: quantize with the group's shared amax (the last :class:`Share`).
    collect: keep the member's plain outputs for a packing step; else write them at the row
        offset of `read` (every output is 0-d or row-indexed, so row chunks concatenate).
    """

    member: Member
    slot: int
    read: Read
    held: bool = False
    shared: bool = False
    collect: bool = False


@dataclass(frozen=True)
class PackGroup:
    """Pack the collected outputs of a fused group into the dense layout and write them."""

    read = None


@dataclass(frozen=True)
class PackExperts:
    """Write the collected experts' plain scales, then pack experts ``[first, first+count)`` of the
    MoE layer into its stacks, written at ``first x bytes per expert``."""

    first: int
    count: int
    read = None


Step = Copy | Const | Amax | Hold | Share | Quantize | PackGroup | PackExperts


def fetched(step: Step) -> Read | None:
    """The read `step` consumes from the read stage: its own, except a :class:`Quantize` of held
    data (read by its :class:`Hold`) and the steps that read nothing."""
    return None if isinstance(step, Quantize) and step.held else step.read


def reads(steps: Iterable[Step]) -> list[Read]:
    """Every read `steps` make, in order: what the read stage performs and the compute consumes."""
    return [r for r in map(fetched, steps) if r is not None]


class Schedule:
    """Turns tasks into steps for one plan and one set of sizes (see the module docstring).

    Args:
        chunk_bytes: source bytes quantized at once (rows are chunked to stay under it).
        hold_bytes: a fused group (or a slice of MoE experts) up to this size is held in memory.
        _other_sizes: the rest of ``api.executor_sizes`` (the budget), which the schedule ignores.
    """

    def __init__(self, plan: Plan, chunk_bytes: int = CHUNK_BYTES, hold_bytes: int = HOLD_BYTES, **_other_sizes):
        self.plan = plan
        self.chunk_bytes = chunk_bytes
        self.hold_bytes = hold_bytes
        self.dense_packing = plan.packing is not None and plan.packing.dense

    def scheme_of(self, task: Task):
        """The task's own scheme (mixed precision) or the plan's."""
        return task.scheme or self.plan.scheme

    def steps(self, task: Task) -> list[Step]:
        """Every step of `task`, in the order the compute stage runs them."""
        if task.kind == "const":
            return [Const()]
        if task.kind == "copy":
            return [Copy(r) for r in copy_reads(task.copy)]  # type: ignore[arg-type]
        members = tuple(enumerate(task.members))
        if task.kind == "moe":
            return self._moe(task, members)
        if self.dense_packing:
            return self._whole(task, members) + [PackGroup()]
        return self._rows(task, members)

    def reads(self, tasks: Iterable[Task]) -> list[Read]:
        """Every read of `tasks`, in order (the --low-disk resolver counts them per source shard)."""
        return [r for t in tasks for r in reads(self.steps(t))]

    # -- row-chunked quantization ------------------------------------------------------------
    def _rows_per_chunk(self, info, scheme) -> int:
        n = info.shape[0]
        if isinstance(info, ViewedTensor) or self.dense_packing:
            return n  # a view of one expert's slab is read whole; packing needs whole tensors
        row_bytes = max(1, info.nbytes // max(n, 1))
        align = scheme.row_align
        return min(n, max(align, (self.chunk_bytes // row_bytes) // align * align))

    def _chunks(self, info, scheme) -> list[Read]:
        n, rows = info.shape[0], self._rows_per_chunk(info, scheme)
        return [Read(info, s, min(rows, n - s)) for s in range(0, n, rows)]

    def _rows(self, task: Task, members) -> list[Step]:
        scheme = self.scheme_of(task)
        if not scheme.shares_global_amax:
            return [Quantize(m, k, r) for k, m in members for r in self._chunks(m.source, scheme)]
        whole = all(self._rows_per_chunk(m.source, scheme) == m.source.shape[0] for _, m in members)
        if whole and self._fits(members):
            return self._held(members, collect=False)
        amax = [Amax(k, r) for k, m in members for r in self._chunks(m.source, scheme)]
        share = Share(tuple(k for k, _ in members))
        return amax + [share] + [Quantize(m, k, r, shared=True) for k, m in members for r in self._chunks(m.source, scheme)]

    # -- whole members (packed layouts) ------------------------------------------------------
    def _whole(self, task: Task, members) -> list[Step]:
        """Each member whole, outputs collected; a shared amax from held data when the members
        fit ``hold_bytes``, else from an amax pass over them first."""
        if not self.scheme_of(task).shares_global_amax:
            return [Quantize(m, k, _whole_read(m), collect=True) for k, m in members]
        if self._fits(members):
            return self._held(members, collect=True)
        share = Share(tuple(k for k, _ in members))
        return ([Amax(k, _whole_read(m)) for k, m in members] + [share]
                + [Quantize(m, k, _whole_read(m), shared=True, collect=True) for k, m in members])

    def _held(self, members, collect: bool) -> list[Step]:
        share = Share(tuple(k for k, _ in members))
        return ([Hold(k, _whole_read(m)) for k, m in members] + [share]
                + [Quantize(m, k, _whole_read(m), held=True, shared=True, collect=collect) for k, m in members])

    def _fits(self, members) -> bool:
        return sum(m.source.nbytes for _, m in members) <= self.hold_bytes

    def _moe(self, task: Task, members) -> list[Step]:
        """Expert by expert (gate and up share their amax, down has its own), packed in slices
        of experts that fit ``hold_bytes``: every layout packs each expert independently along
        the stacked dim 0, so slices give the same bytes as the whole layer at once."""
        n = len(members) // 3
        per_expert = max(1, max(sum(m.source.nbytes for _, m in members[3 * e : 3 * e + 3]) for e in range(n)))
        step = max(1, min(n, self.hold_bytes // per_expert))
        out: list[Step] = []
        for first in range(0, n, step):
            count = min(step, n - first)
            for e in range(first, first + count):
                out += self._whole(task, members[3 * e : 3 * e + 2]) + self._whole(task, members[3 * e + 2 : 3 * e + 3])
            out.append(PackExperts(first, count))
        return out


def _whole_read(m: Member) -> Read:
    return Read(m.source, 0, m.source.shape[0])


def copy_reads(info) -> list[Read]:
    """A copied tensor's reads: raw byte pieces, or one typed read of a transposed expert view."""
    if isinstance(info, ViewedTensor):
        return [Read(info, 0, info.shape[0])]
    return [Read(info, s, min(COPY_CHUNK, info.nbytes - s), raw=True) for s in range(0, info.nbytes, COPY_CHUNK)] or [Read(info, 0, 0, raw=True)]


__all__ = ["Schedule", "Step", "Copy", "Const", "Amax", "Hold", "Share", "Quantize", "PackGroup", "PackExperts", "reads", "fetched",
           "copy_reads", "COPY_CHUNK"]
