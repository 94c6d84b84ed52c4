"""run/dispatch.py with a scripted pool: the order units are handed out, the dynamic queue, lost
workers and their replacements, the journal joining a task's parts. No torch, no Ray."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from quantize_cli.run import checksum
from quantize_cli.run.dispatch import WorkerLost, WorkersLost, dispatch, order


@dataclass(frozen=True)
class Task:
    outputs: tuple
    bytes_in: int = 0


@dataclass(frozen=True)
class Unit:
    shard: int
    tasks: tuple
    size: int

    @property
    def bytes_in(self) -> int:
        return self.size


class Plan:
    def __init__(self, tasks, shards):
        self.tasks = tasks
        self.shard_names = [f"s{i}" for i in range(shards)]


class Journal:
    def __init__(self):
        self.lines = []

    def append(self, i, digest):
        self.lines.append((i, digest))


class Pool:
    """Workers that finish a unit after `speed[w]` polls; `die[w]`: the poll at which worker w dies."""

    def __init__(self, speed: dict, die: dict | None = None, spare: int = 0):
        self.workers = list(speed)
        self.speed, self.die, self.spare = dict(speed), dict(die or {}), spare
        self.polls, self.log, self.cancelled = 0, [], None
        self.running: dict = {}  # handle -> (worker, unit, polls left)
        self.dead: set = set()
        self._starting: list = []

    def submit(self, w, unit, unit_done):
        h = object()
        self.log.append((w, unit.shard, unit_done))
        self.running[h] = [w, unit, self.speed[w]]
        return h

    def wait(self, handles, timeout):
        self.polls += 1
        for w, at in self.die.items():
            if self.polls == at:
                self.dead.add(w)
        ready = []
        by_worker = {}
        for h in handles:  # a worker writes its oldest unit first
            by_worker.setdefault(self.running[h][0], h)
        for w, h in by_worker.items():
            self.running[h][2] -= 1
            if self.running[h][2] <= 0 or w in self.dead:
                ready.append(h)
        return ready

    def result(self, h):
        w, unit, _ = self.running.pop(h)
        if w in self.dead:
            raise WorkerLost(f"worker {w} died")
        return {"shard": f"s{unit.shard}", "index": unit.shard, "bytes_in": unit.size, "seconds": 1.0, "skipped": False,
                "kept": 0, "worker": w, "parts": {i: {n: f"d-{n}"} for i, t in unit.tasks for n in t.outputs}}

    def replace(self, w):
        if self.spare:
            self.spare -= 1
            new = max(self.workers + self._starting) + 1
            self.speed[new] = self.speed[w]
            self._starting.append(new)

    def joined(self):
        new, self._starting = self._starting, []
        self.workers += new
        return new

    def starting(self):
        return len(self._starting)

    def cancel(self, handles):
        self.cancelled = list(handles)

    def tick(self):
        pass


def _plan(sizes):
    """One task per unit, except task 0 split between units 0 and 1 (one output each)."""
    tasks = [Task(("a.weight", "a.weight_scale"))] + [Task((f"t{i}.weight",)) for i in range(1, len(sizes))]
    units = [Unit(0, ((0, Task(("a.weight",))),), sizes[0]), Unit(1, ((0, Task(("a.weight_scale",))), (1, tasks[1])), sizes[1])]
    units += [Unit(s, ((s, tasks[s]),), sizes[s]) for s in range(2, len(sizes))]
    return Plan(tasks, len(sizes)), units


def test_largest_first_then_shard_order():
    _, units = _plan([5, 9, 5, 9, 1])
    assert [u.shard for u in order(units, set())] == [1, 3, 0, 2, 4]
    assert [u.shard for u in order(units, {1, 3})] == [1, 0, 2, 4]  # unit 3 is done; unit 1 still has task 0


def test_a_split_task_is_journaled_once_all_its_parts_are_in():
    plan, units = _plan([4, 4, 4])
    journal = Journal()
    res = dispatch(Pool({0: 1}), plan, units, set(), journal, ahead_bytes=0)
    assert sorted(res) == [0, 1, 2]
    assert sorted(journal.lines) == [(0, checksum.task_digest({"a.weight": "d-a.weight", "a.weight_scale": "d-a.weight_scale"})),
                                     (1, checksum.task_digest({"t1.weight": "d-t1.weight"})),
                                     (2, checksum.task_digest({"t2.weight": "d-t2.weight"}))]


def test_the_queue_is_dynamic_and_workers_hold_what_their_read_ahead_covers():
    plan, units = _plan([4] * 12)
    pool = Pool({0: 1, 1: 6})  # worker 0 is six times faster
    res = dispatch(pool, plan, units, set(), Journal(), ahead_bytes=0)
    by = [r["worker"] for _, r in sorted(res.items())]
    assert by.count(0) > 2 * by.count(1) >= 2
    held = Pool({0: 1})
    dispatch(held, plan, units, set(), Journal(), ahead_bytes=10)  # 10 bytes ahead: the running unit + 3 queued of 4 bytes
    assert [s for _, s, _ in held.log[:4]] == [0, 1, 2, 3] and len(held.running) == 0


def test_done_tasks_are_passed_and_done_units_skipped():
    plan, units = _plan([4, 4, 4])
    pool = Pool({0: 1})
    res = dispatch(pool, plan, units, {0, 2}, Journal(), ahead_bytes=0)
    assert res[0]["skipped"] and res[2]["skipped"] and res[2]["kept"] == 1 and not res[1]["skipped"]
    assert pool.log == [(0, 1, frozenset({0}))]  # only unit 1 runs, told that its first task is done


def test_a_lost_worker_s_units_are_redone_by_the_others_and_by_its_replacement():
    plan, units = _plan([4] * 8)
    journal = Journal()
    pool = Pool({0: 2, 1: 2}, die={1: 3}, spare=1)
    res = dispatch(pool, plan, units, set(), journal, ahead_bytes=0)
    assert sorted(res) == list(range(8)) and len(journal.lines) == 8
    assert any(r["worker"] == 2 for r in res.values())  # the replacement took work
    shards = [s for _, s, _ in pool.log]
    again = {s for s in shards if shards.count(s) == 2}
    assert again and all(res[s]["worker"] != 1 for s in again)  # what worker 1 held when it died was redone by others


def test_no_worker_left_keeps_the_work_folder():
    plan, units = _plan([4] * 4)
    with pytest.raises(WorkersLost, match="every worker was lost"):
        dispatch(Pool({0: 3}, die={0: 1}), plan, units, set(), Journal(), ahead_bytes=0)
    flaky = Pool({0: 3, 1: 3}, die={0: 1}, spare=10)
    flaky.replace = lambda w: (flaky._starting.append(max(flaky.workers + flaky._starting) + 1),
                               flaky.speed.__setitem__(flaky._starting[-1], 3), flaky.die.__setitem__(flaky._starting[-1], flaky.polls + 2))
    with pytest.raises(WorkersLost, match="its worker was lost 4 times"):
        dispatch(flaky, plan, units, set(), Journal(), ahead_bytes=0, max_retries=3)


def test_an_error_cancels_the_rest_and_is_raised_as_it_is():
    plan, units = _plan([4] * 6)
    pool = Pool({0: 1, 1: 5})
    real = pool.result

    def result(h):
        r = real(h)
        if r["index"] == 2:
            raise ValueError("NaN in t2.weight")
        return r

    pool.result = result
    with pytest.raises(ValueError, match="NaN in t2.weight"):
        dispatch(pool, plan, units, set(), Journal(), ahead_bytes=0)
    assert pool.cancelled  # worker 1 still held units
