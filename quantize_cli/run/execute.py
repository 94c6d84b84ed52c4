"""Execute a plan: the coordinator of the read, compute and write stages.

Three stages, each owning one thing, connected by byte budgets:

* the schedule (:mod:`~quantize_cli.run.schedule`) turns every task into steps, each naming the
  reads it consumes, once and before any read;
* the read stage (:class:`~quantize_cli.run.pipeline.ReadStage`) performs exactly those reads ahead
  of the compute (``overlap=True``: several background threads), handing them over in order;
* the compute stage (:class:`~quantize_cli.run.compute.ComputeStage`) runs the steps: amax,
  quantization, packing, NaN checks;
* the write stage (:class:`~quantize_cli.run.pipeline.AsyncWriter`) writes at planned offsets behind
  the compute, on several lanes, and digests every task for the resume journal.

Memory stays bounded whatever the model size: copies move in fixed-size chunks, large weights are
quantized in row chunks, and every byte in flight counts against ``budget_bytes``. The bytes
written are the same with or without overlap; only the timing differs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from ..checkpoint.safetensors_io import TensorInfo, byte_view, read_bytes_into, read_tensor, torch_dtype
from .compute import ComputeStage, ErrorStats, RunStats
from ..modules.experts import read_rows
from .host_memory import PinnedPool, inflight_limit, rss_bytes, startup_baseline, warm_baseline
from .finite import raise_non_finite  # noqa: F401  (re-exported for executors/)
from .context import io_threads
from .pipeline import AsyncWriter, ByteBudget, Read, ReadStage, Timers, load
from ..plan.build import Plan, Task
from .schedule import CHUNK_BYTES, COPY_CHUNK, HOLD_BYTES, Schedule  # noqa: F401  (COPY_CHUNK: kept importable here)
from .schedule import reads as steps_reads


class Executor:
    """Runs the tasks of `plan` not in `done` on `device`, writing through `writer` (a ShardWriter).

    Everything is given to the constructor; :meth:`run` builds the stages and drives them task by
    task (a task is journaled once all of its bytes are written).

    Args:
        chunk_bytes: source bytes quantized at once (rows are chunked to stay under it).
        hold_bytes: a fused group up to this size is read once and held for its shared amax.
        budget_bytes: host bytes in flight (reads ahead + writes behind).
        overlap: read ahead / write behind on background threads.
        quantize_fn: ``(scheme, w, global_amax) -> dict`` (the Triton kernels on a GPU), default the reference.
        measure_error: accumulate per-tensor relative error / SQNR (for --report).
        progress: a callable taking the number of source bytes just consumed.
        done: indices of tasks already complete (resume); on_task_written(i, digest) journals new ones.
        resolver: low-disk Hub mode: fetches a source shard on first read, drops it after its last
            (built from the reads to come: ``Schedule(plan, **sizes).reads(tasks)``, no executor needed).
        process_budget: --memory-budget counting the whole process (host_memory.py): the bytes in
            flight are cut to it minus the process's RSS once the device is warm. None: only
            `budget_bytes` bounds them.
    """

    def __init__(self, plan: Plan, writer, device: torch.device, chunk_bytes: int = CHUNK_BYTES, hold_bytes: int = HOLD_BYTES,
                 budget_bytes: int = 4 << 30, overlap: bool = True, quantize_fn=None, measure_error: bool = False,
                 progress: Callable[[int], None] | None = None, done: set[int] | frozenset[int] = frozenset(),
                 on_task_written: Callable[[int, str], None] | None = None, resolver=None, process_budget: int | None = None):
        self.plan = plan
        self.writer = writer
        self.device = device
        self.schedule = Schedule(plan, chunk_bytes, hold_bytes)
        self.budget_bytes = budget_bytes
        self.overlap = overlap
        self.quantize_fn = quantize_fn
        self.measure_error = measure_error
        self.progress = progress or (lambda n: None)
        self.done = frozenset(done)
        self.on_task_written = on_task_written or (lambda i, digest: None)
        self.resolver = resolver
        self.process_budget = process_budget
        self.pin = device.type == "cuda"
        self.writer_stopped = True  # False after a failure that left the write thread inside a write
        self.baseline_rss = 0  # the process's RSS once warm (with process_budget), for the report
        self._pool: PinnedPool | None = None  # --memory-budget: trims torch's pinned pool (before reads, after tasks)
        self.warnings: list[str] = []

    @staticmethod
    def task_outputs(task: Task) -> list[str]:
        """The output tensor names `task` writes."""
        return list(task.outputs)

    def run(self) -> RunStats:
        todo = [(i, t, self.schedule.steps(t)) for i, t in enumerate(self.plan.tasks) if i not in self.done]
        read_budget, write_budget = ByteBudget(1, pinned=self.pin), ByteBudget(1, pinned=self.pin)  # pinned: count torch's blocks
        before_reads = rss_bytes()
        self._split(self._inflight(startup_baseline(self.device)), read_budget, write_budget)
        timers = Timers()
        # --low-disk fetches and drops source shards in read order: its resolver keeps one read at a time
        reader = ReadStage((r for _, _, steps in todo for r in steps_reads(steps)), read_budget, self._load, self.device,
                           self.overlap, timers, threads=1 if self.resolver is not None else io_threads("read"))
        out = AsyncWriter(self.writer, write_budget, self.on_task_written, threaded=self.overlap, timers=timers,
                          lanes=io_threads("write"))
        compute = ComputeStage(self.plan, self.device, reader.fetch, reader.release, out.write, self.quantize_fn,
                               self.measure_error, self.progress,
                               self.resolver.resolve if self.resolver is not None else None, timers)
        try:
            if self.process_budget is not None:  # reads start at once; the limit is final once CUDA and Triton are in
                with timers.time("wait_device"):
                    baseline = warm_baseline(self.device, read_budget.used, before_reads)  # the reads so far are in flight, not baseline
                self._split(self._inflight(baseline, final=True), read_budget, write_budget)
            for index, task in enumerate(self.plan.tasks):
                if index in self.done:
                    self.progress(task.bytes_in)
            if self.process_budget is not None:  # the pinned pool's cached blocks count against --memory-budget too
                self._pool = PinnedPool(self.device, read_budget.limit + write_budget.limit)
            for index, task, steps in todo:
                compute.run_task(task, steps)
                out.task_done(index, self.task_outputs(task))
                self._trim()
            compute.finish()
            with timers.time("wait_write_flush"):
                out.flush()
        except BaseException as exc:
            # A library caller must not be left with a thread still writing. An interruption waits
            # at most a moment for the write in progress (the process is about to exit).
            self.writer_stopped = out.abort(30.0 if isinstance(exc, Exception) else 0.05)
            raise
        finally:
            reader.close()
        stats = compute.stats
        stats.warnings[:0] = self.warnings
        stats.baseline_rss = self.baseline_rss
        stats.pinned_trims = self._pool.trims if self._pool is not None else 0
        stats.peak_inflight = read_budget.peak + write_budget.peak + stats.peak_held
        stats.stages = {k: round(v, 3) for k, v in sorted(timers.seconds.items())}
        return stats

    def _inflight(self, baseline: int, final: bool = False) -> int:
        """Bytes allowed in flight: `budget_bytes`, within the process budget less its `baseline` RSS."""
        if self.process_budget is None:
            return self.budget_bytes
        limit, warning = inflight_limit(self.process_budget, baseline)
        if final:
            self.baseline_rss = baseline
            if warning:
                self.warnings.append(warning)
        return min(self.budget_bytes, limit)

    @staticmethod
    def _split(limit: int, read_budget: ByteBudget, write_budget: ByteBudget) -> None:
        read_share = limit * 3 // 5  # reads ahead; the rest bounds writes behind
        read_budget.set_limit(read_share)
        write_budget.set_limit(limit - read_share)

    def _trim(self) -> None:
        if self._pool is not None:
            self._pool.trim()

    def _load(self, req: Read) -> torch.Tensor:
        """Perform one planned read (through the low-disk resolver when the source is remote)."""
        self._trim()  # before a new buffer: cached pinned blocks of other sizes go first
        if self.resolver is None:
            return load(req, self.pin, read_rows)
        try:
            return load(replace(req, info=self.resolver.resolve(req.info)), self.pin, read_rows)
        finally:
            self.resolver.release(req.info)


__all__ = ["Executor", "RunStats", "ErrorStats", "read_rows"]
