"""Headers of a Hub checkpoint without its weights (for ``quantize check``).

``huggingface_hub.get_safetensors_metadata`` reads each shard's header with a ranged request, so a
600 GB repository is checked by fetching a few megabytes: config.json plus the headers.
"""

from __future__ import annotations

import json

from ..errors import SourceError
from .safetensors_io import DTYPES, TensorInfo, nbytes_of
from .source import Source, refuse_quantized


def open_hub_headers(repo_id: str, revision: str | None = None) -> Source:
    """A :class:`Source` for `repo_id` built from remote headers (tensor data is never fetched)."""
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
    source = Source(repo_id, "", config, tensors, sorted(meta.files_metadata), [], from_hub=True)
    refuse_quantized(source)
    return source
