"""A long-lived pipeline on one device that writes output shards as they are handed to it.

The local executor runs one pipeline over the whole plan. A scale-out worker (a Ray actor per
GPU, or one pipeline per device of ``--device cuda:0,cuda:1``) is handed whole output shards
(:class:`~.partition.ShardUnit`) one after another, by a driver that balances them between workers
(:mod:`.dispatch`). :class:`ShardStream` keeps everything that is costly to start across shards:
the process, torch, the CUDA context, the Triton kernels, the plan, the pinned buffers and the
three stage threads. Its read stage streams across shard boundaries: the next shard's reads start
as soon as the previous shard's reads are issued, while that shard is still being quantized and
written, exactly as the local pipeline runs from one task to the next. A finished shard is fsynced
and closed on a side thread, so the writes of the next one do not wait for the disk.

Bytes and digests equal the local executor's: the same schedule, compute and write stages run the
same tasks; a write is kept only when its output belongs to the shard being written (a task cut by
a shard boundary is computed by both shards' units, each keeping its own outputs), and a fused group
split between shards takes its shared amax over every member (:func:`unit_steps`), as the local
executor does, reading the members written by the other shard for their amax only.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from .partition import ShardUnit
from .stats import RunStats


class Cancelled(Exception):
    """A unit the stream did not write because the run was stopped (:meth:`ShardStream.abort`)."""


@dataclass(eq=False)  # identity: jobs sit in a set
class _Job:
    """One shard unit handed to the stream, from its submission to its closed, fsynced file."""

    unit: ShardUnit
    unit_done: frozenset  # indices into unit.tasks already complete (resume)
    future: Future
    todo: list = field(default_factory=list)  # (plan task index, task to run, its steps)
    parts: dict = field(default_factory=dict)  # plan task index -> {output: digest}
    resolver: object = None
    scratch: str | None = None
    writer: object = None
    lock: int | None = None
    started: float = 0.0


def unit_steps(schedule, plan, index: int, sub):
    """``(task, steps)`` to run for `sub`, plan task `index` cut to one shard (partition.py).

    A fused group sharing one global amax (FP8 per tensor, NVFP4) whose members a shard boundary
    splits needs the amax of every member, also those the other shard writes: the steps are the
    whole group's (the same :class:`~.schedule.Amax` / :class:`~.schedule.Hold` / ``Share`` steps
    as the local executor, so the same amax, bit for bit), with the quantization of the members this
    shard does not write dropped (a held one is only read for its amax)."""
    from .schedule import Amax, Hold, Quantize

    whole = plan.tasks[index]
    if len(sub.members) == len(whole.members) or sub.kind != "quantize" or not (sub.scheme or plan.scheme).shares_global_amax:
        return sub, schedule.steps(sub)
    kept = {m.module for m in sub.members}
    steps = []
    for step in schedule.steps(whole):
        member = getattr(step, "member", None) or (whole.members[step.slot] if isinstance(step, Hold) else None)
        if member is not None and member.module not in kept:
            if isinstance(step, Quantize):
                continue
            step = Amax(step.slot, step.read)  # a Hold of a member written elsewhere: its amax only
        steps.append(step)
    return replace(whole, outputs=sub.outputs), steps


class _Files:
    """The write stage's writer: routes each output to the open shard file it belongs to."""

    def __init__(self, outputs: dict):
        self.outputs = outputs
        self.open: dict[int, object] = {}  # shard -> ShardWriter

    def write_bytes(self, name: str, data, byte_offset: int = 0) -> None:
        self.open[self.outputs[name].shard].write_bytes(name, data, byte_offset)


