"""``SCALES.json``: the measured activation amax of a source model, versioned and reusable.

The document stores amax (not scales), so one calibration serves every algorithm: the scale is
derived when a plan uses it (FP8 ``amax / 448``, NVFP4 ``amax / (6 * 448)``, KV ``amax / 448``).
Example (docs/calibration.md has the full description)::

    {"format": "quantize-act-scales", "version": 2,
     "source": {"label": "...", "layout_sha256": "...", "content_sha256": "..."},
     "data": {"spec": "default", "sha256": "...", "samples": 6, "seq_len": 512, "tokens": 3072},
     "run": {"dtype": "bfloat16", "device": "cuda:0", "seconds": 12.3, "transformers": "5.24.0"},
     "channels": {"file": "SCALES.channels.safetensors", "sha256": "...", "bytes": 5120, ...},
     "modules": {"model.layers.0.self_attn.q_proj": {"amax": 3.84, "tokens": 3072, "channels": "..."}, ...},
     "kv": {"model.layers.0.self_attn": {"k_amax": 0.54, "v_amax": 0.62, "tokens": 3072}, ...}}

Module names are the checkpoint's (per expert for MoE: ``...experts.3.gate_proj``); an expert
that received no token has ``tokens: 0`` and ``amax: 0``. Version 2 adds the per-input-channel
``E[x_j^2]`` of every module (the scale search's weights) in a safetensors file beside the JSON
(:mod:`.channels`); version 1 files are still read, and simply have no channel statistics.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field

from ..checkpoint.safetensors_header import TensorInfo
from ..errors import CalibrationError
from ..jsonfile import MISSING, NOT_OBJECT, JsonFileError, load_json

FORMAT = "quantize-act-scales"
VERSION = 2
READS = (1, 2)  # version 1: no channel statistics


@dataclass
class ScalesDoc:
    """In-memory SCALES.json. ``modules[name] = {"amax", "tokens"}``; ``kv[attn] = {"k_amax", "v_amax", "tokens"}``."""

    source: dict
    data: dict
    run: dict
    modules: dict[str, dict] = field(default_factory=dict)
    kv: dict[str, dict] = field(default_factory=dict)
    path: str | None = None
    channels: dict = field(default_factory=dict)  # module -> fp32 [K] E[x_j^2], in memory (a fresh calibration)
    channel_file: object = None  # channels.ChannelFile of a loaded version-2 file (read lazily)
    weights: dict | None = None  # GPTQ / smoothing: {"folder", "sha256", "request"} (calibration/weights_entry.py)

    @property
    def has_channels(self) -> bool:
        """Whether per-channel statistics were recorded (False for a version-1 file)."""
        return bool(self.channels) or self.channel_file is not None

    def channel_energy(self, module: str):
        """fp32 CPU ``[K]`` ``E[x_j^2]`` of Linear `module`'s inputs, or None when not recorded."""
        if module in self.channels:
            return self.channels[module]
        key = (self.modules.get(module) or {}).get("channels")
        return None if self.channel_file is None or key is None else self.channel_file.read(key)
    def input_amax(self, module: str) -> tuple[float, int] | None:
        """(amax, tokens) recorded for Linear `module`, or None when it was not seen."""
        m = self.modules.get(module)
        return None if m is None else (float(m["amax"]), int(m.get("tokens", 0)))

    def to_json(self, channels: dict | None = None) -> dict:
        doc = {"format": FORMAT, "version": VERSION, "source": self.source, "data": self.data, "run": self.run,
               "modules": self.modules, "kv": self.kv}
        if channels is not None:
            doc["channels"] = channels
        if self.weights is not None:  # optional: older readers ignore it
            doc["weights"] = self.weights
        return doc

    def save(self, path: str) -> None:
        """Write the JSON (and, with channel statistics, its sidecar first: the JSON names its sha256)."""
        from ..checkpoint.durable import write_json

        block = None
        if self.channels:
            from .channels import save

            block, keys = save(path, self.channels)
            self.modules = {m: {**e, **({"channels": keys[m]} if m in keys else {})} for m, e in self.modules.items()}
        try:
            write_json(path, self.to_json(block), indent=1)
        except OSError as exc:
            raise CalibrationError(f"-o {path}: cannot write the scales file ({exc.strerror or exc}); check the folder and permissions") from None


def _bad(path: str, what: str) -> CalibrationError:
    return CalibrationError(f"--act-scales {path}: {what}; make it again with `quantize calibrate SRC --calib-data DATA -o {os.path.basename(path)}`")


