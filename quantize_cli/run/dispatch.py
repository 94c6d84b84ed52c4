"""Hand output shards to long-lived workers and journal each plan task once all of it is written.

Both scale-out executors drive their workers through :func:`dispatch`: Ray (one actor per GPU
or per few CPUs, ``ray_executor.py``) and several devices in one process (one
:class:`~.shard_stream.ShardStream` per device, ``local_devices.py``). A *pool* adapts the
workers: ``workers`` (their ids), ``submit(worker, unit, unit_done) -> handle``,
``wait(handles, timeout) -> ready handles``, ``result(handle) -> dict`` (raising
:class:`WorkerLost` when the worker died), ``replace(worker)`` (start another in its place, if it
can), ``joined() -> new worker ids`` (replacements now ready), ``starting() -> int`` (replacements
not ready yet), ``cancel(handles)`` and ``tick()`` (progress).

How shards are assigned:

- **Largest first** (the source bytes a unit reads), ties in shard order: the longest units start
  first, so the last one to finish is short (longest-processing-time-first), and equal shards are
  handed out in file order (sequential reads of the source).
- **A dynamic queue**: each worker holds its running unit plus queued ones worth its read-ahead (at
  least one more, at most ``max_units`` in all), so its read stage goes from one shard to the next
  without waiting for the driver; units are dealt one at a time around the workers, and a worker
  that is done takes the next unit from the queue, so a slow one takes fewer.
- **Lost workers** (a killed process, a node removed): the units they held go back to the front of
  the queue, each at most ``max_retries`` times, for the other workers and for a replacement the
  pool starts where the cluster has room; a shard is rewritten whole at its planned offsets, so the
  bytes equal an uninterrupted run. With no worker left nor starting, the run stops, keeping the
  work folder for ``--resume``.
- **Any other error** (NaN in a weight, a full disk) stops the run at once; the rest is cancelled.

The journal gets one line per plan task once every shard holding a part of it has been written
(``<task> <digest>``, the digest of all its outputs, as the local executor writes it), so a
``--resume`` may switch executors.
"""

from __future__ import annotations

import collections

from ..errors import DestinationError
from . import checksum

MAX_RETRIES = 3  # times one shard is handed out again after its worker was lost
MAX_UNITS = 4  # units one worker holds at once: running + queued (a Ray worker spends a thread on each)
WAIT_S = 0.5  # how often the driver looks up (progress bar)


class WorkerLost(Exception):
    """A pool's ``result()``: the worker holding this unit died (its process or its node)."""


class WorkersLost(DestinationError):
    """No worker is left, or a shard lost its worker too often: the work folder is kept (--resume)."""


def order(units, done: set[int]) -> list:
    """The units with work left, in the order they are handed out (largest first, then shard order)."""
    todo = [u for u in units if any(i not in done for i, _ in u.tasks)]
    return sorted(todo, key=lambda u: (-u.bytes_in, u.shard))


def dispatch(pool, plan, units, done: set[int], journal, ahead_bytes: int, say=lambda msg: None,
             max_retries: int = MAX_RETRIES, max_units: int = MAX_UNITS) -> dict[int, dict]:
    """Write every unit with work left through `pool`'s workers; journal each plan task once all of its
    parts are written. Returns ``{shard: result}``, a unit with nothing left as ``skipped``."""
    queue = collections.deque(order(units, done))
    results = {u.shard: {"shard": plan.shard_names[u.shard], "index": u.shard, "bytes_in": u.bytes_in, "host": None,
                         "node_id": None, "seconds": 0.0, "skipped": True, "kept": len(u.tasks)} for u in units if u not in queue}
    live = list(pool.workers)
    held: dict = {w: [] for w in live}  # worker -> its units, oldest (running) first
    pending: dict = {}  # handle -> (worker, unit)
    retries: collections.Counter = collections.Counter()
    parts: dict[int, dict[str, str]] = {}

    def wants(w) -> bool:
        n = len(held[w])
        return n < 2 or (n < max_units and sum(u.bytes_in for u in held[w][1:]) < ahead_bytes)

    def feed() -> None:  # one unit at a time around the workers
        while queue and (hungry := [w for w in live if wants(w)]):
            for w in hungry:
                if not queue:
                    break
                u = queue.popleft()
                unit_done = frozenset(k for k, (i, _) in enumerate(u.tasks) if i in done)
                pending[pool.submit(w, u, unit_done)] = (w, u)
                held[w].append(u)

    def lose(w, why: str) -> None:
        if w not in live:
            return
        live.remove(w)
        units_back = held.pop(w)
        for h in [h for h, (x, _) in pending.items() if x == w]:
            del pending[h]
        for u in reversed(units_back):
            retries[u.shard] += 1
            if retries[u.shard] > max_retries:
                raise WorkersLost(f"shard {plan.shard_names[u.shard]}: its worker was lost {retries[u.shard]} times ({why}); "
                                  f"the work folder is kept: rerun with --resume once the workers are healthy")
            queue.appendleft(u)
        pool.replace(w)
        if not live and not pool.starting():
            raise WorkersLost(f"every worker was lost ({why}); the work folder is kept: rerun with --resume once the "
                              f"workers are healthy")
        say(f"a worker was lost ({why}): its {len(units_back)} shard(s) go back to the queue "
            f"({len(live)} worker(s) left, {pool.starting()} starting)")

    try:
        feed()
        while pending or queue:
            for w in pool.joined():
                live.append(w)
                held[w] = []
            feed()
            if not live and not pool.starting():
                raise WorkersLost("every worker was lost and none could be started again; the work folder is kept: "
                                  "rerun with --resume once the workers are healthy")
            for h in pool.wait(list(pending), WAIT_S):
                if h not in pending:  # a lost worker's unit, already handed out again
                    continue
                w, u = pending.pop(h)
                try:
                    res = pool.result(h)
                except WorkerLost as exc:
                    lose(w, str(exc))
                    continue
                held[w].remove(u)
                results[u.shard] = res
                _join(plan, res["parts"], parts, journal)
            feed()
            pool.tick()
    except BaseException:
        pool.cancel(list(pending))
        raise
    return results


def _join(plan, got: dict, parts: dict, journal) -> None:
    """Add one unit's per-output digests; journal the plan tasks now complete."""
    for i, digests in got.items():
        parts.setdefault(i, {}).update(digests)
        if set(parts[i]) == set(plan.tasks[i].outputs):
            journal.append(i, checksum.task_digest(parts.pop(i)))


__all__ = ["dispatch", "order", "WorkerLost", "WorkersLost", "MAX_RETRIES", "MAX_UNITS", "WAIT_S"]
