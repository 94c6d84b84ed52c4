"""The read schedule is the one description of a run's reads: the compute consumes exactly it."""

import pytest
import torch

from quantize_cli.api import prepare
from quantize_cli.run.context import executor_sizes
from quantize_cli.checkpoint.writer import ShardWriter
from quantize_cli.run.execute import Executor
from quantize_cli.run.schedule import Amax, Hold, PackExperts, PackGroup, Quantize, Schedule, Share, reads
from tests.conftest import output_files


def _run(plan, folder, sizes, overlap):
    folder.mkdir()
    w = ShardWriter(str(folder), plan.outputs, plan.shard_names)
    w.open()
    Executor(plan, w, torch.device("cpu"), **sizes, overlap=overlap).run()
    w.close()


@pytest.mark.parametrize("example,algo,layout,budget", [
    ("tiny-llama", "NVFP4", "plain", 4 << 30),      # fused groups held whole
    ("tiny-llama", "NVFP4", "plain", 1 << 20),      # row chunks, amax pass then quantize pass
    ("tiny-llama", "FP8_PB_WO", "plain", 1 << 20),  # row chunks, no shared amax
    ("tiny-llama", "NVFP4", "marlin", 1 << 20),     # dense packing: whole members, amax pass
    ("tiny-qwen3-moe", "NVFP4", "flashinfer", 4 << 30),  # MoE layers packed in slices
    ("tiny-qwen3-moe", "FP8", "plain", 64 << 10),
])
def test_the_compute_consumes_exactly_the_schedule(tmp_path, monkeypatch, example, algo, layout, budget):
    """Serially (no read-ahead to check the order) the reads the compute asks for are the schedule's
    reads, in order; the overlapped run (which checks every read against it) writes the same bytes."""
    import quantize_cli.run.execute as ex

    plan = prepare(f"example:{example}", algo, layout=layout)
    sizes = executor_sizes(budget)
    asked = []
    real = ex.load
    monkeypatch.setattr(ex, "load", lambda req, pin, reader: asked.append(req) or real(req, pin, reader))
    _run(plan, tmp_path / "serial", sizes, overlap=False)
    assert asked == Schedule(plan, **sizes).reads(plan.tasks)
    monkeypatch.undo()
    _run(plan, tmp_path / "overlap", sizes, overlap=True)
    assert output_files(tmp_path / "serial") == output_files(tmp_path / "overlap")


def test_steps_say_how_each_task_is_run():
    """A small hold limit turns a fused group's held read into an amax pass plus a quantize pass;
    MoE experts are packed in slices that fit the hold limit."""
    plan = prepare("example:tiny-llama", "NVFP4")
    qkv = next(t for t in plan.tasks if t.kind == "quantize" and len(t.members) == 3)
    held = Schedule(plan, chunk_bytes=1 << 30, hold_bytes=1 << 30).steps(qkv)
    assert [type(s) for s in held] == [Hold] * 3 + [Share] + [Quantize] * 3
    assert reads(held) == [s.read for s in held[:3]]  # held data is read once
    chunked = Schedule(plan, chunk_bytes=16 << 10, hold_bytes=16 << 10).steps(qkv)
    amax = [s for s in chunked if isinstance(s, Amax)]
    quant = [s for s in chunked if isinstance(s, Quantize)]
    assert len(amax) == len(quant) > 3 and [s.read for s in amax] == [s.read for s in quant]
    assert isinstance(chunked[len(amax)], Share) and all(s.shared and not s.held for s in quant)

    moe = prepare("example:tiny-qwen3-moe", "NVFP4", layout="flashinfer")
    task = next(t for t in moe.tasks if t.kind == "moe")
    n = len(task.members) // 3
    per_expert = sum(m.source.nbytes for m in task.members[:3])
    packs = [s for s in Schedule(moe, hold_bytes=2 * per_expert).steps(task) if isinstance(s, PackExperts)]
    assert [(p.first, p.count) for p in packs] == [(f, min(2, n - f)) for f in range(0, n, 2)]
    marlin = prepare("example:tiny-llama", "NVFP4", layout="marlin")
    dense = next(t for t in marlin.tasks if t.kind == "quantize")
    steps = Schedule(marlin).steps(dense)
    assert isinstance(steps[-1], PackGroup) and all(s.collect for s in steps if isinstance(s, Quantize))
