"""Overlapped I/O: parallel reads ahead of the compute and parallel writes behind it.

The executor's reads are known in advance (the plan fixes every tensor, chunk and order), so a
:class:`Prefetcher` performs them ahead of the compute into (pinned) host buffers, several at once
(:func:`io_threads`), handing them over in order; an :class:`AsyncWriter` performs the ``pwrite``s
behind it on several lanes. Byte budgets bound every byte in flight (read but not yet consumed,
produced but not yet written), so host memory stays within ``--memory-budget`` whatever the model
size; they bound bytes, never turns: reading and writing go on at once as long as bytes are free.
File I/O, digests and torch kernels release the GIL, so the stages really run at once.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from . import checksum
from ..checkpoint.safetensors_io import TensorInfo, byte_view, read_bytes_into


class Timers:
    """Seconds spent per pipeline stage (thread-safe), for the report and the benchmarks."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    def time(self, stage: str):
        timers = self

        class _Span:
            def __enter__(self):
                self.t = time.perf_counter()

            def __exit__(self, *exc):
                timers.add(stage, time.perf_counter() - self.t)

        return _Span()


def pinned_block(n: int) -> int:
    """The bytes torch's pinned host allocator takes for `n`: the next power of two."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


class ByteBudget:
    """A counting semaphore over bytes. One request larger than the whole budget is still
    granted when nothing else is in flight, so a huge tensor cannot deadlock the pipeline.

    `pinned`: the bytes are pinned host buffers, counted as the blocks torch allocates for them
    (:func:`pinned_block`), so that the budget bounds the memory really held, not the payload."""

    def __init__(self, limit: int, pinned: bool = False):
        self.limit = max(1, limit)
        self.used = 0
        self.peak = 0
        self._size = pinned_block if pinned else int
        self._cond = threading.Condition()

    def acquire(self, n: int, abort: Callable[[], bool] = lambda: False) -> None:
        n = self._size(n)
        with self._cond:
            while self.used and self.used + n > self.limit:
                if abort():
                    return
                self._cond.wait(0.1)
            self.used += n
            self.peak = max(self.peak, self.used)

    def release(self, n: int) -> None:
        n = self._size(n)
        with self._cond:
            self.used -= n
            self._cond.notify_all()

    def set_limit(self, limit: int) -> None:
        """A new limit from now on (bytes already in flight stay granted)."""
        with self._cond:
            self.limit = max(1, limit)
            self._cond.notify_all()


@dataclass(frozen=True)
class Read:
    """One planned read: rows ``[start, start+count)`` of a tensor, or bytes of a copied one."""

    info: TensorInfo
    start: int
    count: int
    raw: bool = False  # True: bytes of a tensor copied verbatim

    @property
    def nbytes(self) -> int:
        if self.raw:
            return self.count
        rows = self.info.shape[0] if self.info.shape else 1
        return self.count * (self.info.nbytes // max(rows, 1)) if self.info.shape else self.info.nbytes


def load(req: Read, pin: bool, reader: Callable) -> torch.Tensor:
    """Perform `req` into a new (pinned) buffer: raw uint8 bytes, or a typed row block."""
    if req.raw:  # pinned too (with `pin`): the budgets and host_memory.PinnedPool then account every buffer alike
        buf = torch.empty(req.count, dtype=torch.uint8, pin_memory=pin)
        if req.count:
            read_bytes_into(req.info, byte_view(buf), req.start, req.count)
        return buf
    return reader(req.info, req.start, req.count, pin)


class Prefetcher:
    """Performs `requests` ahead of the consumer, at most `budget` bytes ahead, `threads` at once.

    One issuing thread walks the requests in order, takes each one's bytes from the budget and
    hands the read to a pool of `threads`; the consumer receives the data strictly in request
    order (:meth:`get`), whichever read finished first. `bind(req)`, called on the issuing thread,
    returns the zero-argument callable that performs `req` (default ``loader(req)``): a caller whose
    reads depend on state that moves with the issuing (a shard stream's current unit) binds it there.
    """

    _DONE = object()

    def __init__(self, requests: Iterable[Read], budget: ByteBudget, loader: Callable[[Read], torch.Tensor],
                 timers: Timers | None = None, threads: int = 1, bind: Callable[[Read], Callable[[], torch.Tensor]] | None = None):
        self.timers = timers or Timers()
        self.budget = budget
        self._bind = bind or (lambda req: functools.partial(loader, req))
        self._q: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="quantize-read")
        self._thread = threading.Thread(target=self._run, args=(iter(requests),), daemon=True, name="quantize-read-issue")
        self._thread.start()

    def _timed(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        with self.timers.time("read_io"):  # summed over the read threads: thread-seconds
            return fn()

    def _run(self, requests) -> None:
        try:
            for req in requests:
                with self.timers.time("reader_wait_budget"):
                    self.budget.acquire(req.nbytes, self._stop.is_set)
                if self._stop.is_set():
                    return
                self._q.put((req, self._pool.submit(self._timed, self._bind(req))))
        except BaseException as exc:  # handed to the consumer, which raises it
            self._q.put((None, exc))
        finally:
            self._q.put((self._DONE, None))

    def get(self, expected: Read) -> torch.Tensor:
        """The data of the next request, which must be `expected` (the executor's own order)."""
        with self.timers.time("wait_read"):
            req, data = self._q.get()
            if req is None:
                raise data
            if req is self._DONE or req != expected:
                raise AssertionError(f"read order mismatch: planned {req}, executor wants {expected}")
            return data.result()  # the read's own error (a truncated file) is raised here, in order

    def close(self) -> None:
        """Stop issuing; wait for the reads in flight (none may write into a buffer after this)."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._q.get(timeout=0.05)
            except queue.Empty:
                pass
        self._pool.shutdown(wait=True, cancel_futures=True)


class ReadStage:
    """The read stage: performs the schedule's reads in order and hands each one's data over.

    With `overlap` a :class:`Prefetcher` reads ahead on `threads` threads, else each read happens
    when the compute asks for it; either way `budget` counts the bytes read and not yet released.
    Data for a device other than the CPU is moved there (asynchronously from pinned memory).
    """

    def __init__(self, requests: Iterable[Read], budget: ByteBudget, loader: Callable[[Read], torch.Tensor],
                 device: torch.device, overlap: bool = True, timers: Timers | None = None, threads: int = 1, bind=None):
        self.budget = budget
        self.loader = loader
        self.device = device
        self._prefetch = Prefetcher(requests, budget, loader, timers, threads, bind) if overlap else None

    def fetch(self, req: Read) -> torch.Tensor:
        """The data of the next planned read, `req`."""
        if self._prefetch is not None:
            data = self._prefetch.get(req)
        else:
            self.budget.acquire(req.nbytes)
            data = self.loader(req)
        if not req.raw and self.device.type != "cpu":
            data = data.to(self.device, non_blocking=True)
        return data

    def release(self, req: Read) -> None:
        """`req`'s data is consumed: its bytes no longer count against the budget."""
        self.budget.release(req.nbytes)

    def close(self) -> None:
        if self._prefetch is not None:
            self._prefetch.close()


class _Join:
    """A barrier between write lanes: the last of `count` lanes to reach it goes on with its item."""

    def __init__(self, count: int):
        self.count = count
        self._lock = threading.Lock()

    def arrive(self) -> bool:
        """One lane is here; True for the last one."""
        with self._lock:
            self.count -= 1
            return self.count == 0


class AsyncWriter:
    """Writes ``(name, tensor, byte offset)`` items behind the compute, on `lanes` threads, and
    digests every task.

    An output always goes to the same lane (by its name), so its writes, and its streaming
    digest, keep their order; different outputs are written at once (``pwrite`` at planned
    offsets needs no order between them). ``task_done(i)`` is ordered after the task's writes:
    when every lane holding one of its outputs has written it, ``on_task_written(i, digest)`` is
    called (the resume journal; :mod:`~quantize_cli.run.checksum`), and ``on_task_parts(i, {output:
    digest})`` when given (a Ray shard task: the driver joins the parts of a task written by several
    shard tasks). ``threaded=False``: every item is done at once on the caller's thread.
    """

    def __init__(self, writer, budget: ByteBudget, on_task_written: Callable[[int, str], None], threaded: bool = True,
                 timers: Timers | None = None, on_task_parts: Callable[[int, dict], None] | None = None, lanes: int = 1):
        self.timers = timers or Timers()
        self.writer = writer
        self.budget = budget
        self.on_task_written = on_task_written
        self.on_task_parts = on_task_parts
        self._hash: dict = {}  # output name -> streaming hasher (bytes arrive in offset order: one lane per name)
        self._digests: dict = {}  # output name -> its finished digest, until its task is done
        self._error: BaseException | None = None
        self._queues: list[queue.Queue] = [queue.Queue() for _ in range(max(1, lanes))] if threaded else []
        self._threads = [threading.Thread(target=self._run, args=(q,), daemon=True, name=f"quantize-write-{k}")
                         for k, q in enumerate(self._queues)]
        for t in self._threads:
            t.start()

    def _lane(self, name: str) -> queue.Queue:
        return self._queues[zlib.crc32(name.encode()) % len(self._queues)]

    def _do(self, item) -> None:
        kind = item[0]
        if kind == "write":
            _, name, tensor, offset, nbytes, copied = item
            if copied is not None:  # the device-to-host copy into pinned memory must be complete
                with self.timers.time("write_wait_d2h"):
                    copied.synchronize()
            data = byte_view(tensor) if tensor.numel() else memoryview(b"")
            with self.timers.time("write_io"):
                self.writer.write_bytes(name, data, offset)
            with self.timers.time("write_digest"):
                h = self._hash.get(name)
                if h is None:
                    h = self._hash[name] = checksum.new()
                h.update(data)
            self.budget.release(nbytes)
        elif kind == "seal":  # this lane has written all of these outputs' bytes for the task
            for n in item[1]:
                h = self._hash.pop(n, None)
                self._digests[n] = h.hexdigest() if h is not None else checksum.EMPTY
        elif kind == "task":
            _, index, names = item
            parts = {n: self._digests.pop(n, checksum.EMPTY) for n in names}
            if self.on_task_parts is not None:
                self.on_task_parts(index, parts)
            self.on_task_written(index, checksum.task_digest(parts))
        elif kind == "call":
            item[1](self._error)

    def _run(self, q: queue.Queue) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            if item[0] == "join":  # a task's or a call's barrier: the last lane to reach it goes on
                _, join, after = item
                if join.arrive():
                    self._step(after)
                continue
            self._step(item)

    def _step(self, item) -> None:
        if self._error is not None:
            if item[0] == "write":
                self.budget.release(item[4])
            elif item[0] == "call":  # told of the error: a caller waiting on it must not hang
                self._call_quietly(item[1])
            return
        try:
            self._do(item)
        except BaseException as exc:
            self._error = self._error or exc
            if item[0] == "write":
                self.budget.release(item[4])

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, name: str, tensor: torch.Tensor, offset: int = 0) -> None:
        """Queue `tensor`'s bytes for output `name` at `offset` bytes into the tensor.

        A CUDA tensor is copied into pinned host memory asynchronously; the writer thread waits
        for that copy (a CUDA event), so the compute never blocks on device-to-host transfers.
        """
        self._raise()
        t = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        with self.timers.time("wait_write_budget"):  # before the pinned buffer exists: the budget bounds it
            self.budget.acquire(t.numel())
        copied = None
        if t.device.type == "cuda" and t.numel():
            with self.timers.time("d2h"):
                host = torch.empty(t.numel(), dtype=torch.uint8, pin_memory=True)
                host.copy_(t, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record()
            t = host
        elif t.device.type != "cpu":
            t = t.cpu()
        item = ("write", name, t, offset, t.numel(), copied)
        if not self._queues:
            self._step(item)
            self._raise()
        else:
            self._lane(name).put(item)

    def _after_lanes(self, lanes: list[queue.Queue], per_lane: Callable[[queue.Queue], object], item) -> None:
        """`item` once every lane of `lanes` has done what was queued before (and its `per_lane` item)."""
        if not lanes:
            lanes = self._queues[:1]
        join = _Join(len(lanes))
        for q in lanes:
            extra = per_lane(q)
            if extra is not None:
                q.put(extra)
            q.put(("join", join, item))

    def task_done(self, index: int, names: list[str]) -> None:
        self._raise()
        item = ("task", index, names)
        if not self._queues:
            self._step(("seal", names))
            self._step(item)
            self._raise()
            return
        by_lane: dict[int, list[str]] = {}
        for n in names:
            by_lane.setdefault(id(self._lane(n)), []).append(n)
        lanes = [q for q in self._queues if id(q) in by_lane]
        self._after_lanes(lanes, lambda q: ("seal", by_lane[id(q)]), item)

    def call(self, fn: Callable[[BaseException | None], None]) -> None:
        """Run ``fn(error)`` on a write thread once every earlier item is done; ``error`` is the
        failure that stopped the writes, or None (a shard worker closes a finished shard here)."""
        item = ("call", fn)
        if not self._queues:
            self._do(item)
            return
        self._after_lanes(self._queues, lambda q: None, item)

    def _call_quietly(self, fn) -> None:
        try:
            fn(self._error)
        except BaseException:  # noqa: BLE001 - the first error is the one reported
            pass

    def _stop_lanes(self, timeout: float | None) -> bool:
        for q in self._queues:
            q.put(None)
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            return False
        self._queues, self._threads = [], []
        return True

    def abort(self, timeout: float | None = None, cause: BaseException | None = None) -> bool:
        """After a failure elsewhere (`cause`, when known): drop every queued write and join the
        threads; callbacks still run (``call``) see `cause` as the error that stopped the writes.

        Returns True when the threads have stopped (no write runs after this returns); False when
        one is still inside a write after `timeout` seconds (then the files must stay open).
        """
        if self._threads:
            if self._error is None:
                self._error = cause or RuntimeError("aborted")
            return self._stop_lanes(timeout)
        return True

    def flush(self) -> None:
        """Wait until every queued write is on disk (page cache); raise the first write error."""
        if self._threads:
            self._stop_lanes(None)
        self._raise()
