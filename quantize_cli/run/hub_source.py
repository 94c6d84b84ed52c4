"""A Hub source read by scale-out workers: each worker fetches the source shards it reads itself.

The driver plans from the remote headers and downloads no weights. A worker resolves every
``hub://`` tensor to its node's Hugging Face cache (:class:`HubCache`, each shard downloaded once
per node and kept for the next shard unit that reads it), or with ``--low-disk`` to a scratch
folder holding one source shard at a time (:class:`~quantize_cli.checkpoint.hub.LazyShards`).
"""

from __future__ import annotations

import socket
import struct
import tempfile
from dataclasses import replace

from ..checkpoint.safetensors_header import TensorInfo
from ..errors import SourceError


class HubCache:
    """Resolves ``hub://`` tensors to this node's Hugging Face cache (downloaded once per node)."""

    def __init__(self, repo_id: str, revision: str | None):
        self.repo_id, self.revision = repo_id, revision
        self.local: dict[str, tuple[str, int]] = {}
        self.peak_files = 0

    def resolve(self, info: TensorInfo) -> TensorInfo:
        if not info.path.startswith("hub://"):
            return info
        if info.path not in self.local:
            filename = info.path.rsplit("/", 1)[1]
            try:
                from huggingface_hub import hf_hub_download

                path = hf_hub_download(self.repo_id, filename, revision=self.revision)
            except Exception as exc:  # noqa: BLE001 - every Hub failure means the same here
                raise SourceError(f"{self.repo_id}:{filename}: download failed on {socket.gethostname()} "
                                  f"({type(exc).__name__}); rerun with --resume once the Hub is reachable") from exc
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
            self.local[info.path] = (path, 8 + n)
        path, data_start = self.local[info.path]
        return replace(info, path=path, offset=data_start + info.offset)

    def release(self, info: TensorInfo) -> None:
        """Files stay in the node's cache for the next unit that needs them."""


def hub_resolver(hub, reads):
    """The source resolver of a worker for `hub` (``(repo_id, revision, low_disk)`` or None) and
    the `reads` to come: ``(resolver or None, scratch folder to remove afterwards or None)``."""
    if not hub:
        return None, None
    repo, revision, low_disk = hub
    if not low_disk:
        return HubCache(repo, revision), None
    from ..checkpoint.hub import LazyShards

    scratch = tempfile.mkdtemp(prefix="quantize-src-")
    return LazyShards(repo, revision, scratch, reads), scratch


__all__ = ["HubCache", "hub_resolver"]
