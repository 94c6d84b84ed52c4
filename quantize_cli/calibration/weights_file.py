"""The weights a data-driven transform decided (``--rounding gptq``, ``--smooth``): a side folder.

GPTQ and smoothing run in the calibration forward, before the plan is executed; what they decide
reaches the written checkpoint through this folder, read by the executors (local and Ray) like a
source. Two kinds of tensors, one safetensors file per block and kind::

    source-00007.safetensors      source tensors replaced by smoothing (norm weights, Linear
                                  weights scaled per input channel), in the source's dtype and
                                  shape: the plan reads them instead of the source's (overlay)
    quantized-00007.safetensors   the output tensors GPTQ chose for a Linear, named as the plan
                                  names them (``<module>.weight``, ``.weight_scale``, ...): the
                                  executor writes their rows instead of quantizing the source
    index.json                    {"format": "quantize-weights", "version": 1, "request": {...},
                                   "files": [...], "sha256": ..., "summary": {...}}

``request`` is everything that decided the tensors (source fingerprint, algorithm, format,
options, data); ``sha256`` hashes the files in order, so a resumed conversion can tell that the
folder is the one it planned with. The writer keeps one block in memory at a time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field, replace

from ..checkpoint.safetensors_header import TensorInfo
from ..errors import CalibrationError

FORMAT = "quantize-weights"
VERSION = 1
INDEX = "index.json"


class WeightsWriter:
    """Writes the side folder block by block (``add_*`` then ``flush``), then :meth:`finish`."""

    def __init__(self, folder: str, request: dict):
        self.folder, self.request = folder, request
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        self.files: list[str] = []
        self._source: dict = {}
        self._quantized: dict = {}
        self._block = 0
        self.counts = {"replaced": 0, "quantized": 0}

    def add_replaced(self, name: str, tensor) -> None:
        self._source[name] = tensor.detach().cpu().contiguous()

    def add_quantized(self, module: str, outputs: dict) -> None:
        for suffix, t in outputs.items():
            if t is not None:
                self._quantized[f"{module}.{suffix}"] = t.detach().cpu().contiguous()
        self.counts["quantized"] += 1

    def flush(self) -> None:
        """Write what the current block added (nothing: no file), durably (checkpoint/durable.py)."""
        from safetensors.torch import save

        from ..checkpoint.durable import write_atomic

        for kind, tensors in (("source", self._source), ("quantized", self._quantized)):
            if tensors:
                name = f"{kind}-{self._block:05d}.safetensors"
                write_atomic(os.path.join(self.folder, name), save(tensors))
                self.files.append(name)
                if kind == "source":
                    self.counts["replaced"] += len(tensors)
        self._source, self._quantized = {}, {}
        self._block += 1

    def finish(self, summary: dict) -> "WeightsDoc":
        self.flush()
        digest = _digest(self.folder, self.files)
        doc = {"format": FORMAT, "version": VERSION, "request": self.request, "files": self.files, "sha256": digest,
               "summary": {**summary, **self.counts}}
        from ..checkpoint.durable import write_json

        write_json(os.path.join(self.folder, INDEX), doc, indent=1, sort_keys=True)
        return load(self.folder)


def _digest(folder: str, files: list[str]) -> str:
    h = hashlib.sha256()
    for name in files:
        h.update(name.encode() + b"\0")
        with open(os.path.join(folder, name), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class WeightsDoc:
    """A finished side folder: replaced source tensors and precomputed outputs, as TensorInfos."""

    folder: str
    request: dict
    sha256: str
    summary: dict
    replaced: dict[str, TensorInfo] = field(default_factory=dict)
    quantized: dict[str, dict[str, TensorInfo]] = field(default_factory=dict)  # module -> suffix -> tensor
    temporary: bool = False  # convert's own folder (removed once DST is published), not a calibrate output

    def overlay(self, source):
        """`source` (a checkpoint Source) reading the replaced tensors from this folder. Refused when a
        replaced tensor does not exist in the source or differs in dtype or shape."""
        tensors = dict(source.tensors)
        for name, info in self.replaced.items():
            old = tensors.get(name)
            if old is None or old.dtype != info.dtype or tuple(old.shape) != tuple(info.shape):
                raise CalibrationError(f"{self.folder}: {name} does not match the source's tensor "
                                       f"({'missing' if old is None else f'{old.dtype} {list(old.shape)}'}); "
                                       "it was made from another source; run the calibration again")
            tensors[name] = replace(info, name=name)
        return replace(source, tensors=tensors)

    def rows(self, module: str, start: int, count: int, n_rows: int):
        """The precomputed outputs of `module` for source rows ``[start, start + count)`` of ``n_rows``
        (row-indexed tensors sliced, blocks of rows by their ratio; 0-d tensors whole), or None."""
        from ..checkpoint.safetensors_io import read_tensor

        entry = self.quantized.get(module)
        if entry is None:
            return None
        out = {}
        for suffix, info in entry.items():
            if info.shape and n_rows:
                per = -(-n_rows // info.shape[0])  # source rows per entry (128 for 128x128 block scales)
                first = start // per
                out[suffix] = read_tensor(info, first, -(-(start + count) // per) - first)
            else:
                out[suffix] = read_tensor(info)
        return out

    @property
    def data(self) -> dict | None:
        """The calibration data the weights were chosen on: the run's record (spec, sha256, samples,
        seq_len, tokens), or the request's (spec, samples, seq_len) for a folder made before it was kept."""
        return self.summary.get("data") or self.request.get("data")

    def describe(self) -> dict:
        """What the output's metadata records (deterministic: no timings)."""
        return {"method": self.request.get("method"), "sha256": self.sha256,
                **{k: v for k, v in self.summary.items() if k != "seconds"}, "data": self.data}


def load(folder: str) -> WeightsDoc:
    """Read a finished side folder (one-line CalibrationError when it is not one)."""
    from ..checkpoint.safetensors_header import read_header

    path = os.path.join(folder, INDEX)
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise CalibrationError(f"{path}: not a finished weights folder ({type(exc).__name__}); run the calibration again") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise CalibrationError(f"{path}: not a {FORMAT} version {VERSION} index; run the calibration again")
    replaced: dict[str, TensorInfo] = {}
    quantized: dict[str, dict[str, TensorInfo]] = {}
    for name in doc["files"]:
        for tname, info in read_header(os.path.join(folder, name)).tensors.items():
            if name.startswith("source-"):
                replaced[tname] = info
            else:
                module, _, suffix = tname.rpartition(".")
                quantized.setdefault(module, {})[suffix] = info
    return WeightsDoc(folder, doc["request"], doc["sha256"], doc.get("summary", {}), replaced, quantized)


def verify_digest(doc: WeightsDoc) -> bool:
    """The files still hash to the recorded digest (a reused folder was not changed since)."""
    return _digest(doc.folder, list(json.load(open(os.path.join(doc.folder, INDEX)))["files"])) == doc.sha256


__all__ = ["WeightsWriter", "WeightsDoc", "load", "verify_digest", "FORMAT", "VERSION"]
