"""Human and machine renderings of a plan and of a finished run (``--dry-run``, ``--report``)."""

from __future__ import annotations

import json
import math
import os
import statistics

from .. import __version__
from ..algorithms import E4M3_MAX, MIXED_PRECISION
from ..errors import display

# Bumped when a key of the --report document is removed or changes meaning (docs/ci.md).
REPORT_SCHEMA_VERSION = 1


def human_bytes(n: int | float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n} B"


def _module_rows(plan) -> list[tuple[str, str, str, str]]:
    from ..plan.classify import natural_key  # not from plan: plan imports this module

    rows = []
    for mod in sorted(plan.modules.values(), key=lambda m: natural_key(m.name)):
        w = mod.weight or next(iter(mod.tensors.values()))
        action = plan.scheme_of(mod.name).algo if mod.quantize else ("keep" if mod.kind != "other" else "copy")
        leaves = ",".join(mod.tensors)
        shape = f"{w.dtype}{list(w.shape)}"
        reason = f"{mod.reason}; {plan.scheme_rules[mod.name]}" if mod.name in plan.scheme_rules else mod.reason
        rows.append((mod.name or "(top level)", action, f"{shape} [{leaves}]", reason))
    return rows


def _algos(plan) -> str:
    if not plan.mixed:
        return f"{plan.scheme.algo} (quant_algo {plan.scheme.quant_algo!r})"
    used = sorted({s.algo for s in plan.schemes.values()})
    return f"MIXED_PRECISION ({', '.join(used)}; default --algo {plan.scheme.algo})"


def plan_text(plan) -> str:
    """One line per module (action, dtype+shape, tensors, reason), then groups, exclusions, totals."""
    rows = [tuple(display(x) for x in r) for r in _module_rows(plan)]  # names come from strangers' files
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    lines = [
        f"plan: {plan.source.label} -> {_algos(plan)}, recipe {plan.recipe.name}",
        f"{'module':<{w0}}  {'action':<{w1}}  {'source':<{w2}}  reason",
    ]
    lines += [f"{a:<{w0}}  {b:<{w1}}  {c:<{w2}}  {d}" for a, b, c, d in rows]
    if plan.groups:
        shared = "share one global scale" if plan.scheme.shares_global_amax else "are quantized per member"
        shared = "share one global scale where their algorithm has one" if plan.mixed else shared
        lines.append(f"fused groups ({len(plan.groups)}; members {shared}):")
        lines += [display(f"  {k}: {', '.join(v)}") for k, v in plan.groups.items()]
    lines.append(display(f"exclude_modules ({len(plan.exclude_modules)}): {', '.join(plan.exclude_modules) or '(none)'}"))
    n_q = len(plan.quantized)
    lines.append(
        f"totals: {n_q} Linear(s) quantized, {len(plan.modules) - n_q} module(s) kept/copied; "
        f"bytes in {human_bytes(plan.bytes_in)}, out {human_bytes(plan.bytes_out)} in {len(plan.shard_names)} shard(s)"
    )
    lines += [f"warning: {display(w)}" for w in plan.warnings]
    lines += [f"problem: {display(p)}" for p in plan.problems]
    return "\n".join(lines)


def plan_json(plan) -> dict:
    """The plan as plain data (stable keys; compared with == in tests)."""
    return {
        "algo": plan.scheme.algo,
        "quant_algo": MIXED_PRECISION if plan.mixed else plan.scheme.quant_algo,
        "recipe": plan.recipe.name,
        "modules": {
            m.name: {"kind": m.kind, "quantize": m.quantize, "reason": m.reason, "vllm_prefix": m.vllm_prefix, "tensors": sorted(m.tensors),
                     **({"algo": plan.scheme_of(m.name).algo, "algo_rule": plan.scheme_rules[m.name]} if m.name in plan.scheme_rules else {})}
            for m in plan.modules.values()
        },
        "fused_groups": plan.groups,
        "exclude_modules": plan.exclude_modules,
        "outputs": {o.name: {"dtype": o.dtype, "shape": list(o.shape), "shard": plan.shard_names[o.shard]} for o in plan.outputs.values()},
        "bytes_in": plan.bytes_in,
        "bytes_out": plan.bytes_out,
        "warnings": plan.warnings,
        "problems": plan.problems,
    }


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
    value = plan.scheme.static_input_scale
    if value is None:
        return None
    if getattr(plan, "act_scales", None) is not None:
        return calibration_summary(plan, full=True)
    return {"calibrated": False, "input_scale": value, "convention": "activation amax 448 (ModelOpt calibration-free constant)"}


def calibration_summary(plan, full: bool) -> dict:
    """What was calibrated: data, run, and (`full`) per module amax, input_scale, tokens."""
    cal = plan.act_scales
    out = {"calibrated": True, "data": cal.meta.get("data"), "run": cal.meta.get("run"),
           "source": cal.meta.get("source"), "modules": len(cal.input_amax), "kv_scales": len(cal.kv_amax),
           "experts_without_tokens": list(cal.no_tokens)}
    if full:
        algo = plan.scheme.algo
        out["per_module"] = {m: {"amax": a, "input_scale": float(cal.input_scale(m, algo)), "tokens": cal.tokens.get(m, 0)}
                             for m, a in cal.input_amax.items()}
        out["kv"] = {a: {"k_amax": k, "v_amax": v, "k_scale": k / E4M3_MAX, "v_scale": v / E4M3_MAX} for a, (k, v) in cal.kv_amax.items()}
    return out


def write_json(path: str, doc: dict) -> None:
    """Write `doc` as JSON (atomically: temp file + rename)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2, allow_nan=False, default=str)
        f.write("\n")
    os.replace(tmp, path)
