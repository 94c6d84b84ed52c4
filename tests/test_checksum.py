"""The resume journal digests (checksum.py)."""

import pytest

from quantize_cli.run import checksum
from quantize_cli.run.pipeline import AsyncWriter, ByteBudget


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
