"""Durable small files: written whole or not at all, and on disk before DST is renamed into place.

The shards are fsynced by :class:`~quantize_cli.checkpoint.writer.ShardWriter`; everything else
the output holds (config.json, hf_quant_config.json, the index, copied sidecars) and the resume
state go through here, so a power cut after the final rename never leaves a finished-looking DST
with an empty config, and a crash while the state file is rewritten never leaves half a file.
"""

from __future__ import annotations

import json
import os
import shutil


def fsync_path(path: str) -> None:
    """Flush `path` to disk: a file already written and closed, or a folder (its entries, e.g. a rename)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Write `data` to `path` through a temporary sibling: fsync, then rename over `path`.

    A reader (or a crash) sees the old file or the complete new one, never a prefix.
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def copy_durable(src: str, dst: str) -> None:
    """``shutil.copyfile`` followed by an fsync of the copy."""
    shutil.copyfile(src, dst)
    fsync_path(dst)


def write_json(path: str, doc, indent: int = 2, sort_keys: bool = False) -> None:
    """`doc` as JSON into `path`, atomically and durably (the one JSON writer: reports, --json,
    SCALES.json, the output's documents). NaN is refused (``allow_nan=False``): JSON has none."""
    text = json.dumps(doc, indent=indent, sort_keys=sort_keys, allow_nan=False, default=str) + "\n"
    write_atomic(path, text.encode())
