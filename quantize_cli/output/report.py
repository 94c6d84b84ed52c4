"""Human and machine renderings of a plan and of a finished run (``--dry-run``, ``--report``)."""

from __future__ import annotations

import json
import math
import os
import statistics

from .. import __version__
from ..algorithms import E4M3_MAX, MIXED_PRECISION
from ..console import human_bytes  # noqa: F401  (the report's sizes)
from ..errors import display

# Bumped when a key of the --report document is removed or changes meaning (docs/ci.md).
REPORT_SCHEMA_VERSION = 1




def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def run_report(plan, options: dict, stats, timings: dict, dst: str | None, status: str = "ok", error: str | None = None) -> dict:
    """The --report document for a finished (or failed) conversion."""
    tensors = []
    for mod in plan.modules.values():
        for leaf, info in mod.tensors.items():
            entry = {"name": info.name, "dtype": info.dtype, "shape": list(info.shape)}
            if mod.quantize and leaf == "weight":
                entry.update(action="quantize", scheme=plan.scheme_of(mod.name).algo)
                if stats is not None and mod.name in stats.errors:
                    entry.update({k: _finite(v) for k, v in stats.errors[mod.name].summary().items()})
            else:
                entry.update(action="copy", reason=mod.reason)
            tensors.append(entry)
    sq = [t["sqnr_db"] for t in tensors if isinstance(t.get("sqnr_db"), float)]
    summary = None
    if sq:
        worst = min((t for t in tensors if isinstance(t.get("sqnr_db"), float)), key=lambda t: t["sqnr_db"])
        summary = {"tensors": len(sq), "median_sqnr_db": statistics.median(sq), "min_sqnr_db": min(sq), "worst": worst["name"],
                   "max_rel_error": max(t["rel_error"] for t in tensors if isinstance(t.get("rel_error"), float))}
        summary.update(_search_summary(tensors))
    total = timings.get("total_s") or 0
    doc = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "converter": {"name": "quantize", "version": __version__},
        "status": status,
        "error": error,
        "source": {"label": plan.source.label, "path": plan.source.root, "shards": len(plan.source.shard_files), "bytes": plan.source.total_bytes},
        "destination": dst,
        "options": options,
        "algo": plan.scheme.algo,
        "quant_algo": MIXED_PRECISION if plan.mixed else plan.scheme.quant_algo,
        "recipe": plan.recipe.name,
        "calibration": _calibration(plan),
        "warnings": plan.warnings,
        "exclude_modules": plan.exclude_modules,
        "fused_groups": plan.groups,
        "bytes": {"in": plan.bytes_in, "out": plan.bytes_out, "shards": len(plan.shard_names),
                  "peak_in_flight": getattr(stats, "peak_inflight", None), "baseline_rss": getattr(stats, "baseline_rss", None) or None,
                  "pinned_trims": getattr(stats, "pinned_trims", 0),
                  "warmed_before_start": getattr(stats, "warmed", 0)},
        "timings_s": timings,
        "input_gb_per_s": (plan.bytes_in / 1e9 / total) if total else None,
        "error_summary": summary,
        "tensors": tensors,
    }
    return doc


def _search_summary(tensors: list[dict]) -> dict:
    """--scale-search mse: the error reduction against round-to-nearest over all quantized tensors."""
    gains = [t["sqnr_gain_db"] for t in tensors if isinstance(t.get("sqnr_gain_db"), float)]
    red = [t["mse_reduction"] for t in tensors if isinstance(t.get("mse_reduction"), float)]
    if not gains:
        return {}
    return {"median_sqnr_gain_db": statistics.median(gains), "min_sqnr_gain_db": min(gains),
            "median_mse_reduction": statistics.median(red), "min_mse_reduction": min(red)}


def unplanned_report(src: str, dst: str | None, algo: str, error: str) -> dict:
    """The --report for a run that failed before a plan existed (SRC unreadable or malformed)."""
    return {"converter": {"name": "quantize", "version": __version__}, "status": "error", "error": error,
            "source": {"label": src}, "destination": None, "requested_destination": dst, "algo": algo}


def _calibration(plan) -> dict | None:
    """Calibrated scales (per module, each in its own algorithm), the constant, or None (nothing static)."""
    if getattr(plan, "act_scales", None) is not None:
        from ..calibration.apply import calibration_summary

        return calibration_summary(plan, full=True)
    from ..algorithms import static_input_scale

    # the activation scale the constant stands for (compressed-tensors NVFP4 stores its inverse, input_global_scale)
    static = sorted({s.algo: static_input_scale(s.algo) for s in _schemes(plan) if s.static_input_scale is not None}.items())
    if not static:
        return None
    per_module = {m.name: {"input_scale": static_input_scale(plan.scheme_of(m.name).algo)} for m in plan.quantized
                  if plan.scheme_of(m.name).static_input_scale is not None}
    return {"calibrated": False, "input_scale": static[0][1] if len(static) == 1 else dict(static), "per_module": per_module,
            "convention": "activation amax 448 (ModelOpt calibration-free constant)"}


def _schemes(plan):
    """Every scheme the plan quantizes with (mixed precision: several)."""
    return list(plan.schemes.values()) if plan.mixed else [plan.scheme]
