"""Mixed precision: ``--algo-for PATTERN=ALGO`` picks another algorithm for matching modules.

``--algo`` stays the default for every quantized Linear; each ``--algo-for`` rule (first match
wins, in the order given) overrides it for the modules its pattern matches, with the same rules
as ``--exclude`` (vLLM's exact / substring / fnmatch matching, against HF module names and vLLM's
fused names such as ``...qkv_proj``). A plan that ends up with more than one algorithm is written
by the format: ModelOpt's ``MIXED_PRECISION`` (formats/modelopt_documents.py, as ModelOpt 0.47
writes it) or several compressed-tensors config groups (formats/ct_mixed.py).

The rules here hold for every format: vLLM reads the algorithm per layer, so a fused layer (q/k/v,
gate/up) or a MoE layer (all experts) must use one algorithm (vLLM raises on a mix), and only the
algorithms the format's engines serve per layer (``Format.mixed_served``, from its ``served``
table) may be mixed. Everything else is refused here, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..algorithms import MIXED_PRECISION
from ..modules.classify import Module
from ..errors import UsageError
from ..modules.matching import match_reason, vllm_rewrite
from ..schemes import Scheme, get_scheme
from ..problems import ERROR, WARNING, Finding



@dataclass(frozen=True)
class AlgoRule:
    """One ``--algo-for PATTERN=ALGO``: modules matching `pattern` use `scheme`."""

    pattern: str
    scheme: Scheme

    @property
    def text(self) -> str:
        return f"--algo-for '{self.pattern}={self.scheme.algo}'"

    def matches(self, mod: Module) -> bool:
        return any(match_reason(name, e) for e in vllm_rewrite([self.pattern]) for name in (mod.name, mod.vllm_prefix))


def parse_algo_for(specs, fmt=None) -> list[AlgoRule]:
    """``["self_attn*=FP8_PB_WO", ...]`` -> rules; a malformed entry or unknown algo is a usage error.

    `fmt`: the output format (formats/); each rule's scheme writes it (ModelOpt when None)."""
    if fmt is None:
        from ..formats import MODELOPT as fmt

    rules = []
    for spec in specs or ():
        pattern, sep, algo = str(spec).rpartition("=")
        if not sep or not pattern.strip() or not algo.strip():
            raise UsageError(f"--algo-for {spec!r}: expected PATTERN=ALGO, e.g. --algo-for 'self_attn*=FP8_PB_WO'")
        try:
            scheme = fmt.scheme(get_scheme(algo.strip()).algo)
        except UsageError as exc:
            raise UsageError(f"--algo-for {spec!r}: {exc.message}") from None
        rules.append(AlgoRule(pattern.strip(), scheme))
    return rules


def assign(mods: dict[str, Module], default: Scheme, rules: list[AlgoRule]) -> tuple[dict[str, Scheme], dict[str, str]]:
    """Each quantized module's scheme and the rule that chose it (first matching rule, else --algo)."""
    schemes, why = {}, {}
    for mod in mods.values():
        if not mod.quantize:
            continue
        rule = next((r for r in rules if r.matches(mod)), None)
        schemes[mod.name] = rule.scheme if rule else default
        why[mod.name] = rule.text if rule else f"--algo {default.algo}"
    return schemes, why


def is_mixed(schemes: dict[str, Scheme]) -> bool:
    return len({s.algo for s in schemes.values()}) > 1


def findings(mods: dict[str, Module], groups: dict[str, list[Module]], moe: dict[str, list[Module]],
             schemes: dict[str, Scheme], why: dict[str, str], rules: list[AlgoRule], layout: str | None, fmt=None) -> list[Finding]:
    """Split fused groups / MoE layers, combinations vLLM does not serve, unmatched patterns."""
    out = []
    for kind, units in (("fused group", groups), ("MoE layer", moe)):
        for prefix, members in units.items():
            algos = {schemes[m.name].algo: why[m.name] for m in members if m.name in schemes}
            if len(algos) > 1:
                picked = "; ".join(f"{a} by {r}" for a, r in algos.items())
                out.append(Finding(ERROR, "algo-split", prefix,
                    f"{prefix}: the {kind} would mix algorithms ({picked}); vLLM loads it as one layer with one method; "
                    f"make the pattern cover all of {prefix!r} or none of it"))
    quantized = [m for m in mods.values() if m.quantize]
    for i, rule in enumerate(rules):
        matched = [m for m in quantized if rule.matches(m)]
        if not matched:
            out.append(Finding(WARNING, "pattern-unmatched", rule.pattern,
                f"--algo-for {rule.pattern!r} matches no quantized Linear (vLLM's exact/substring/wildcard rules on module "
                f"names such as model.layers.0.self_attn.q_proj); check the pattern"))
            continue
        shadows = [r for r in rules[:i] if any(r.matches(m) for m in matched)]
        if shadows and all(any(r.matches(m) for r in shadows) for m in matched):  # first match wins: never used
            out.append(Finding(WARNING, "pattern-shadowed", rule.pattern,
                f"{rule.text} is shadowed: every module it matches ({len(matched)}, e.g. {matched[0].name}) is taken first by "
                f"{' and '.join(r.text for r in shadows)} (the first matching rule wins); reorder the rules or drop this one"))
    if not is_mixed(schemes):
        return out
    used = {s.algo for s in schemes.values()}
    if fmt is None:
        from ..formats import MODELOPT as fmt
    linear_served, moe_served = fmt.mixed_served()
    where = fmt.mixed_where()
    for algo in sorted(used - set(linear_served)):
        out.append(Finding(ERROR, "mixed-unserved", algo,
            f"--algo-for: {algo} in {where}: vLLM 0.33 serves only {', '.join(linear_served)} per "
            f"layer; choose one of those for these modules"))
    for prefix, members in moe.items():
        algo = next((schemes[m.name].algo for m in members if m.name in schemes), None)
        if algo and algo in linear_served and algo not in moe_served:
            out.append(Finding(ERROR, "mixed-moe-unserved", prefix,
                f"{prefix}: {algo} experts in {where}: vLLM 0.33 serves MoE layers only as "
                f"{', '.join(moe_served)}; choose one of those for the experts"))
    if layout not in (None, "plain"):
        out.append(Finding(ERROR, "layout", layout,
            f"--layout {layout} with --algo-for: packed layouts are written for one algorithm per checkpoint; "
            f"use --layout plain for a MIXED_PRECISION checkpoint"))
    return out
