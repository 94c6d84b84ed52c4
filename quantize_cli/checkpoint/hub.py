"""Headers of a Hub checkpoint without its weights (for ``quantize check``).

``huggingface_hub.get_safetensors_metadata`` reads each shard's header with a ranged request, so a
600 GB repository is checked by fetching a few megabytes: config.json plus the headers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import struct
import threading

from ..errors import SourceError
from .safetensors_header import DTYPES, TensorInfo, nbytes_of
from .source import Source, refuse_quantized


_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def resolve_commit(repo_id: str, revision: str | None) -> str:
    """`revision` (branch, tag, None = main) as the commit hash it points at now.

    --low-disk downloads shards over hours; pinning the commit once means every shard, the
    headers planned from and a later ``--resume`` all read the same revision.
    """
    if revision and _COMMIT.match(revision):
        return revision
    try:
        import huggingface_hub

        sha = huggingface_hub.model_info(repo_id, revision=revision).sha
    except Exception as exc:  # every hub failure means the same thing here
        raise SourceError(
            f"{repo_id}: cannot resolve --revision {revision or 'main'} to a commit on the Hub ({type(exc).__name__}); "
            "check the repo id, revision, token and network"
        ) from exc
    if not isinstance(sha, str) or not _COMMIT.match(sha):
        raise SourceError(f"{repo_id}: the Hub gave no commit hash for --revision {revision or 'main'}; pass the commit hash itself")
    return sha


def open_hub_headers(repo_id: str, revision: str | None = None, pin: bool = False) -> Source:
    """A :class:`Source` for `repo_id` built from remote headers (tensor data is never fetched).

    `pin`: resolve `revision` to a commit first and read everything at that commit (recorded as
    ``source.revision``).
    """
    if pin:
        revision = resolve_commit(repo_id, revision)
    config, tensors, files = hub_headers(repo_id, revision)
    source = Source(repo_id, "", config, tensors, files, [], from_hub=True, revision=revision if pin else None)
    refuse_quantized(source)
    return source


def hub_headers(repo_id: str, revision: str | None = None) -> tuple[dict, dict[str, TensorInfo], list[str]]:
    """(config.json, tensor infos by name, shard file names) of Hub repo `repo_id`, from headers only."""
    try:
        from huggingface_hub import get_safetensors_metadata, hf_hub_download

        meta = get_safetensors_metadata(repo_id, revision=revision)
        with open(hf_hub_download(repo_id, "config.json", revision=revision), encoding="utf-8") as f:
            config = json.load(f)
    except Exception as exc:  # every hub failure means the same thing here
        raise SourceError(
            f"{repo_id}: cannot read its config and safetensors headers from the Hub ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); check the repo id, token and network"
        ) from exc
    tensors: dict[str, TensorInfo] = {}
    for fname, fmeta in sorted(meta.files_metadata.items()):
        for name, t in fmeta.tensors.items():
            if t.dtype not in DTYPES:
                raise SourceError(f"{repo_id}:{fname}: tensor {name!r} has unknown dtype {t.dtype!r}")
            shape = tuple(t.shape)
            begin = t.data_offsets[0]
            tensors[name] = TensorInfo(name, t.dtype, shape, f"hub://{repo_id}/{fname}", begin, nbytes_of(t.dtype, shape))
    if not isinstance(config, dict) or not tensors:
        raise SourceError(f"{repo_id}: no config.json object or no safetensors tensors on the Hub")
    return config, tensors, sorted(meta.files_metadata)


class LazyShards:
    """Low-disk mode: each source shard is downloaded at its first read and deleted after its last.

    The executor's reads are planned up front, so the reads per shard are counted before the run;
    disk needs are then about the output plus the one or two shards in use (a fused group whose
    members sit in two shards holds both).
    """

    def __init__(self, repo_id: str, revision: str | None, folder: str, reads, planned: dict | None = None):
        import collections

        self.repo_id, self.revision, self.folder = repo_id, revision, folder
        self.remaining = collections.Counter(r.info.path for r in reads)
        self.local: dict[str, tuple[str, int]] = {}
        self.peak_files = 0
        self._lock = threading.Lock()
        # hub path -> {tensor: (dtype, shape, offset in the data section, nbytes)}: what the plan was built from
        self.planned: dict[str, dict] = {}
        for t in (planned or {}).values():
            if t.path.startswith("hub://"):
                self.planned.setdefault(t.path, {})[t.name] = (t.dtype, tuple(t.shape), t.offset, t.nbytes)

    def resolve(self, info: TensorInfo) -> TensorInfo:
        """`info` rebound to the downloaded shard (absolute offset); downloads it if needed."""
        if not info.path.startswith("hub://"):
            return info
        with self._lock:
            if info.path not in self.local:
                self.local[info.path] = self._fetch(info.path.rsplit("/", 1)[1], self.planned.get(info.path))
                self.peak_files = max(self.peak_files, len(self.local))
            path, data_start = self.local[info.path]
        return dataclasses.replace(info, path=path, offset=data_start + info.offset)

    def release(self, info: TensorInfo) -> None:
        with self._lock:
            self.remaining[info.path] -= 1
            if self.remaining[info.path] <= 0 and info.path in self.local:
                os.remove(self.local.pop(info.path)[0])

    def _fetch(self, filename: str, planned: dict | None = None) -> tuple[str, int]:
        try:
            from huggingface_hub import hf_hub_download

            path = hf_hub_download(self.repo_id, filename, revision=self.revision, local_dir=self.folder)
        except Exception as exc:
            err = SourceError(f"{self.repo_id}:{filename}: download failed ({type(exc).__name__}); rerun with --resume once the Hub is reachable")
            err.resumable = True  # api.py keeps the work folder for this one
            raise err from exc
        from .safetensors_header import read_header

        header = read_header(path, display=f"{self.repo_id}:{filename}")
        if planned is not None:
            got = {n: (t.dtype, tuple(t.shape), t.offset - header.data_start, t.nbytes) for n, t in header.tensors.items()}
            if got != planned:
                changed = sorted(set(got) ^ set(planned)) or sorted(n for n in got if got[n] != planned.get(n))
                raise SourceError(
                    f"{self.repo_id}:{filename}: the downloaded header differs from the one planned from "
                    f"(first: {changed[0]!r}); the file changed on the Hub; rerun without --resume to plan again"
                )
        return path, header.data_start


def hub_sidecars(repo_id: str, revision: str | None, folder: str) -> list[str]:
    """Download the small non-weight files (tokenizer, generation config, ...) into `folder`."""
    from huggingface_hub import snapshot_download

    from .sidecars import list_sidecars
    from .source import HUB_PATTERNS, _inside

    # Not the shards (fetched one at a time), but a sentence-transformers module's own safetensors (2_Dense/)
    patterns = [p for p in HUB_PATTERNS if p != "*.safetensors"] + ["*/*.safetensors"]
    try:
        snapshot_download(repo_id, revision=revision, allow_patterns=patterns, local_dir=folder)
    except Exception as exc:
        err = SourceError(f"{repo_id}: downloading the tokenizer and config files failed ({type(exc).__name__}); rerun with --resume once the Hub is reachable")
        err.resumable = True
        raise err from exc
    return list_sidecars(folder, _inside)[0]  # the rule of sidecars.py, as for a local SRC
