"""The host pipeline's parallel reads and write lanes (issue 34): order, barriers and bytes.

Reads run on several threads but reach the compute in plan order; an output's writes stay on one
lane (its digest sees its bytes in order); a task is journaled only after every lane holding one of
its outputs wrote it; and a whole conversion writes the same bytes and journal with one thread or many.
"""

import os
import random
import threading
import time

import pytest
import torch

from quantize_cli.checkpoint.safetensors_io import TensorInfo
from quantize_cli.run import checksum
from quantize_cli.run.context import io_threads
from quantize_cli.run.pipeline import AsyncWriter, ByteBudget, Prefetcher, Read
from tests.conftest import convert


def _reads(n):
    info = TensorInfo(name="t", dtype="U8", shape=(n,), path="/nonexistent", offset=0, nbytes=n)
    return [Read(info, i, 1) for i in range(n)]


def test_reads_run_at_once_and_arrive_in_plan_order():
    reqs = _reads(40)
    running, peak, lock = [0], [0], threading.Lock()

    def loader(req):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(random.Random(req.start).uniform(0.001, 0.02))  # later reads often finish first
        with lock:
            running[0] -= 1
        return torch.tensor([req.start])

    budget = ByteBudget(1 << 20)
    p = Prefetcher(iter(reqs), budget, loader, threads=4)
    got = []
    for r in reqs:
        got.append(int(p.get(r)))
        budget.release(r.nbytes)
    p.close()
    assert got == list(range(40))
    assert peak[0] > 1  # really in parallel


def test_a_read_error_is_raised_at_its_turn_and_close_waits_for_the_threads():
    reqs = _reads(6)

    def loader(req):
        if req.start == 3:
            raise OSError("boom")
        return torch.tensor([req.start])

    budget = ByteBudget(1 << 20)
    p = Prefetcher(iter(reqs), budget, loader, threads=3)
    assert [int(p.get(r)) for r in reqs[:3]] == [0, 1, 2]
    with pytest.raises(OSError, match="boom"):
        p.get(reqs[3])
    p.close()
    assert not any(t.name.startswith("quantize-read") for t in threading.enumerate())


def test_the_budget_bounds_reads_in_flight_with_many_threads():
    reqs = _reads(30)
    budget = ByteBudget(4)  # four one-byte reads at the most
    seen = []

    def loader(req):
        seen.append(budget.used)
        return torch.tensor([req.start])

    p = Prefetcher(iter(reqs), budget, loader, threads=8)
    for r in reqs:
        p.get(r)
        time.sleep(0.002)
        budget.release(r.nbytes)
    p.close()
    assert max(seen) <= 4 and budget.peak <= 4


class _Sink:
    """A ShardWriter stand-in: a bytearray per output, and a log of (thread, output) per write."""

    def __init__(self, sizes):
        self.data = {n: bytearray(s) for n, s in sizes.items()}
        self.threads = {}

    def write_bytes(self, name, data, offset=0):
        time.sleep(random.Random(offset + len(name)).uniform(0, 0.002))
        self.data[name][offset : offset + len(data)] = bytes(data)
        self.threads.setdefault(name, set()).add(threading.current_thread().name)


def _tasks():
    rng = random.Random(0)
    tasks = []
    for i in range(12):
        outs = {f"m{i}.o{k}": rng.randrange(1, 5000) for k in range(rng.randrange(1, 5))}
        tasks.append(outs)
    return tasks


def _write_all(lanes):
    tasks = _tasks()
    sizes = {n: s for outs in tasks for n, s in outs.items()}
    sink, journal = _Sink(sizes), {}
    complete_at_journal = {}

    def on_written(i, digest):
        # every byte of the task is in the sink when it is journaled
        complete_at_journal[i] = all(bytes(sink.data[n]) == _payload(n, s) for n, s in tasks[i].items())
        journal[i] = digest

    w = AsyncWriter(sink, ByteBudget(1 << 16), on_written, lanes=lanes)
    for i, outs in enumerate(tasks):
        for n, s in outs.items():
            data = torch.frombuffer(bytearray(_payload(n, s)), dtype=torch.uint8)
            for off in range(0, s, 1000):  # in chunks, in offset order
                w.write(n, data[off : off + 1000].clone(), off)
        w.task_done(i, list(outs))
    called = []
    w.call(lambda error: called.append((error, dict(journal))))
    w.flush()
    return sink, journal, complete_at_journal, called


def _payload(name, size):
    return bytes(random.Random(name).randrange(256) for _ in range(size))


def test_write_lanes_give_the_bytes_and_digests_of_one_lane_and_journal_complete_tasks():
    one = _write_all(1)
    four = _write_all(4)
    assert one[0].data == four[0].data
    assert one[1] == four[1] and len(four[1]) == 12  # every task journaled, same digests
    assert all(four[2].values()) and all(one[2].values())
    # the digest is the documented one: per output, of its bytes in order
    tasks = _tasks()
    parts = {n: _hex(_payload(n, s)) for n, s in tasks[5].items()}
    assert four[1][5] == checksum.task_digest(parts)
    # call() ran after every task was journaled, on one of the lanes
    (error, seen), = four[3]
    assert error is None and len(seen) == 12
    # an output stays on one lane; the outputs are spread over several
    assert all(len(t) == 1 for t in four[0].threads.values())
    assert len(set().union(*four[0].threads.values())) > 1


def _hex(b):
    h = checksum.new()
    h.update(b)
    return h.hexdigest()


def test_a_write_error_stops_every_lane_and_is_raised():
    class Failing(_Sink):
        def write_bytes(self, name, data, offset=0):
            if name == "m3.o0":
                raise OSError("disk full")
            super().write_bytes(name, data, offset)

    tasks = _tasks()
    w = AsyncWriter(Failing({n: s for o in tasks for n, s in o.items()}), ByteBudget(1 << 16), lambda i, d: None, lanes=3)
    with pytest.raises(OSError, match="disk full"):
        for i, outs in enumerate(tasks):
            for n, s in outs.items():
                w.write(n, torch.zeros(s, dtype=torch.uint8), 0)
            w.task_done(i, list(outs))
        w.flush()
    w.abort(5)


def test_io_threads_follow_the_machine_and_the_override(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert io_threads("read") > 2 and io_threads("write") > 2
    monkeypatch.setenv("QUANTIZE_IO_THREADS", "1")
    assert io_threads("read") == io_threads("write") == 1


@pytest.mark.parametrize("algo", ["FP8", "NVFP4"])
def test_one_thread_and_many_write_the_same_output_and_journal(tiny_llama, tmp_path, monkeypatch, algo):
    outs = {}
    for threads in ("1", "6"):
        monkeypatch.setenv("QUANTIZE_IO_THREADS", threads)
        (tmp_path / threads).mkdir()
        dst = tmp_path / threads / "out"  # one name: the card names the folder
        convert(tiny_llama, str(dst), algo=algo, quiet=True, max_shard_size="1MB", memory_budget="64MB")
        outs[threads] = {f: (dst / f).read_bytes() for f in sorted(os.listdir(dst))}
    assert outs["1"].keys() == outs["6"].keys() and len([f for f in outs["1"] if f.endswith(".safetensors")]) > 1
    assert outs["1"] == outs["6"]  # shards, index, the seal of journal digests
