"""Reading a written checkpoint back, for every format: the verify result, the index, NaN/Inf, SQNR.

``quantize verify`` asks the checkpoint's format (``Format.verify``) for its rules
(formats/modelopt_verify.py, formats/ct_verify.py); both build on the shared checks here: the
shards agree with the index, no tensor holds NaN/Inf, and (with the source) per-tensor relative error
and SQNR of the dequantized weights against the algorithm's floor (docs/verify.md).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

from ..algorithms import ALGORITHMS
from ..checkpoint.safetensors_header import TensorInfo, read_header
from ..checkpoint.source import regular_file_inside
from ..errors import QuantizeError, display
from ..jsonfile import MISSING, JsonFileError, load_json
from ..modules.classify import natural_key
from ..problems import ERROR, WARNING, Finding, FindingsResult

MEDIAN_MARGIN_DB = 6.0
QUANT_LEAVES = ("weight", "weight_scale", "weight_scale_2", "input_scale",
                 "weight_packed", "weight_global_scale", "input_global_scale",
                 "weight_shape", "weight_zero_point")  # ModelOpt + compressed-tensors
READ_CHUNK = 64 << 20


@dataclass
class VerifyResult(FindingsResult):
    path: str
    algo: str | None
    findings: list[Finding] = field(default_factory=list)
    quantized: list[str] = field(default_factory=list)
    errors_by_tensor: dict[str, dict] = field(default_factory=dict)
    input_scales: str | None = None  # static input scales: calibrated (on what) or constant; None when none
    unreadable: set = field(default_factory=set)  # modules whose tensors contradict the configs (not read further)
    source_note: str | None = None  # why the weights were not (fully) judged against the source (--smooth, --rounding gptq)

    def add(self, level: str, code: str, subject: str, message: str) -> None:
        self.findings.append(Finding(level, code, subject, message))

    def to_json(self) -> dict:
        return {
            "schema_version": 1,  # docs/ci.md: bumped when a key is removed or changes meaning
            "command": "verify", "path": self.path, "algo": self.algo, "ok": not self.errors,
            "summary": {"errors": len(self.errors), "warnings": len(self.warnings), "quantized_modules": len(self.quantized)},
            "findings": [f.to_json() for f in self.findings],
            "tensor_errors": self.errors_by_tensor,
            "input_scales": self.input_scales,
            **({"source_note": self.source_note} if self.source_note else {}),
        }

    def to_text(self) -> str:
        lines = [f"verify: {self.path}  algo {self.algo}  {len(self.quantized)} quantized module(s)"]
        for name, e in sorted(self.errors_by_tensor.items(), key=lambda kv: natural_key(kv[0])):
            gain = f"  vs round-to-nearest {e['sqnr_gain_db']:+.2f} dB (mse -{100 * e['mse_reduction']:.1f}%)" if "sqnr_gain_db" in e else ""
            lines.append(f"  {display(name):<60} sqnr {e['sqnr_db']:7.2f} dB  rel.err {e['rel_error']:.4f}{gain}")
        if self.input_scales:
            lines.append(f"input scales: {display(self.input_scales)}")
        if self.source_note:
            lines.append(f"source: {display(self.source_note)}")
        lines += [f"{f.level.upper():<7}  [{f.code}] {display(f.message)}" for f in self.findings]  # one line each
        lines.append(f"result: {len(self.errors)} error(s), {len(self.warnings)} warning(s) -> {'FAIL' if self.errors else 'OK'}")
        return "\n".join(lines)


def load_json_checked(path: str, res: VerifyResult, what: str, needed_by: str = "a checkpoint") -> dict | None:
    """`path` as a JSON object, or None with a finding (missing, unreadable, a link out of the folder)."""
    try:
        if os.path.lexists(path):  # never through a link out of the checkpoint, never a FIFO
            regular_file_inside(os.path.dirname(path), os.path.basename(path))
    except QuantizeError as exc:
        res.add(ERROR, "bad-file", what, exc.message)
        return None
    try:
        return load_json(path, what, fix="a loader cannot read it")
    except JsonFileError as exc:
        if exc.rule == MISSING:
            res.add(ERROR, "missing-file", what, f"{path}: missing; {needed_by} needs {what}")
        else:
            res.add(ERROR, "bad-file", what, exc.message)
    return None


def read_index(path: str, res: VerifyResult) -> dict[str, TensorInfo]:
    """Every tensor of the checkpoint, checking that the index and the shards agree."""
    shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    index_path = os.path.join(path, "model.safetensors.index.json")
    wmap = None
    if os.path.exists(index_path):
        doc = load_json_checked(index_path, res, "model.safetensors.index.json") or {}
        wmap = doc.get("weight_map") if isinstance(doc.get("weight_map"), dict) else {}
    elif len(shards) > 1:
        res.add(ERROR, "index", "model.safetensors.index.json", f"{path}: {len(shards)} shards but no model.safetensors.index.json")
    tensors: dict[str, TensorInfo] = {}
    for shard in shards:
        try:
            header = read_header(regular_file_inside(path, shard))
        except QuantizeError as exc:
            res.add(ERROR, "shard", shard, exc.message)
            continue
        for name, info in header.tensors.items():
            if name in tensors:
                res.add(ERROR, "index", name, f"tensor {name!r} is in two shards ({os.path.basename(tensors[name].path)}, {shard})")
            tensors[name] = info
    if wmap is not None:
        for name, shard in sorted(wmap.items()):
            where = os.path.basename(tensors[name].path) if name in tensors else None
            if where != shard:
                res.add(ERROR, "index", name, f"index maps {name!r} to {shard} but it is {'in ' + where if where else 'in no shard'}")
        for name in sorted(set(tensors) - set(wmap)):
            res.add(ERROR, "index", name, f"tensor {name!r} is in {os.path.basename(tensors[name].path)} but not in the index; loaders using the index miss it")
        for shard in sorted(set(shards) - set(wmap.values())):
            res.add(WARNING, "index", shard, f"{shard} is not referenced by the index")
    if not tensors:
        res.add(ERROR, "empty", path, f"{path}: no safetensors tensors")
    return tensors


def check_finite(tensors: dict[str, TensorInfo], res: VerifyResult) -> None:
    import torch

    from ..checkpoint.safetensors_io import read_tensor
    from ..schemes.numerics import all_finite

    for name, info in tensors.items():
        if info.dtype not in ("BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2") or not info.shape and info.nbytes == 0:
            continue
        rows = info.shape[0] if info.shape else 1
        row_bytes = max(1, info.nbytes // max(rows, 1))
        step = max(1, READ_CHUNK // row_bytes)
        for start in range(0, rows, step):
            t = read_tensor(info, start, min(step, rows - start)) if info.shape else read_tensor(info)
            if info.dtype == "F8_E4M3":
                bad = bool(((t.view(torch.uint8) & 0x7F) == 0x7F).any())
            else:
                bad = not all_finite(t)
            if bad:
                res.add(ERROR, "non-finite", name, f"{name}: contains NaN or Inf; the checkpoint would compute garbage")
                break


def smoothed_note(method: str) -> str:
    return (f"weights smoothed (--smooth {method}): norms and weights were rescaled per channel, so a quantized weight is not "
            "comparable with the source's (the model's function is); not compared. Compare outputs with `quantize eval`")


GPTQ_NOTE = ("rounded by GPTQ (--rounding gptq), which lowers the layers' output error on the calibration data at the cost of "
             "weight error: the weight SQNR is shown but not held to the floors. Compare outputs with `quantize eval`")


def compare_as_made(src: str, method: dict, quantized, scheme_of, recipe, res: VerifyResult, searched: bool = False) -> None:
    """``verify --source`` as the weights were made (`method`: the recorded ``--rounding`` / ``--smooth``,
    from hf_quant_config.json or, for compressed-tensors, the card): smoothed weights are not compared
    (they differ from the source by design), GPTQ's are compared without the floors, others with them."""
    smooth, rounding = method.get("smooth") or "none", method.get("rounding") or "nearest"
    if smooth != "none":
        res.source_note = smoothed_note(str(smooth))
        return
    if rounding == "gptq":
        res.source_note = GPTQ_NOTE
    compare_with_source(src, quantized, scheme_of, recipe, res, searched, floors=rounding != "gptq")


