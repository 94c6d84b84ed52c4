"""The per-channel statistics of SCALES.json (version 2): a safetensors file beside it.

``E[x_j^2]`` is one fp32 per input channel of every calibrated Linear: 5 MB for an 8B dense model,
about 0.6 GB for a 256-expert MoE of DeepSeek-V3's size. That is too large for JSON (parsed whole
into memory, 4/3 larger as base64), so the vectors go to ``<stem>.channels.safetensors`` next to
the JSON, read lazily (only the modules a plan quantizes) with the project's strict header parser,
and named and hashed in the JSON::

    "channels": {"file": "SCALES.channels.safetensors", "sha256": "...", "bytes": 123456,
                 "statistic": "mean_square", "dtype": "F32"},
    "modules": {"model.layers.0.self_attn.q_proj": {"amax": 3.8, "tokens": 4865, "channels": "model.layers.0.self_attn.q_proj"},
                "model.layers.0.self_attn.k_proj": {"amax": 3.8, "tokens": 4865, "channels": "model.layers.0.self_attn.q_proj"}, ...}

A module's ``channels`` names its vector in the file; modules that saw the same input (q/k/v,
gate/up, an expert's w1/w3) share one, stored once. Torch is imported inside the functions only.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

from ..errors import CalibrationError, SourceError

if TYPE_CHECKING:
    import torch

STATISTIC = "mean_square"  # E[x_j^2] over the module's calibration tokens


def sidecar_name(json_path: str) -> str:
    """``SCALES.json`` -> ``SCALES.channels.safetensors`` (the basename: it lives beside the JSON)."""
    base = os.path.basename(json_path)
    stem = base[: -len(".json")] if base.endswith(".json") else base
    return f"{stem}.channels.safetensors"


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def save(json_path: str, channels: dict[str, torch.Tensor]) -> tuple[dict, dict[str, str]]:
    """Write `channels` (module -> fp32 [K]) beside `json_path`, identical vectors once.

    Returns (the JSON's ``channels`` block, module -> its tensor name in the file)."""
    import torch
    from safetensors.torch import save as to_bytes

    keys, unique, seen = {}, {}, {}
    for name in sorted(channels):
        t = channels[name].detach().to(torch.float32).cpu().contiguous()
        digest = hashlib.sha256(t.numpy().tobytes()).hexdigest() + str(tuple(t.shape))
        keys[name] = seen.setdefault(digest, name)
        unique.setdefault(keys[name], t)
    path = os.path.join(os.path.dirname(json_path), sidecar_name(json_path))
    from ..checkpoint.durable import write_atomic

    try:  # the one durable writer (fsync, then rename); the user's umask, as for the JSON
        write_atomic(path, to_bytes(unique, metadata={"format": "quantize-act-channels", "statistic": STATISTIC}))
    except OSError as exc:
        raise CalibrationError(f"-o {json_path}: cannot write {path} ({exc.strerror or exc}); check the folder and permissions") from None
    block = {"file": os.path.basename(path), "sha256": file_sha256(path), "bytes": os.path.getsize(path),
             "statistic": STATISTIC, "dtype": "F32"}
    return block, keys


def named_sidecar(json_path: str, doc: dict | None = None) -> str | None:
    """The channel-statistics file SCALES.json `json_path` names beside it (None: none named, or the
    JSON unreadable: its loader says why). Torch-free, reads only the JSON."""
    if doc is None:
        from ..jsonfile import read_json_or_none

        doc = read_json_or_none(json_path)
    block = doc.get("channels") if isinstance(doc, dict) else None
    name = block.get("file") if isinstance(block, dict) else None
    if not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", ".."):
        return None
    return os.path.join(os.path.dirname(json_path) or ".", name)


class ChannelFile:
    """A checked sidecar: :meth:`read` gives one module's fp32 ``[K]`` vector."""

    def __init__(self, json_path: str, block, bad):
        """Check `block` (the JSON's ``channels``) against the file beside `json_path`; `bad(what)`
        makes the one-line error naming the JSON file."""
        if not isinstance(block, dict) or not isinstance(block.get("file"), str):
            raise bad('"channels" must be an object naming its "file"')
        name = block["file"]
        if os.path.basename(name) != name or name in ("", ".", ".."):
            raise bad(f'"channels.file" {name!r} must be a file name beside the JSON, not a path')
        if block.get("statistic") != STATISTIC or block.get("dtype") != "F32":
            raise bad(f'"channels" holds {block.get("statistic")!r} as {block.get("dtype")!r}; this quantize reads {STATISTIC!r} as "F32"')
        self.path = os.path.join(os.path.dirname(json_path) or ".", name)
        if not os.path.isfile(self.path):
            raise bad(f"its per-channel statistics {self.path} are missing (keep the two files together)")
        if os.path.getsize(self.path) != block.get("bytes") or file_sha256(self.path) != block.get("sha256"):
            raise bad(f"{self.path} is not the file it was written with (size or sha256 differ)")
        from ..checkpoint.safetensors_header import read_header

        try:
            self.tensors = read_header(self.path).tensors
        except SourceError as exc:
            raise bad(f"{self.path}: {exc.message}") from None
        for key, info in self.tensors.items():
            if info.dtype != "F32" or len(info.shape) != 1:
                raise bad(f"{self.path}: {key} is {info.dtype}{list(info.shape)}; channel statistics are 1-D F32")

    def read(self, key: str) -> torch.Tensor:
        from ..checkpoint.safetensors_io import read_tensor

        return read_tensor(self.tensors[key])


__all__ = ["ChannelFile", "save", "sidecar_name", "named_sidecar", "STATISTIC"]
