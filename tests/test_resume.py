"""--resume: an interrupted conversion continues from verified work to identical bytes."""

import os

import pytest

from tests.conftest import output_files

import quantize_cli.run.pipeline as pipeline
from tests.conftest import convert
from quantize_cli.errors import DestinationError


def files(folder):
    return output_files(folder)


def interrupt_after(monkeypatch, n):
    real = pipeline.AsyncWriter._do
    count = {"tasks": 0}

    def do(self, item):
        if item[0] == "task":
            count["tasks"] += 1
            if count["tasks"] == n:
                raise KeyboardInterrupt
        return real(self, item)

    monkeypatch.setattr(pipeline.AsyncWriter, "_do", do)


@pytest.mark.parametrize("algo,after", [("FP8_PB_WO", 3), ("NVFP4", 10), ("FP8", 12)])
def test_interrupted_then_resumed_is_byte_identical(tiny_llama, tmp_path, monkeypatch, algo, after):
    convert(tiny_llama, str(tmp_path / "ref"), algo=algo, quiet=True, max_shard_size="1MB")
    interrupt_after(monkeypatch, after)
    with pytest.raises(KeyboardInterrupt):
        convert(tiny_llama, str(tmp_path / "out"), algo=algo, quiet=True, max_shard_size="1MB")
    monkeypatch.undo()
    assert not (tmp_path / "out").exists() and (tmp_path / ".out.partial").is_dir()
    journal = (tmp_path / ".out.partial" / ".quantize-journal").read_text().split()
    assert len(journal) >= 2  # some tasks were complete before the interruption
    convert(tiny_llama, str(tmp_path / "out"), algo=algo, quiet=True, max_shard_size="1MB", resume=True)
    assert files(tmp_path / "out") == files(tmp_path / "ref")
    assert not (tmp_path / ".out.partial").exists()


def test_resume_refuses_other_options_and_a_changed_source(tiny_llama, tmp_path, monkeypatch):
    interrupt_after(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        convert(tiny_llama, str(tmp_path / "out"), algo="FP8", quiet=True)
    monkeypatch.undo()
    before = {f: os.path.getsize(tmp_path / ".out.partial" / f) for f in os.listdir(tmp_path / ".out.partial")}
    with pytest.raises(DestinationError, match="used --algo FP8, this run asks for NVFP4.*nothing was changed"):
        convert(tiny_llama, str(tmp_path / "out"), algo="NVFP4", quiet=True, resume=True)
    after = {f: os.path.getsize(tmp_path / ".out.partial" / f) for f in os.listdir(tmp_path / ".out.partial")}
    assert after == before  # a refused --resume touches nothing (no shard truncated, the journal kept)
    shard = os.path.join(tiny_llama, "model-00001-of-00002.safetensors")
    os.utime(shard, ns=(1, 1))  # same bytes, new identity (mtime): refused too
    with pytest.raises(DestinationError, match="used source files that changed since"):
        convert(tiny_llama, str(tmp_path / "out"), algo="FP8", quiet=True, resume=True)
    convert(tiny_llama, str(tmp_path / "out"), algo="FP8", quiet=True)  # without --resume: starts over
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_journaled_task_with_damaged_bytes_is_redone(tiny_llama, tmp_path, monkeypatch):
    convert(tiny_llama, str(tmp_path / "ref"), algo="NVFP4", quiet=True)
    interrupt_after(monkeypatch, 12)
    with pytest.raises(KeyboardInterrupt):
        convert(tiny_llama, str(tmp_path / "out"), algo="NVFP4", quiet=True)
    monkeypatch.undo()
    shard = tmp_path / ".out.partial" / "model.safetensors"
    data = bytearray(shard.read_bytes())
    for pos in range(2000, len(data) // 3, 997):  # scribble over the first third of the data
        data[pos] ^= 0xFF
    shard.write_bytes(bytes(data))
    convert(tiny_llama, str(tmp_path / "out"), algo="NVFP4", quiet=True, resume=True)
    assert files(tmp_path / "out") == files(tmp_path / "ref")


def test_resume_without_earlier_work_starts_fresh(tiny_llama, tmp_path):
    convert(tiny_llama, str(tmp_path / "out"), algo="FP8_PB_WO", quiet=True, resume=True)
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_serial_and_overlapped_pipelines_write_the_same_bytes(tiny_llama, tmp_path):
    from quantize_cli.api import prepare
    from quantize_cli.checkpoint.writer import ShardWriter
    from quantize_cli.run.execute import Executor
    import torch

    for overlap in (False, True):
        plan = prepare(tiny_llama, "NVFP4")
        folder = tmp_path / f"o{int(overlap)}"
        folder.mkdir()
        w = ShardWriter(str(folder), plan.outputs, plan.shard_names)
        w.open()
        Executor(plan, w, torch.device("cpu"), chunk_bytes=64 << 10, hold_bytes=100 << 10, budget_bytes=1 << 20, overlap=overlap).run()
        w.close()
    assert files(tmp_path / "o0") == files(tmp_path / "o1")
