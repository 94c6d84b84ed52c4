"""Copy the verbatim tensors while torch is still loading (torch-free).

A conversion writes two kinds of bytes: quantized weights, which need torch and the device, and
tensors copied unchanged (the embedding, the LM head, norms, routers): on an 8B-shaped model about
2.1 of the 5.6 GB written. Importing torch and creating the CUDA context take seconds in which the
disk would sit idle (docs/performance.md, "Where the seconds go"). ``convert`` therefore starts the
device's resolution on a thread (:func:`~quantize_cli.run.startup.resolve_ahead`) and, once the work
folder is taken, copies these tensors here until the device is ready: plain ``preadv``/``pwrite``
of their bytes into the planned shard files, each task digested and journaled exactly as the
executor's write stage would (:mod:`.checksum`), so the executor then treats them as done, as it
treats the tasks of an interrupted run (``--resume``), and the bytes and the journal are the same.

One check needs torch: a copied float tensor with NaN/Inf is refused (run/finite.py). The copied
tasks are returned, and the executor checks them once torch is there (:func:`check_copied`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from . import checksum
from .context import io_threads

BUFFER = 16 << 20  # bytes per read + write; one buffer per copy thread (the whole memory this takes)


@dataclass
class Copied:
    """What :func:`copy_ahead` wrote: task indices (journaled), their source bytes and seconds."""

    tasks: set = field(default_factory=set)
    bytes: int = 0
    seconds: float = 0.0


def copyable(plan, index: int) -> bool:
    """Task `index` is a plain byte-for-byte copy of a local source tensor (not a transposed
    expert view, which is assembled with torch), written under its own name at its own size."""
    from ..checkpoint.safetensors_header import TensorInfo

    task = plan.tasks[index]
    if task.kind != "copy" or type(task.copy) is not TensorInfo or task.outputs != (task.copy.name,):
        return False
    out = plan.outputs[task.copy.name]
    return out.nbytes == task.copy.nbytes and out.dtype == task.copy.dtype


def copy_ahead(plan, folder: str, journal, done: set[int], until: Callable[[], bool]) -> Copied:
    """Copy the copyable tasks not in `done` into the shards in `folder`, journaling each, until
    ``until()`` is true (checked between tasks) or none is left. The shard files are created at
    their planned size with their headers (as the executor's writer creates them) and closed
    without a sync: the executor reopens them for its own writes and syncs them at its close."""
    from ..checkpoint.writer import ShardWriter

    todo = [i for i in range(len(plan.tasks)) if i not in done and copyable(plan, i)]
    result = Copied()
    if not todo or until():
        return result
    t0 = time.perf_counter()
    writer = ShardWriter(folder, plan.outputs, plan.shard_names)
    writer.open(fresh=not done)
    lock, pending, errors = threading.Lock(), iter(todo), []

    def work() -> None:
        buf = memoryview(bytearray(BUFFER))
        while True:
            with lock:
                index = None if (errors or until()) else next(pending, None)
            if index is None:
                return
            try:
                _copy_task(plan, index, writer, buf, journal)
            except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread below
                errors.append(exc)
                return
            with lock:
                result.tasks.add(index)
                result.bytes += plan.tasks[index].copy.nbytes

    threads = [threading.Thread(target=work, name=f"quantize-copy-ahead-{k}", daemon=True)
               for k in range(min(io_threads("write"), len(todo)))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        writer.abort()  # closes without a sync (see above)
    result.seconds = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return result


def _copy_task(plan, index: int, writer, buf: memoryview, journal) -> None:
    """One copy task: its bytes in order, digested as the write stage digests an output."""
    from ..checkpoint.safetensors_header import read_bytes_into

    info = plan.tasks[index].copy
    h = checksum.new()
    for start in range(0, info.nbytes, len(buf)):
        n = min(len(buf), info.nbytes - start)
        read_bytes_into(info, buf, start, n)
        writer.write_bytes(info.name, buf[:n], start)
        h.update(buf[:n])
    journal.append(index, checksum.task_digest({info.name: h.hexdigest()}))  # no bytes: checksum.EMPTY, as the write stage gives


def check_copied(plan, tasks: set[int]) -> None:
    """The NaN/Inf refusal for tensors copied here (run/finite.py), once torch is loaded: reads
    them back from the source in BUFFER-sized row blocks (the page cache holds them: just copied)."""
    from ..modules.experts import read_rows
    from .finite import refuse_non_finite_copy

    for index in sorted(tasks):
        info = plan.tasks[index].copy
        if not info.shape:
            refuse_non_finite_copy(info, read_rows(info, 0, 1))
            continue
        rows = info.shape[0]
        per = max(1, BUFFER * rows // max(info.nbytes, 1))
        for start in range(0, rows, per):
            refuse_non_finite_copy(info, read_rows(info, start, min(per, rows - start)))


__all__ = ["Copied", "copyable", "copy_ahead", "check_copied", "BUFFER"]
