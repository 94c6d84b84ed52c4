"""The run identity: the one table of what decides an output's bytes.

Two runs with equal identities write identical files; any difference in an option below, in the
source files or in the converter's version may change a byte. Everything that needs to know
"is this the same conversion?" derives from :class:`RunIdentity`:

- ``--resume`` of an interrupted run (the work folder keeps :meth:`RunIdentity.record` in its
  state file; a refusal names the first option that differs, with both values, and touches nothing);
- ``--resume`` of a finished DST (the sealed ``.quantize-checksums`` keeps the same record);
- the ``options`` of ``--report`` and the command line on the model card (:meth:`command_line`).

The table (``IDENTITY``) is the only list of these options; adding an option that changes the bytes
means adding one row here (and ``tests/test_identity.py`` fails if a ConvertOptions field is in
neither this table nor ``NOT_IDENTITY``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import struct
from dataclasses import dataclass
from typing import Callable

from .. import CONVERTER, __version__  # noqa: F401



def _upper(v):
    return None if v is None else str(v).upper()


def _lower(v, default=None):
    return default if v in (None, "") else str(v).lower()


def _size(v):
    from ..plan.build import parse_size

    try:
        return None if v is None else parse_size(v)
    except ValueError:
        return str(v)


def _kv(v):
    return None if v in (None, "", "none", "auto") else str(v).lower()


def _algo_for(v):
    from ..algorithms import canonical_algo

    out = []
    for spec in v or ():
        pattern, _, algo = str(spec).rpartition("=")
        out.append(f"{pattern.strip()}={canonical_algo(algo.strip()) or algo.strip()}")
    return out


def _calibration(plan):
    """What of the calibration data decides bytes: the resolved activation scales and the search's weights."""
    parts = [plan.act_scales.digest() if plan.act_scales is not None else None,
             plan.search_weights.digest() if getattr(plan, "search_weights", None) is not None else None]
    if not any(parts):
        return None
    return parts[0] if parts[1] is None else f"{parts[0] or ''}+search:{parts[1]}"


def _weights(plan):
    """What decides the GPTQ / smoothing weights: convert's own stage records the digests of its
    request and of the token ids (known before the forward, calibration/stage.py); weights made by
    ``calibrate`` (``--act-scales``) are their files' sha256."""
    step = getattr(plan, "transform", None)
    if step is not None:
        return step.identity()
    return plan.weights.sha256 if getattr(plan, "weights", None) is not None else None


def _show_weights(v) -> str:
    if isinstance(v, dict):
        return f"calibration tokens sha256 {str(v.get('data_sha256'))[:12]}..., request sha256 {str(v.get('request_sha256'))[:12]}..."
    return _show(v)


@dataclass(frozen=True)
class Decides:
    """One option that decides the output bytes.

    key: its name in the record (the ConvertOptions field, or ``calibration``); flag: as the user
    types it; default: what a record written before the key existed meant; normalize: the value
    compared (``"5GB"`` and ``5000000000`` are the same size)."""

    key: str
    flag: str
    default: object = None
    normalize: Callable = lambda v: v
    show: Callable = None  # how a value is said in a message (default: as it is)

    def said(self, value) -> str:
        return (self.show or _show)(value)


IDENTITY: tuple[Decides, ...] = (
    Decides("algo", "--algo", None, _upper),
    Decides("algo_for", "--algo-for", [], _algo_for),
    Decides("format", "--format", "modelopt", lambda v: _lower(v, "modelopt").replace("_", "-")),
    Decides("recipe", "--recipe", None),
    Decides("exclude", "--exclude", [], lambda v: list(v or [])),
    Decides("layout", "--layout", "plain", lambda v: _lower(v, "plain")),
    Decides("kv_cache_dtype", "--kv-cache-dtype", None, _kv),
    Decides("max_shard_size", "--max-shard-size", None, _size, lambda v: _human_size(v) if isinstance(v, int) else _show(v)),
    Decides("scale_search", "--scale-search", "none", lambda v: _lower(v, "none")),
    Decides("calibration", "--calib-data / --act-scales", None),
    Decides("rounding", "--rounding", "nearest", lambda v: _lower(v, "nearest")),
    Decides("smooth", "--smooth", "none", lambda v: _lower(v, "none")),
    Decides("weights", "the GPTQ / smoothing weights (--calib-data / --act-scales)", None, show=_show_weights),
)
# ConvertOptions fields that never change a byte of the output (tests/test_identity.py checks the split).
NOT_IDENTITY = ("src", "dst", "device", "memory_budget", "resume", "dry_run", "overwrite", "report", "revision", "quiet",
                "verify", "low_disk", "calib_data", "calib_samples", "calib_seq_len", "act_scales", "push_to_hub",
                "private", "revision_out", "executor", "ray_address", "kernels", "strict", "allow", "eval", "base_model",
                "max_ppl_increase", "max_kl", "min_top1", "min_cosine", "min_sample_cosine", "eval_data", "eval_samples", "eval_seq_len")
_BY_KEY = {d.key: d for d in IDENTITY}


def shard_identity(path: str) -> dict:
    """A source shard as the identity sees it: size, mtime and the hash of its header."""
    st = os.stat(path)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = f.read(min(n, 100 << 20))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "header_sha256": hashlib.sha256(header).hexdigest()}


def _show(value) -> str:
    if value in (None, [], ""):
        return "(none)"
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