def compare_with_source(src: str, quantized, scheme_of, recipe, res: VerifyResult, searched: bool = False,
                        floors: bool = True) -> None:
    """Per quantized weight: SQNR against the source; under the algorithm's floor an error, far under the
    median a warning (not `floors`: --rounding gptq, which trades weight error for output error)."""
    from ..checkpoint.safetensors_io import read_tensor
    from ..checkpoint.source import open_source
    from ..modules.experts import expand, read_virtual
    from ..schemes.numerics import error_fields, square_sums
    from ..schemes.rtn_baseline import compare_with_rtn

    source = open_source(src)
    tensors, _ = expand(source.tensors, recipe, lambda m: True)
    algo_of = {}
    for mod, leaves in quantized.items():
        scheme = scheme_of(mod)
        if scheme is None or mod in res.unreadable:  # its tensor findings say why it is not compared
            continue
        algo_of[f"{mod}.weight"] = scheme.algo
        ref = tensors.get(f"{mod}.weight")
        if ref is None:
            res.add(WARNING, "source", mod, f"{mod}: not found in the source {src}; not compared")
            continue
        w = read_virtual(ref).float()
        q = {k: read_tensor(v) for k, v in leaves.items() if k in QUANT_LEAVES}
        deq = scheme.dequantize(q)
        if tuple(deq.shape) != tuple(w.shape):
            res.add(ERROR, "source", mod, f"{mod}: shape {list(deq.shape)} differs from the source's {list(w.shape)}")
            continue
        res.errors_by_tensor[f"{mod}.weight"] = error_fields(*square_sums(w, deq))
        if searched:  # written with --scale-search: how much better than round-to-nearest under the same global scale
            res.errors_by_tensor[f"{mod}.weight"].update(compare_with_rtn(scheme, w, q, deq))
    by_algo: dict[str, list[float]] = {}  # medians per algorithm (a mixed checkpoint holds several)
    for name, e in res.errors_by_tensor.items():
        if e["sqnr_db"] != float("inf"):
            by_algo.setdefault(algo_of[name], []).append(e["sqnr_db"])
    for name, e in res.errors_by_tensor.items():
        if not floors:
            break
        floor = ALGORITHMS[algo_of[name]].sqnr_floor_db  # docs/verify.md justifies each
        values = by_algo.get(algo_of[name])
        median = statistics.median(values) if values else float("inf")
        if e["sqnr_db"] < floor:
            res.add(ERROR, "accuracy-floor", name, f"{name}: SQNR {e['sqnr_db']:.1f} dB is under the {algo_of[name]} floor of {floor:g} dB (docs/verify.md)")
        elif values and e["sqnr_db"] < median - MEDIAN_MARGIN_DB:
            res.add(WARNING, "accuracy-outlier", name, f"{name}: SQNR {e['sqnr_db']:.1f} dB is more than {MEDIAN_MARGIN_DB:g} dB below the checkpoint's median {median:.1f} dB")
