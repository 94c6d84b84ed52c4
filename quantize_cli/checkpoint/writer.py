"""Streaming safetensors writer: every header is written first, tensors land at fixed offsets.

The plan knows every output tensor's dtype, shape, shard and offset, so each shard file is created
at its final size with its header in place, and tensor bytes (or row chunks of them) are written
with ``pwrite`` in any order. Nothing is buffered beyond the chunk being written. Headers follow
the safetensors layout (compact JSON, ``__metadata__ = {"format": "pt"}`` first, space-padded to
8 bytes) so ``safetensors.safe_open`` and every loader read the files.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import shutil
import threading

from ..errors import DestinationError
from .durable import write_atomic
from .safetensors_header import shard_header

# Big writes start their writeback at once: otherwise the kernel keeps gigabytes dirty until the
# final fsync, and the output write no longer overlaps the source read.
WRITEBACK_MIN = 1 << 20
# At most this much written data may wait for writeback: past it, the writer waits for the
# oldest ranges to reach the disk. Reads and writes then share the disk all along, instead of the
# reads running ahead and the whole output being flushed at the end.
DIRTY_LIMIT = 512 << 20


_SYNC_WAIT_BEFORE, _SYNC_WRITE, _SYNC_WAIT_AFTER = 1, 2, 4  # <linux/fs.h> sync_file_range flags


def _load_sync_file_range():
    """libc's sync_file_range(2) (Python's os module has no binding), or None off Linux/glibc."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()


def _wait_writeback(fd: int, pos: int, length: int) -> None:
    """Block until this range is on disk (best effort; the final fsync makes it durable anyway)."""
    if _sync_file_range is not None:
        _sync_file_range(fd, pos, length, _SYNC_WAIT_BEFORE | _SYNC_WRITE | _SYNC_WAIT_AFTER)


def _start_writeback(fd: int, pos: int, length: int) -> None:
    """Ask the kernel to begin writing this range to disk now (asynchronous; ctypes drops the GIL)."""
    if _sync_file_range is not None:
        _sync_file_range(fd, pos, length, _SYNC_WRITE)


class ShardWriter:
    """Writes the planned shards into `folder` (see the module docstring).

    `only`: the shard indices this writer owns (a scale-out worker writes its own shards; writes
    to outputs of other shards are dropped, and the index is left to the driver). None: all.
    """

    def __init__(self, folder: str, outputs: dict, shard_names: list[str], only=None):
        self.folder = folder
        self.outputs = outputs
        self.shard_names = shard_names
        self.only = None if only is None else set(only)
        self._fds: dict[int, int] = {}
        self._data_start: dict[int, int] = {}
        self._dirty: collections.deque = collections.deque()
        self._dirty_bytes = 0
        self._dirty_lock = threading.Lock()  # several write lanes (run/pipeline.py) share one writer

    def paths(self) -> list[str]:
        return [os.path.join(self.folder, n) for n in self.shard_names]

    def open(self, fresh: bool = True) -> None:
        """Create (or, when resuming, reopen) every shard at its final size with its header."""
        per_shard: list[list] = [[] for _ in self.shard_names]
        for o in sorted(self.outputs.values(), key=lambda o: o.offset):
            per_shard[o.shard].append(o)
        for shard, (path, tensors) in enumerate(zip(self.paths(), per_shard)):
            if self.only is not None and shard not in self.only:
                continue
            header = shard_header(tensors)
            size = len(header) + sum(t.nbytes for t in tensors)
            try:
                if os.path.islink(path) or (os.path.lexists(path) and not os.path.isfile(path)):
                    # our own (locked) work folder holds something else under a shard's name: a damaged
                    # earlier run; replace it (its journaled tasks then fail their CRC and are redone)
                    shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | (os.O_TRUNC if fresh else 0) | os.O_NOFOLLOW, 0o644)
                os.pwrite(fd, header, 0)
                os.ftruncate(fd, size)
            except OSError as exc:
                raise DestinationError(f"{path}: cannot create output shard ({exc.strerror}); check space and permissions") from exc
            self._fds[shard] = fd
            self._data_start[shard] = len(header)

    def _writeback(self, fd: int, pos: int, length: int) -> None:
        _start_writeback(fd, pos, length)
        while True:
            with self._dirty_lock:  # the wait itself runs unlocked: other lanes go on writing meanwhile
                if length:
                    self._dirty.append((fd, pos, length))
                    self._dirty_bytes += length
                    length = 0
                if self._dirty_bytes <= DIRTY_LIMIT or not self._dirty:
                    return
                old_fd, old_pos, old_len = self._dirty.popleft()
                self._dirty_bytes -= old_len
            _wait_writeback(old_fd, old_pos, old_len)

    def data_start(self, shard: int) -> int:
        """Byte offset of shard `shard`'s data section (after its header)."""
        return self._data_start[shard]

    def write(self, name: str, tensor, byte_offset: int = 0) -> None:
        """Write `tensor` (a torch tensor, any dtype) into output `name`, starting `byte_offset` bytes in.
        (torch is imported here only: a Ray driver writes the index with this module and no torch.)"""
        import torch

        from .safetensors_io import byte_view

        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous().reshape(-1)
        self.write_bytes(name, byte_view(t.view(torch.uint8)) if t.numel() else memoryview(b""), byte_offset)

    def write_bytes(self, name: str, data: memoryview, byte_offset: int = 0) -> None:
        """Write raw bytes into output `name` at `byte_offset` within the tensor."""
        o = self.outputs[name]
        if self.only is not None and o.shard not in self.only:
            return
        if byte_offset + len(data) > o.nbytes:
            raise AssertionError(f"{name}: write past the tensor end ({byte_offset}+{len(data)} > {o.nbytes})")
        pos = self._data_start[o.shard] + o.offset + byte_offset
        fd = self._fds[o.shard]
        done = 0
        try:
            while done < len(data):
                done += os.pwrite(fd, data[done:], pos + done)
            if len(data) >= WRITEBACK_MIN:
                self._writeback(fd, pos, len(data))
        except OSError as exc:
            raise DestinationError(
                f"{self.shard_names[o.shard]}: write failed while writing {name!r} ({exc.strerror}); free disk space and rerun with --resume"
            ) from exc

    def abort(self) -> None:
        """Close every shard without syncing or writing the index (the run failed)."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():  # shard index -> fd
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self, sync: bool = True) -> None:
        """fsync and close every shard (the index is the output's: output/workfolder.py, unpack.py)."""
        try:
            for fd in self._fds.values():
                if sync:
                    os.fsync(fd)
                os.close(fd)
        finally:
            self._fds = {}


def write_index(folder: str, outputs: dict, shard_names: list[str]) -> None:
    """``model.safetensors.index.json``: total size and the sorted weight map."""
    wmap = {name: shard_names[o.shard] for name, o in sorted(outputs.items())}
    doc = {"metadata": {"total_size": sum(o.nbytes for o in outputs.values())}, "weight_map": wmap}
    write_atomic(os.path.join(folder, "model.safetensors.index.json"), (json.dumps(doc, indent=2) + "\n").encode())
