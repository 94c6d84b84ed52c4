"""``--executor local``: the whole plan in this process, through one pipeline (run/execute.py).

:func:`produce` writes every task not in `done` into the work folder's shards and journals it; the
caller (the output lifecycle) finishes, verifies, seals and commits.
"""

from __future__ import annotations

import sys
import time

from ..errors import DestinationError
from . import prefetch
from .context import RunContext, executor_sizes


def produce(plan, work, done: set[int], ctx: RunContext):
    """Write `plan`'s remaining tasks into ``work.partial``; returns the run's statistics (RunStats).
    Several devices (``--device cuda:0,cuda:1``): one pipeline per device (local_devices.py)."""
    check = _check_copied_beside(plan, ctx)
    if isinstance(ctx.device, tuple):
        from . import local_devices

        warmed = prefetch.stop()
        stats = local_devices.produce(plan, work, done, ctx)
        stats.warmed = warmed
        check.result()
        return stats
    from tqdm import tqdm

    from ..checkpoint.writer import ShardWriter
    from .execute import Executor
    from .kernel_choice import quantize_fn

    writer = ShardWriter(work.partial, plan.outputs, plan.shard_names)
    sizes = executor_sizes(ctx.budget)
    resolver = _low_disk_resolver(plan, work, done, sizes, ctx)
    executor = None
    try:  # a failure anywhere leaves no open shard file behind (library callers keep running)
        writer.open(fresh=not done)
        bar = tqdm(total=plan.bytes_in, unit="B", unit_scale=True, desc="quantize", disable=ctx.quiet or not sys.stderr.isatty())
        warmed = prefetch.stop()  # our own reads start now: the start-up warm-up (cli.convert) has done its part
        executor = Executor(plan, writer, ctx.device, **sizes,
                            quantize_fn=quantize_fn(ctx.kernels, ctx.device, ctx.warn, plan.format.reference_math_only),
                            measure_error=ctx.measure, progress=bar.update, done=done, on_task_written=work.journal.append,
                            resolver=resolver, process_budget=ctx.budget)
        try:
            stats = executor.run()
            stats.warmed = warmed
            check.result()
        finally:
            bar.close()
    except BaseException:
        if executor is None or executor.writer_stopped:  # never close a file a write is still using
            writer.abort()
        raise
    try:
        t = time.perf_counter()
        writer.close()
        stats.stages["final_fsync"] = round(time.perf_counter() - t, 3)
    except OSError as exc:
        raise DestinationError(f"{work.partial}: finishing the output failed ({exc.strerror or exc}); free disk space and "
                               f"rerun with --resume") from exc
    if resolver is not None:
        ctx.info(f"--low-disk: at most {resolver.peak_files} source shard(s) were on disk at once")
    return stats


def _check_copied_beside(plan, ctx: RunContext):
    """The NaN/Inf check of the tensors copied while torch loaded (run/copy_ahead.py), on a thread
    beside the executor; ``.result()`` raises its refusal."""
    import threading
    from concurrent.futures import Future

    from .copy_ahead import check_copied

    done: Future = Future()

    def check() -> None:
        try:
            check_copied(plan, set(ctx.copied_ahead))
            done.set_result(None)
        except BaseException as exc:  # noqa: BLE001 - raised by .result() on the executor's thread
            done.set_exception(exc)

    if ctx.copied_ahead:  # a daemon thread: an interrupted run does not wait for it at exit
        threading.Thread(target=check, name="quantize-check-copied", daemon=True).start()
    else:
        done.set_result(None)
    return done


def _low_disk_resolver(plan, work, done, sizes, ctx):
    """--low-disk: each source shard fetched on its first read and dropped after its last."""
    if not (ctx.hub and ctx.hub[2]):
        return None
    from ..checkpoint.hub import LazyShards
    from .schedule import Schedule

    reads = Schedule(plan, **sizes).reads(t for i, t in enumerate(plan.tasks) if i not in done)
    return LazyShards(ctx.hub[0], ctx.hub[1], work.path(".source-shards"), reads, plan.source.tensors)


__all__ = ["produce"]