class ShardStream:
    """One device's pipeline over the shard units :meth:`submit` hands it (see the module docstring).

    Args:
        plan: the whole plan (sent once; units name its tasks).
        folder: the work folder the shards are written into.
        device: a ``torch.device``.
        budget: --memory-budget of this process; with `share` streams in one process each takes
            its share of what the process's baseline leaves (host_memory.py).
        kernels, measure, hub: as :class:`~.context.RunContext`.
        budget_warning: say when the budget is below the process's own size (once per process).
        progress: called with the source bytes consumed (any thread); where: merged into each result.
    """

    def __init__(self, plan, folder: str, device, budget: int, *, kernels: str = "auto", measure: bool = False,
                 hub=None, share: int = 1, progress=None, warn=None, where: dict | None = None, budget_warning: bool = True):
        from .context import executor_sizes

        self.plan, self.folder, self.device, self.budget, self.share = plan, folder, device, budget, max(1, share)
        self.sizes = executor_sizes(budget // self.share)
        self.kernels, self.measure, self.hub, self.warn, self.budget_warning = kernels, measure, hub, warn, budget_warning
        self.where = where or {}
        self.consumed = 0
        self._progress = progress
        self._inbox: queue.Queue = queue.Queue()
        self._started: queue.Queue = queue.Queue()
        self._pending: set[_Job] = set()
        self._lock = threading.Lock()
        self._broken: BaseException | None = None
        self._reading: _Job | None = None
        self._writing: _Job | None = None
        self._files = _Files(plan.outputs)
        self._pool = None  # host_memory.PinnedPool once the device is warm
        self._hub_cache = None
        self._closer = ThreadPoolExecutor(1, thread_name_prefix="quantize-close")
        self.stats = RunStats()
        self._thread = threading.Thread(target=self._main, daemon=True, name=f"quantize-stream-{device}")
        self._thread.start()

    # -- the caller's side ------------------------------------------------------------------------
    def submit(self, unit: ShardUnit, unit_done: frozenset = frozenset()) -> Future:
        """Queue `unit` (its tasks `unit_done` already written); the future's result is ``{shard,
        index, bytes_in, parts: {plan task: {output: digest}}, seconds, skipped: False, kept: tasks kept
        from an earlier run, **where}``."""
        job = _Job(unit, frozenset(unit_done), Future())
        with self._lock:
            if self._broken is not None:
                job.future.set_exception(self._broken)
                return job.future
            self._pending.add(job)
        self._inbox.put(job)
        return job.future

    def close(self) -> RunStats:
        """Finish every queued unit, stop the threads; the stream's statistics."""
        self._inbox.put(None)
        self._thread.join()
        return self.stats

    def abort(self, why: str = "the run stopped") -> None:
        """Stop after the task being computed; every unit not written fails (another one's error
        ended the run, or Ctrl-C). Waits for the threads."""
        self._break(Cancelled(why))
        self._thread.join()

    # -- the stream's threads ---------------------------------------------------------------------
    def _main(self) -> None:
        from .compute import ComputeStage
        from .execute import Executor
        from .host_memory import PinnedPool, rss_bytes, startup_baseline, warm_baseline
        from .kernel_choice import quantize_fn
        from .context import io_threads
        from .pipeline import AsyncWriter, ByteBudget, ReadStage, Timers

        pin = self.device.type == "cuda"
        if pin and self.device.index is not None:
            import torch

            # Triton launches on the thread's current device, whatever its arguments' device: a
            # stream for cuda:1 whose thread still points at cuda:0 fails ("cannot be accessed
            # from Triton"; seen on a 2-GPU H200 with --device cuda:0,cuda:1).
            torch.cuda.set_device(self.device)
        timers, reads, writes = Timers(), ByteBudget(1, pinned=pin), ByteBudget(1, pinned=pin)
        before_reads = rss_bytes()
        Executor._split(self._limit(startup_baseline(self.device)), reads, writes)
        hub = self.hub is not None  # a Hub resolver fetches (and with --low-disk drops) shards in read order: one read at a time
        reader = ReadStage(self._reads(), reads, self._load, self.device, True, timers,
                           threads=1 if hub else io_threads("read"), bind=self._bind)
        out = AsyncWriter(self._files, writes, lambda i, digest: None, threaded=True, timers=timers,
                          on_task_parts=lambda key, parts: key[0].parts.__setitem__(key[1], parts), lanes=io_threads("write"))
        try:
            fn = quantize_fn(self.kernels, self.device, self.warn, self.plan.format.reference_math_only)
            compute = ComputeStage(self.plan, self.device, reader.fetch, reader.release, lambda *a: self._write(out, *a), fn,
                                   self.measure, self._consumed, None, timers)
            with timers.time("wait_device"):
                baseline = warm_baseline(self.device, reads.used, before_reads)
            self.stats.baseline_rss = baseline
            Executor._split(self._limit(baseline, final=True), reads, writes)
            # torch's pinned pool is one per process, shared by the `share` streams of --device a,b: its
            # limit is theirs together. Each stream's own share made every stream empty the pool that
            # the others were reusing, before each read: 2-4 GPUs ran slower than one (issue 34).
            self._pool = PinnedPool(self.device, (reads.limit + writes.limit) * self.share)
            while (job := self._started.get()) is not None:
                self._run(job, compute, out)
            if self._broken is not None:  # aborted while idle: the units still queued fail
                raise self._broken
            with timers.time("wait_write_flush"):
                out.flush()
            self._closer.shutdown(wait=True)
        except BaseException as exc:  # noqa: BLE001 - handed to every unit still waiting
            self._break(exc)
            # the shards still closing report this failure, not "aborted": a NaN reaches the driver as itself
            stopped = out.abort(30.0 if isinstance(exc, Exception) else 0.05, cause=exc)
            self._closer.shutdown(wait=True)
            self._fail_pending(exc, release=stopped)  # never close a file a write is still using
            return
        finally:
            reader.close()
        stats = compute.stats
        stats.baseline_rss, stats.warnings[:0] = self.stats.baseline_rss, self.stats.warnings
        stats.pinned_trims = self._pool.trims
        stats.peak_inflight = reads.peak + writes.peak + stats.peak_held
        stats.stages = {k: round(v, 3) for k, v in sorted(timers.seconds.items())}
        self.stats = stats

    def _reads(self):
        """Every read of every unit, in submission order (runs on the read thread): a unit is
        prepared and handed to the compute thread when its first read is due."""
        from .schedule import Schedule
        from .schedule import reads as steps_reads

        schedule = Schedule(self.plan, **self.sizes)
        while (job := self._inbox.get()) is not None and self._broken is None:
            job.started = time.perf_counter()
            try:
                job.todo = [(i, *unit_steps(schedule, self.plan, i, t)) for k, (i, t) in enumerate(job.unit.tasks)
                            if k not in job.unit_done]
                job.resolver, job.scratch = self._resolver([r for _, _, steps in job.todo for r in steps_reads(steps)])
            except BaseException as exc:  # noqa: BLE001 - the compute thread raises it once its current unit is done
                self._break(exc)
                break
            self._started.put(job)
            self._reading = job
            for _, _, steps in job.todo:
                yield from steps_reads(steps)
        self._started.put(None)

    def _resolver(self, reads):
        """A Hub source's resolver for a unit's `reads`: the node's cache, one for the whole stream (each
        file looked up once), or with --low-disk one scratch folder per unit (hub_source.py)."""
        from .hub_source import hub_resolver

        if self.hub and not self.hub[2]:
            if self._hub_cache is None:
                self._hub_cache = hub_resolver(self.hub, reads)[0]
            return self._hub_cache, None
        return hub_resolver(self.hub, reads)

    def _bind(self, req):
        """`req`'s read with the resolver of the unit being issued now (read threads run it later,
        when the issuing may have moved on to the next unit)."""
        import functools

        return functools.partial(self._load, req, self._reading.resolver if self._reading is not None else None)

    def _load(self, req, resolver=None):
        from ..modules.experts import read_rows
        from .pipeline import load

        if self._pool is not None:
            self._pool.trim()
        if resolver is None:
            return load(req, self.device.type == "cuda", read_rows)
        try:
            return load(replace(req, info=resolver.resolve(req.info)), self.device.type == "cuda", read_rows)
        finally:
            resolver.release(req.info)

    def _run(self, job: _Job, compute, out) -> None:
        """Quantize and queue the writes of `job` (compute thread); its file is closed behind."""
        from ..checkpoint.writer import ShardWriter

        shard = job.unit.shard
        for k, (_, task) in enumerate(job.unit.tasks):
            if k in job.unit_done:
                self._consumed(task.bytes_in)
        job.lock = lock_shard(os.path.join(self.folder, self.plan.shard_names[shard]))
        job.writer = ShardWriter(self.folder, self.plan.outputs, self.plan.shard_names, only={shard})
        job.writer.open(fresh=not job.unit_done)
        self._files.open[shard] = job.writer
        self._writing = job
        compute.resolve = job.resolver.resolve if job.resolver is not None else None
        for index, task, steps in job.todo:
            if self._broken is not None:
                raise self._broken
            compute.run_task(task, steps)
            out.task_done((job, index), list(task.outputs))
            self._pool.trim()
        compute.finish()  # the last task's NaN/Inf check, before its shard is closed and reported
        out.call(lambda error: self._closer.submit(self._finish, job, error))

    def _write(self, out, name: str, tensor, offset: int) -> None:
        """Only the shard being written keeps its outputs (see the module docstring)."""
        if self.plan.outputs[name].shard == self._writing.unit.shard:
            out.write(name, tensor, offset)

    def _finish(self, job: _Job, error: BaseException | None) -> None:
        """Close (fsync) `job`'s shard and settle its future (closer thread)."""
        from ..errors import DestinationError

        try:
            if error is None:
                try:
                    job.writer.close(sync=True)
                except OSError as exc:
                    error = DestinationError(f"{job.writer.paths()[job.unit.shard]}: finishing the shard failed "
                                             f"({exc.strerror or exc}); free disk space and rerun with --resume")
            if error is not None:
                job.writer.abort()
        finally:
            self._release(job)
        result = {"shard": self.plan.shard_names[job.unit.shard], "index": job.unit.shard, "bytes_in": job.unit.bytes_in,
                  "parts": job.parts, "seconds": time.perf_counter() - job.started, "skipped": False,
                  "kept": len(job.unit_done), **self.where}
        self._settle(job, error, result)

    # -- bookkeeping ------------------------------------------------------------------------------
    def _limit(self, baseline: int, final: bool = False) -> int:
        """Bytes in flight for this stream: its share of the budget left after the process's baseline."""
        from .host_memory import inflight_limit

        limit, warning = inflight_limit(self.budget, baseline)
        if final and warning and self.budget_warning:
            self.stats.warnings.append(warning)
        return min(self.sizes["budget_bytes"], limit // self.share)

    def _consumed(self, n: int) -> None:
        self.consumed += n
        if self._progress is not None:
            self._progress(n)

    def _release(self, job: _Job) -> None:
        """Give back what `job` holds: its open file, the lock on it, a --low-disk scratch folder."""
        import shutil

        if self._files.open.pop(job.unit.shard, None) is not None and job.writer is not None:
            job.writer.abort()  # closes without syncing; a no-op after close()
        if job.lock is not None:
            lock, job.lock = job.lock, None
            os.close(lock)
        if job.scratch:
            shutil.rmtree(job.scratch, ignore_errors=True)

    def _settle(self, job: _Job, error: BaseException | None, result=None, release: bool = True) -> None:
        if error is not None and release:
            self._release(job)  # a unit that failed before its file was closed (a worker kept warm must not hold the lock)
        with self._lock:
            self._pending.discard(job)
            if job.future.done():
                return
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(result)

    def _break(self, exc: BaseException) -> None:
        with self._lock:
            self._broken = self._broken or exc
        self._inbox.put(None)  # wakes the read thread if it waits for a unit

    def _fail_pending(self, exc: BaseException, release: bool = True) -> None:
        with self._lock:
            jobs = list(self._pending)
        for job in jobs:
            self._settle(job, exc, release=release)


LOCK_WAIT_S = 120  # a shard still locked by a dying worker of an earlier run gets this long


def lock_shard(path: str) -> int:
    """An exclusive lock on the shard file (its fd): a worker of a dead earlier run, or a worker
    lost mid-shard whose process is still exiting, must stop writing it first."""
    import fcntl

    from ..errors import DestinationError

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise DestinationError(f"{path}: still locked by another writer after {LOCK_WAIT_S} s; "
                                       f"stop the other run and rerun with --resume") from None
            time.sleep(0.2)


__all__ = ["ShardStream", "Cancelled", "unit_steps", "lock_shard"]
