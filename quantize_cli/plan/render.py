"""The plan as people and programs read it: ``--dry-run``'s text and ``Plan.to_json`` (plain data)."""

from __future__ import annotations

from ..algorithms import MIXED_PRECISION
from ..console import human_bytes
from ..errors import display
from ..modules.classify import natural_key




def _module_rows(plan) -> list[tuple[str, str, str, str]]:
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
        return f"{plan.scheme.algo} ({plan.format.written_as(plan.scheme)})"  # what the chosen format writes
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


__all__ = ["plan_text", "plan_json"]
