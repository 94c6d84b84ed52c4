"""``quantize check``: what a conversion would decide, and what would break at serve time.

Reads only config.json and the safetensors headers (for a Hub id, the headers are fetched
remotely; no weights). Builds the same plan ``convert`` builds, with the same findings
(validate.py), and adds the analysis of every exclude pattern under vLLM's rules: the modules it
matches and how (exact, wildcard, substring), and warnings when it matches nothing, only part of a
fused group or MoE layer, or more than it seems through vLLM's legacy substring rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..algorithms import MIXED_PRECISION, is_expert_linear
from ..modules.classify import LINEAR, ROUTER, Module
from ..errors import display
from ..modules.matching import match_reason, vllm_rewrite
from .audience import model_kind
from .build import Plan, natural_key
from .suggest import fix_line, one_exclude
from ..problems import ERROR, WARNING, Finding, FindingsResult


@dataclass
class PatternReport:
    """One exclude pattern and what it matches (module names, grouped by vLLM rule)."""

    pattern: str
    origin: str  # "--exclude" or "recipe <name>"
    matches: dict[str, list[str]] = field(default_factory=lambda: {"exact": [], "wildcard": [], "regex": [], "substring": []})

    @property
    def modules(self) -> list[str]:
        return sorted({m for v in self.matches.values() for m in v}, key=natural_key)

    def to_json(self) -> dict:
        return {"pattern": self.pattern, "origin": self.origin, "modules": self.modules, "via": self.matches}


def _how(mod: Module, pattern: str) -> str | None:
    """The strongest vLLM rule by which `pattern` matches `mod` (HF name or vLLM prefix)."""
    found = set()
    for entry in vllm_rewrite([pattern]):
        for name in (mod.name, mod.vllm_prefix):
            how = match_reason(name, entry)
            if how:
                found.add(how)
    for how in ("exact", "wildcard", "regex", "substring"):
        if how in found:
            return how
    return None


def _at_boundary(pattern: str, name: str) -> bool:
    """Whether `pattern` occurs in `name` as whole dotted components (``layers.1`` in ``x.layers.1.y``)."""
    start = name.find(pattern)
    while start >= 0:
        end = start + len(pattern)
        if (start == 0 or name[start - 1] == ".") and (end == len(name) or name[end] == "."):
            return True
        start = name.find(pattern, start + 1)
    return False


def analyse_pattern(pattern: str, origin: str, mods: dict[str, Module], groups: dict[str, list[str]]) -> tuple[PatternReport, list[Finding]]:
    """Match `pattern` against every Linear/router and derive its findings."""
    rep = PatternReport(pattern, origin)
    for mod in mods.values():
        if mod.kind in (LINEAR, ROUTER):
            how = _how(mod, pattern)
            if how:
                rep.matches[how].append(mod.name)
    findings = partial_groups(rep, groups)
    surprising = [m for m in rep.matches["substring"] if m not in rep.matches["exact"] and m not in rep.matches["wildcard"]
                  and not _at_boundary(pattern, m) and not _at_boundary(pattern, mods[m].vllm_prefix)]
    if surprising and origin == "--exclude":
        shown = ", ".join(sorted(surprising, key=natural_key)[:3])
        findings.append(Finding(WARNING, "pattern-substring", pattern,
            f"--exclude {pattern!r} also matches {len(surprising)} module(s) through vLLM's legacy substring rule in the "
            f"middle of a name component (e.g. {shown}); anchor it (e.g. {pattern.rstrip('.*') + '.*'!r}) if that is not meant"))
    return rep, findings


def partial_groups(rep: PatternReport, groups: dict[str, list[str]]) -> list[Finding]:
    """An error for each fused group (or MoE layer) the pattern keeps only part of: vLLM raises on it."""
    findings = []
    hit = set(rep.modules)  # a pattern matching nothing is already a plan warning (validate.py)
    for prefix, members in groups.items():
        inside = [m for m in members if m in hit]
        if inside and len(inside) != len(members):
            findings.append(Finding(ERROR, "pattern-partial-group", rep.pattern,
                f"{rep.origin} {rep.pattern!r} matches {', '.join(inside)} but not all of fused {prefix}; vLLM raises on mixed "
                f"precision in a fused layer; use {prefix!r} to exclude the whole group"))
    return findings


def recipe_rule_report(rule, plan: Plan) -> PatternReport:
    """A recipe exclude rule and the Linears it keeps. The planner matches recipe rules with fnmatch
    on the module name (modules/recipe.py), not with vLLM's exclude_modules rules as a user's
    --exclude is: analysing `output` with vLLM's substring rule listed BERT's `attention.output.dense`
    layers, which the rule does not keep (what is written is the kept names, never the pattern)."""
    rep = PatternReport(rule.pattern, f"recipe {plan.recipe.name}")
    for mod in plan.modules.values():
        if mod.kind == LINEAR and not mod.subtree and plan.recipe.excluded_by(mod.name) == rule:
            rep.matches["exact" if mod.name == rule.pattern else "wildcard"].append(mod.name)
    return rep


def _fix_json(found) -> dict | None:
    if found is None:
        return None
    pattern, kept, errors = found
    return {"exclude": pattern, "modules": kept, "errors": errors}


@dataclass
class CheckResult(FindingsResult):
    plan: Plan
    tp: int
    patterns: list[PatternReport]
    findings: list[Finding]

    def to_json(self) -> dict:
        p = self.plan
        return {
            "schema_version": 1,  # docs/ci.md: bumped when a key is removed or changes meaning
            "command": "check",
            "source": p.source.label,
            "algo": p.scheme.algo,
            "quant_algo": MIXED_PRECISION if p.mixed else p.scheme.quant_algo,
            "recipe": p.recipe.name,
            "tp": self.tp,
            "kind": model_kind(p.source.config),  # what eval gates it as: causal-lm or encoder
            "ok": not self.errors,
            "summary": {"errors": len(self.errors), "warnings": len(self.warnings),
                        "linears": sum(m.kind == LINEAR for m in p.modules.values()), "quantized": len(p.quantized)},
            "modules": [
                {"module": m.name, "vllm_prefix": m.vllm_prefix, "kind": m.kind, "quantized": m.quantize, "rule": m.reason,
                 "shape": list(m.weight.shape) if m.weight else None, "fused_group": m.fused_group,
                 "algo": p.scheme_of(m.name).algo if m.quantize else None, "algo_rule": p.scheme_rules.get(m.name)}
                for m in sorted(p.modules.values(), key=lambda m: natural_key(m.name)) if m.kind in (LINEAR, ROUTER)
            ],
            "fused_groups": p.groups,
            "patterns": [r.to_json() for r in self.patterns],
            "exclude_modules": p.exclude_modules,
            "findings": [f.to_json() for f in self.findings],
            "fix": _fix_json(one_exclude(p.modules, self.findings)),  # one --exclude for many shape / layout errors
            "format": p.format.name,
            "vllm_schemes": p.format.vllm_decisions(p),  # compressed-tensors: what vLLM 0.33 picks per module
        }

    def to_text(self) -> str:
        p = self.plan
        lines = [f"check: {p.source.label}  algo {p.scheme.algo}  format {p.format.name}  recipe {p.recipe.name}  tp {self.tp}"]
        rows = [(display(m.name), p.scheme_of(m.name).algo if m.quantize else "keep",
                 display(f"{m.reason}; {p.scheme_rules[m.name]}" if m.name in p.scheme_rules else m.reason))
                for m in sorted(p.modules.values(), key=lambda m: natural_key(m.name)) if m.kind in (LINEAR, ROUTER)]
        w = max((len(r[0]) for r in rows), default=6)
        lines.append(f"{'module':<{w}}  {'decision':<11}  rule")
        lines += [f"{a:<{w}}  {b:<11}  {c}" for a, b, c in rows]
        if self.patterns:
            lines.append("patterns:")
            for r in self.patterns:
                via = ", ".join(f"{k} {len(v)}" for k, v in r.matches.items() if v) or "nothing"
                lines.append(display(f"  {r.origin} {r.pattern!r}: {len(r.modules)} module(s) ({via})"))
        lines.append(display(f"exclude_modules to write ({len(p.exclude_modules)}): {', '.join(p.exclude_modules) or '(none)'}"))
        for f in self.findings:  # names in messages come from strangers' files: one line each, no escape codes
            lines.append(f"{f.level.upper():<7}  [{f.code}] {display(f.message)}")
        fix = fix_line(p.modules, self.findings)
        if fix:
            lines.append(display(fix))
        verdict = "FAIL" if self.errors else "OK"
        lines.append(f"result: {len(self.errors)} error(s), {len(self.warnings)} warning(s) -> {verdict}")
        return "\n".join(lines)


def run_check(plan: Plan, exclude, tp: int) -> CheckResult:
    """Pattern analysis on top of the plan's own findings (deduplicated by message)."""
    groups = dict(plan.groups)
    for m in plan.modules.values():  # MoE layers behave like fused groups for exclusion
        if m.kind == LINEAR and is_expert_linear(m.name, m.vllm_prefix):
            groups.setdefault(m.vllm_prefix, []).append(m.name)
    reports, findings = [], list(plan.findings)
    for pat in exclude:
        rep, f = analyse_pattern(pat, "--exclude", plan.modules, groups)
        reports.append(rep)
        findings += f
    for rule in plan.recipe.exclude:  # what the rule kept, as the planner matched it (fnmatch, first rule wins)
        rep = recipe_rule_report(rule, plan)
        if rep.modules:  # a default rule that keeps nothing here (BERT has no lm_head) is not worth a line
            reports.append(rep)
            findings += partial_groups(rep, groups)
    seen: set = set()  # one finding per message (the plan may already report the same offender)
    findings = [x for x in findings if not (x.message in seen or seen.add(x.message))]
    return CheckResult(plan, tp, reports, findings)