@dataclass(frozen=True)
class RunIdentity:
    """What decides one conversion's bytes (see the module docstring).

    options: key -> normalized value, for every row of ``IDENTITY``; source: the label (folder or
    repo id), the pinned revision and every local shard's identity; outputs: a digest of the planned
    output layout (names, dtypes, shapes, shards, offsets), derived from the rest, kept as a check;
    command_flags: the flags as given that the normalized values cannot reproduce (a recipe file,
    the calibration data): for the command line only, never compared.
    """

    options: dict
    source: dict
    outputs: str
    converter: str = CONVERTER
    command_flags: tuple[str, ...] = ()

    @classmethod
    def of(cls, opts, plan) -> "RunIdentity":
        """The identity of running `opts` (ConvertOptions) as `plan`."""
        values = {
            "algo": plan.scheme.algo, "algo_for": list(opts.algo_for), "format": plan.format.name, "recipe": plan.recipe.name,
            "exclude": list(opts.exclude), "layout": opts.layout, "kv_cache_dtype": opts.kv_cache_dtype,
            "max_shard_size": opts.max_shard_size, "scale_search": opts.scale_search,
            "calibration": _calibration(plan),
            "rounding": opts.rounding, "smooth": opts.smooth,
            "weights": _weights(plan),
        }
        options = {d.key: d.normalize(values[d.key]) for d in IDENTITY}
        paths = sorted({t.path for t in plan.source.tensors.values() if not t.path.startswith("hub://")})
        source = {"label": plan.source.root or plan.source.label, "revision": getattr(plan.source, "revision", None),
                  "shards": {os.path.basename(p): shard_identity(p) for p in paths}}
        layout = [(o.name, o.dtype, list(o.shape), o.shard, o.offset) for o in plan.outputs.values()]
        outputs = hashlib.sha256(json.dumps([layout, plan.shard_names]).encode()).hexdigest()
        flags: list[str] = ["--recipe", str(opts.recipe)] if opts.recipe else []
        if any(getattr(plan, k, None) is not None for k in ("act_scales", "search_weights", "weights", "transform")):
            if opts.act_scales:
                flags += ["--act-scales", str(opts.act_scales)]
            elif opts.calib_data is not None:
                flags += ["--calib-data", str(opts.calib_data)]
                flags += ["--calib-samples", str(opts.calib_samples)] if opts.calib_samples else []
                flags += ["--calib-seq-len", str(opts.calib_seq_len)] if opts.calib_seq_len else []
        return cls(options, source, outputs, CONVERTER, tuple(flags))

    def record(self) -> dict:
        """The JSON-able record kept in the work folder and in a finished DST."""
        return {"options": dict(self.options), "source": dict(self.source), "outputs": self.outputs, "converter": self.converter}

    def fingerprint(self) -> str:
        """sha256 of :meth:`record`: equal for runs that write identical bytes."""
        return hashlib.sha256(json.dumps(self.record(), sort_keys=True).encode()).hexdigest()

    def differences(self, record: dict | None) -> list[str]:
        """What differs between `record` (an earlier run's) and this run, most telling first, each as
        ``"--format: compressed-tensors, this run asks for modelopt"``; empty when they are the same run."""
        if not isinstance(record, dict) or not isinstance(record.get("options"), dict):
            return ["its record is missing or unreadable"]
        out = []
        for d in IDENTITY:
            made = d.normalize(record["options"].get(d.key, d.default))
            if made != self.options[d.key]:
                if d.key == "weights" and isinstance(made, dict) and isinstance(self.options[d.key], dict):
                    from ..calibration.stage import differences  # the GPTQ / smoothing request, named part by part

                    out.append(f"{d.flag}: {differences(made, self.options[d.key])}")
                    continue
                out.append(f"{d.flag} {d.said(made)}, this run asks for {d.said(self.options[d.key])}")
        src = record.get("source") if isinstance(record.get("source"), dict) else {}
        if src.get("label") != self.source["label"] or src.get("revision") != self.source["revision"]:
            out.append(f"the source {src.get('label')!r}, this run reads {self.source['label']!r}")
        elif src.get("shards") != self.source["shards"]:
            changed = sorted(n for n in set(src.get("shards") or {}) | set(self.source["shards"])
                             if (src.get("shards") or {}).get(n) != self.source["shards"].get(n))
            out.append(f"source files that changed since ({', '.join(changed[:3])})")
        if record.get("converter") != self.converter:
            out.append(f"quantize {record.get('converter')}, this is quantize {self.converter}")
        elif record.get("outputs") != self.outputs and not out:
            out.append("another planned output layout")
        return out

    def report_options(self) -> dict:
        """The options as ``--report`` lists them (the same values the identity compares)."""
        return dict(self.options)

    def command_line(self, src: str, dst: str, extra: tuple[str, ...] = ()) -> str:
        """The ``quantize convert`` command that makes this output again: every option that decides a
        byte and differs from its default, in the table's order (``--algo`` always), then `extra`."""
        args = ["quantize", "convert", src, "-o", dst, "--algo", str(self.options["algo"])]
        for d in IDENTITY:
            value = self.options[d.key]
            if d.key in ("algo", "calibration", "weights"):
                continue
            if d.key == "max_shard_size":
                if value is not None and value != _size("5GB"):
                    args += [d.flag, _human_size(value)]
                continue
            if d.key == "recipe":  # chosen by model_type unless given (then in command_flags, as given)
                continue
            if isinstance(value, list):
                for item in value:
                    args += [d.flag, str(item)]
            elif value is not None and value != d.normalize(d.default):
                args += [d.flag, str(value)]
        return shlex.join(args + list(self.command_flags) + list(extra))


def _human_size(n) -> str:
    """A byte count as --max-shard-size takes it: ``5000000000`` -> ``5GB``, ``100000`` -> ``100KB``."""
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if isinstance(n, int) and n and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


__all__ = ["IDENTITY", "NOT_IDENTITY", "Decides", "RunIdentity", "shard_identity"]
