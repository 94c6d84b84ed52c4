"""Start-up overlap (warmup.py) and the journal digests (checksum.py)."""

import json
import os

import pytest

from quantize_cli import checksum, warmup
from quantize_cli.api import prepare
from quantize_cli.pipeline import AsyncWriter, ByteBudget


def test_prefetch_follows_the_converters_read_order(tiny_llama):
    plan = prepare(tiny_llama, "FP8_PB_WO")
    read_order = list(dict.fromkeys(s.path for t in plan.tasks for s in t.sources))
    assert len(read_order) == 2
    assert [os.path.abspath(p) for p in warmup.source_files(tiny_llama)] == [os.path.abspath(p) for p in read_order]


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # the thread must never raise
def test_prefetch_runs_and_ignores_what_it_cannot_read(tiny_llama, tmp_path):
    thread = warmup.prefetch_source(tiny_llama, cap=1 << 20)  # smaller than the checkpoint: stops at the cap
    assert thread is not None
    thread.join(10)
    assert not thread.is_alive()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../../etc/passwd", "b": 3}}))
    assert warmup.source_files(str(broken)) == []  # names outside the folder or not strings are never opened
    assert warmup.prefetch_source(str(broken)) is None
    assert warmup.prefetch_source("owner/repo") is None  # a Hub id: nothing local to warm
    odd = tmp_path / "odd"
    odd.mkdir()
    os.mkfifo(odd / "a.safetensors")  # opening a FIFO for reading would block
    (odd / "b.safetensors").mkdir()
    (odd / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "a.safetensors", "y": "b.safetensors", "z": "c\u0000.safetensors"}}))
    thread = warmup.prefetch_source(str(odd))
    thread.join(10)
    assert not thread.is_alive()  # finished without blocking or raising
    assert warmup.prefetch_source("example:tiny-llama") is None


def test_prefetch_falls_back_to_the_folder_listing(tmp_path):
    (tmp_path / "b.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "a.safetensors").write_bytes(b"y" * 10)
    (tmp_path / "notes.txt").write_text("not a shard")
    assert [os.path.basename(p) for p in warmup.source_files(str(tmp_path))] == ["a.safetensors", "b.safetensors"]


class _Sink:
    def __init__(self):
        self.data = {}

    def write_bytes(self, name, data, offset):
        buf = self.data.setdefault(name, bytearray())
        assert offset == len(buf)
        buf += bytes(data)


@pytest.mark.parametrize("chunks", [1, 3])
def test_task_digest_does_not_depend_on_chunking(tmp_path, chunks):
    import torch

    payload = torch.arange(3000, dtype=torch.int32).view(torch.uint8)
    got = {}
    writer = AsyncWriter(_Sink(), ByteBudget(1 << 20), lambda i, d: got.setdefault(i, d), threaded=False)
    step = -(-payload.numel() // chunks)
    for start in range(0, payload.numel(), step):
        writer.write("w", payload[start : start + step], start)
    writer.task_done(0, ["w", "empty"])
    path = tmp_path / "f.bin"
    path.write_bytes(b"head" + payload.numpy().tobytes())
    on_disk = {"w": checksum.file_range(str(path), 4, payload.numel()), "empty": checksum.file_range(str(path), 0, 0)}
    assert got[0] == checksum.task_digest(on_disk)
    assert checksum.file_range(str(path), 4, payload.numel() + 1) is None  # truncated: no digest
    path.write_bytes(b"head" + b"\x01" + payload.numpy().tobytes()[1:])  # one byte changed
    assert checksum.file_range(str(path), 4, payload.numel()) != on_disk["w"]
