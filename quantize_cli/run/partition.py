"""Split a plan into shard units: the work that writes one output shard, runnable anywhere.

The plan's tasks follow the source order, and one task's outputs may land in several output
shards (a fused q/k/v group whose k sits in the next shard; even one module's ``weight`` and
``weight_scale`` may straddle a shard boundary). A :class:`ShardUnit` holds, for one output
shard, every plan task that writes into it, cut down to what that shard needs:

- a plain ``quantize`` task keeps only the members with an output in the shard. Where that drops
  members of a group sharing one global amax (FP8 per-tensor, NVFP4), the unit still reads every
  member for the shared amax (``needs_amax``; :func:`~.shard_stream.unit_steps`).
- a ``moe`` stack or a densely packed group (``--layout``) needs every member to pack, so it is kept
  whole; outputs that belong to other shards are computed but not written (only at boundaries).
- a ``copy`` task has one output, hence one shard.

Every output tensor is written by exactly one unit, so units never write the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..plan.build import Plan, Task


@dataclass(frozen=True)
class ShardUnit:
    """The work of output shard ``shard``.

    Attributes:
        shard: output shard index (into ``plan.shard_names``).
        tasks: ``(plan task index, task cut to this shard)`` in plan (source) order.
        needs_amax: plan task indices whose shared amax spans members written by other units.
    """

    shard: int
    tasks: tuple[tuple[int, Task], ...]
    needs_amax: tuple[int, ...] = ()

    @property
    def bytes_in(self) -> int:
        """Source bytes this unit reads (members kept whole count fully)."""
        return sum(t.bytes_in for _, t in self.tasks)


def _splittable(plan: Plan, task: Task) -> bool:
    return task.kind == "quantize" and not (plan.packing is not None and plan.packing.dense)


def partition(plan: Plan) -> list[ShardUnit]:
    """One :class:`ShardUnit` per output shard, in shard order (see the module docstring)."""
    shard_of = {name: o.shard for name, o in plan.outputs.items()}
    per_shard: list[list[tuple[int, Task]]] = [[] for _ in plan.shard_names]
    amax: list[set[int]] = [set() for _ in plan.shard_names]
    for index, task in enumerate(plan.tasks):
        for shard in sorted({shard_of[n] for n in task.outputs}):
            outputs = tuple(n for n in task.outputs if shard_of[n] == shard)
            if _splittable(plan, task):
                keep = {n.rpartition(".")[0] for n in outputs}
                members = tuple(m for m in task.members if m.module in keep)
                if len(members) < len(task.members) and (task.scheme or plan.scheme).shares_global_amax:  # the task's own
                    amax[shard].add(index)
                sub = replace(task, members=members, outputs=outputs)
            else:
                sub = replace(task, outputs=outputs)
            per_shard[shard].append((index, sub))
    return [ShardUnit(s, tuple(work), tuple(sorted(amax[s]))) for s, work in enumerate(per_shard)]


__all__ = ["ShardUnit", "partition"]
