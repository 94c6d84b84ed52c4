"""Mixed precision: ``--algo-for PATTERN=ALGO`` picks another algorithm for matching modules.

``--algo`` stays the default for every quantized Linear; each ``--algo-for`` rule (first match
wins, in the order given) overrides it for the modules its pattern matches, with the same rules
as ``--exclude`` (vLLM's exact / substring / fnmatch matching, against HF module names and vLLM's
fused names such as ``...qkv_proj``). A plan that ends up with more than one algorithm is written
the way ModelOpt 0.47 writes one (``quant_algo: "MIXED_PRECISION"``, spec §1.1-1.3):

* ``hf_quant_config.json``: ``{"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": ...,
  "quantized_layers": {module: {"quant_algo": ..., ["group_size": ...]}}}`` (no exclude list:
  a Linear absent from ``quantized_layers`` is unquantized);
* ``config.json``: one ``config_groups`` entry per distinct layer dict (``targets`` = its sorted
  modules), ``quantized_layers`` copied, ``ignore: []``.

vLLM 0.33 (``ModelOptMixedPrecisionConfig``) reads the algorithm per layer: a fused layer (q/k/v,
gate/up) or a MoE layer (all experts) must use one algorithm (vLLM raises on a mix), and only
FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4, W4A16_NVFP4 and MXFP8 are served per layer
(MoE: FP8, FP8_PB_WO, NVFP4, W4A16_NVFP4, MXFP8). Everything else is refused here, with the reason.

With ``--format compressed-tensors`` the same plan is written as one config group per algorithm
(formats/ct_mixed.py); the rules (split fused groups / MoE layers refused) are the same, the
served table is that format's (:func:`served`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..algorithms import ALGOS, MIXED_PRECISION
from .classify import Module
from ..errors import UsageError
from .matching import match_reason, vllm_rewrite
from ..schemes import Scheme, get_scheme
from .validate import ERROR, WARNING, Finding

MIXED = MIXED_PRECISION
# What vLLM 0.33's ModelOptMixedPrecisionConfig serves per layer (LINEAR_ALGOS, RoutedExperts branch).
LINEAR_SERVED = tuple(a for a in ALGOS if a != "INT8")  # ModelOpt W8A16 is not among them
MOE_SERVED = ("FP8", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "MXFP8")


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


def parse_algo_for(specs, format: str | None = None) -> list[AlgoRule]:
    """``["self_attn*=FP8_PB_WO", ...]`` -> rules; a malformed entry or unknown algo is a usage error.

    `format`: the output format (``--format``); each rule's scheme writes it (compressed-tensors:
    the algorithm's preset, formats.CT_SCHEMES)."""
    from ..formats import scheme_for

    rules = []
    for spec in specs or ():
        pattern, sep, algo = str(spec).rpartition("=")
        if not sep or not pattern.strip() or not algo.strip():
            raise UsageError(f"--algo-for {spec!r}: expected PATTERN=ALGO, e.g. --algo-for 'self_attn*=FP8_PB_WO'")
        try:
            scheme = scheme_for(format, get_scheme(algo.strip()))
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
             schemes: dict[str, Scheme], why: dict[str, str], rules: list[AlgoRule], layout: str | None) -> list[Finding]:
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
    linear_served, moe_served, where = served(schemes)
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


def served(schemes: dict[str, Scheme]) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """(algorithms vLLM serves per Linear, per MoE layer, the checkpoint's description) for the
    format the schemes write: ModelOpt MIXED_PRECISION, or compressed-tensors config groups
    (every preset of formats.vllm_ct.VLLM_CT has a Linear and a MoE method in vLLM 0.33)."""
    from ..formats.ct_exclusions import is_ct

    if any(is_ct(s) for s in schemes.values()):
        from ..formats.vllm_ct import VLLM_CT

        return tuple(VLLM_CT), tuple(VLLM_CT), "a compressed-tensors checkpoint with several config_groups"
    return LINEAR_SERVED, MOE_SERVED, "a MIXED_PRECISION checkpoint"


def layer_config(scheme: Scheme) -> dict:
    """ModelOpt's per-layer dict (``process_layer_quant_config``)."""
    cfg: dict = {"quant_algo": scheme.quant_algo}
    if scheme.group_size is not None:
        cfg["group_size"] = scheme.group_size
    return cfg


# The order in which a decoder's modules are defined (ModelOpt lists layers in the model's
# named_modules() order, which also numbers the config groups): attention before the MLP,
# projections q, k, v, o, then gate, up, down; a MoE block's experts before its shared expert.
_DEFINITION_RANK = {name: i for i, name in enumerate((
    "self_attn", "attn", "attention", "mlp", "block_sparse_moe", "feed_forward",
    "q_proj", "q_a_proj", "q_b_proj", "k_proj", "v_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
    "gate", "experts", "shared_expert", "shared_experts", "gate_proj", "w1", "up_proj", "w3", "down_proj", "w2"))}


def definition_order(name: str) -> tuple:
    """Sort key: numbers numerically, known components in definition order, others by name."""
    return tuple((0, int(c), "") if c.isdigit() else (1, _DEFINITION_RANK.get(c, len(_DEFINITION_RANK)), c)
                 for c in name.split("."))


def quantized_layers(schemes: dict[str, Scheme]) -> dict[str, dict]:
    """Module -> layer dict, in the model's definition order (:func:`definition_order`)."""
    return {name: layer_config(schemes[name]) for name in sorted(schemes, key=definition_order)}


def hf_quant_config(schemes: dict[str, Scheme], kv_algo: str | None, producer: dict, converter: dict) -> dict:
    """The nested ``hf_quant_config.json`` of a MIXED_PRECISION checkpoint."""
    quant = {"quant_algo": MIXED, "kv_cache_quant_algo": kv_algo, "quantized_layers": quantized_layers(schemes)}
    return {"producer": dict(producer), "quantization": quant, "converter": dict(converter)}


def _group(quant_algo: str, group_size: int | None) -> dict:
    """ModelOpt's ``_quant_algo_to_group_config`` for the algorithms we write."""
    f8 = {"dynamic": False, "num_bits": 8, "type": "float"}
    if quant_algo == "FP8":
        return {"input_activations": dict(f8), "weights": dict(f8)}
    if quant_algo == "FP8_PER_CHANNEL_PER_TOKEN":
        return {"input_activations": dict(f8), "weights": {**f8, "strategy": "channel"}}
    if quant_algo in ("NVFP4", "W4A16_NVFP4"):
        gs = group_size or 16
        w = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": gs}
        return {"weights": w} if quant_algo == "W4A16_NVFP4" else {"input_activations": dict(w), "weights": dict(w)}
    if quant_algo == "MXFP8":
        gs = group_size or 32
        return {"input_activations": {**f8, "group_size": gs}, "weights": {**f8, "group_size": gs}}
    return {"quant_algo": quant_algo}  # fp8_pb_wo, W8A16: ModelOpt has no group details for them


def config_groups(layers: dict[str, dict]) -> dict:
    """One group per distinct layer dict (in first-seen order), targets sorted."""
    by_cfg: dict[tuple, list[str]] = defaultdict(list)
    for name, cfg in layers.items():
        by_cfg[tuple(sorted(cfg.items()))].append(name)
    groups = {}
    for i, (key, names) in enumerate(by_cfg.items()):
        cfg = dict(key)
        g = _group(cfg.get("quant_algo", ""), cfg.get("group_size"))
        g["targets"] = sorted(names)
        groups[f"group_{i}"] = g
    return groups