def load(path: str) -> ScalesDoc:
    """Read and validate a SCALES.json; every problem is a one-line error naming the file and entry."""
    try:
        doc = load_json(path, "SCALES.json", parse_constant=float, max_bytes=256 << 20)  # NaN / Infinity: refused per entry below
    except JsonFileError as exc:
        if exc.rule == MISSING:
            raise CalibrationError(f"--act-scales {path}: no such file; pass the file `quantize calibrate` wrote") from None
        if exc.rule != NOT_OBJECT:
            raise _bad(path, exc.reason.removeprefix("is ")) from None
        doc = None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise _bad(path, f"not a {FORMAT} document (no \"format\": \"{FORMAT}\")")
    if doc.get("version") not in READS or isinstance(doc.get("version"), bool):
        raise _bad(path, f"version {doc.get('version')!r} is not supported (this quantize reads versions {', '.join(map(str, READS))})")
    for key in ("source", "data", "run", "modules", "kv"):
        if not isinstance(doc.get(key), dict):
            raise _bad(path, f"\"{key}\" is missing or not an object")
    for name, entry in doc["modules"].items():
        _check_entry(path, f"modules.{name}", entry, ("amax",))
    for name, entry in doc["kv"].items():
        _check_entry(path, f"kv.{name}", entry, ("k_amax", "v_amax"))
    weights = doc.get("weights")
    if weights is not None and not (isinstance(weights, dict) and isinstance(weights.get("folder"), str)):
        raise _bad(path, "\"weights\" must be an object naming its folder")
    return ScalesDoc(doc["source"], doc["data"], doc["run"], doc["modules"], doc["kv"], path, channel_file=_channels(path, doc),
                     weights=weights)


def _channels(path: str, doc: dict):
    """The checked sidecar of a version-2 file (None without channel statistics)."""
    named = {n: e["channels"] for n, e in doc["modules"].items() if e.get("channels") is not None}
    if doc["version"] < 2 or doc.get("channels") is None:
        if named:
            raise _bad(path, f"modules.{next(iter(named))}.channels names channel statistics but there is no \"channels\" file")
        return None
    from .channels import ChannelFile, named_sidecar

    missing = named_sidecar(path, doc)
    if missing is not None and not os.path.isfile(missing):
        # only --scale-search mse reads them, and it is refused before torch without them
        # (plan/preflight.check_calibration): the amax alone (FP8, NVFP4 input scales) need no sidecar
        return None
    file = ChannelFile(path, doc["channels"], lambda what: _bad(path, what))
    for name, key in named.items():
        if not isinstance(key, str) or key not in file.tensors:
            raise _bad(path, f"modules.{name}.channels = {key!r} names no tensor of {file.path}")
    return file


def _check_entry(path: str, where: str, entry, keys) -> None:
    if not isinstance(entry, dict):
        raise _bad(path, f"{where} is not an object")
    for k in keys:
        v = entry.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise _bad(path, f"{where}.{k} = {v!r}: an amax must be a finite number >= 0")
    t = entry.get("tokens", 0)
    if isinstance(t, bool) or not isinstance(t, int) or t < 0:
        raise _bad(path, f"{where}.tokens = {t!r}: must be a count >= 0")


def fingerprint(config: dict, tensors: dict[str, TensorInfo], with_content: bool = True) -> dict:
    """What identifies a source: ``layout_sha256`` (config.json + every tensor's name, dtype,
    shape) and ``content_sha256`` (plus the first 64 bytes of every tensor's data, one small read
    each: tells same-shaped fine-tunes apart)."""
    layout = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    for name in sorted(tensors):
        t = tensors[name]
        layout.update(f"{name}|{t.dtype}|{list(t.shape)}\n".encode())
    out = {"layout_sha256": layout.hexdigest()}
    if with_content:
        content = hashlib.sha256(out["layout_sha256"].encode())
        for name in sorted(tensors):
            t = tensors[name]
            with open(t.path, "rb") as f:
                f.seek(t.offset)
                content.update(f.read(min(64, t.nbytes)))
        out["content_sha256"] = content.hexdigest()
    return out


def check_source(doc: ScalesDoc, fp: dict, label: str) -> None:
    """Refuse a scales file made from another source."""
    mine = doc.source
    same = mine.get("layout_sha256") == fp["layout_sha256"] and (
        "content_sha256" not in fp or "content_sha256" not in mine or mine["content_sha256"] == fp["content_sha256"])
    if not same:
        raise CalibrationError(f"--act-scales {doc.path}: made from another source ({mine.get('label', '?')}, fingerprint "
                         f"{str(mine.get('content_sha256') or mine.get('layout_sha256'))[:12]}) than {label} "
                         f"({(fp.get('content_sha256') or fp['layout_sha256'])[:12]}); calibrate this source: quantize calibrate {label} --calib-data DATA -o SCALES.json")
