"""Decide, from names and header shapes alone, what every module is and whether it is quantized.

A module is the tensor name minus its last component (``a.b.weight`` -> ``a.b``). A Linear is a
module with a 2-D floating ``weight`` that is not an embedding, a norm or a router. Each module
gets one decision with the rule that made it, in this order: subtree (vision tower, MTP layer),
router, embedding / norm / other non-Linear, recipe exclusion (lm_head ...), user ``--exclude``,
else quantized. User patterns are matched with vLLM's exclude_modules semantics (exact,
substring, fnmatch) against both the HF module name and vLLM's fused name for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..checkpoint.safetensors_header import FLOAT_SOURCE_DTYPES, TensorInfo
from .experts import expert_names
from .matching import match_reason, vllm_rewrite
from .recipe import Recipe

_EMBEDDING = re.compile(r"(embed|wte|wpe|position)", re.IGNORECASE)
_NORM = re.compile(r"(norm|ln_\d*|^ln$|layernorm)", re.IGNORECASE)
_LAYER = re.compile(r"^(.*?\blayers)\.(\d+)(\.|$)")

LINEAR, EMBEDDING, NORM, ROUTER, OTHER = "linear", "embedding", "norm", "router", "other"


@dataclass
class Module:
    """One module of the source checkpoint and the decision taken for it."""

    name: str
    tensors: dict[str, TensorInfo]  # leaf ("weight", "bias", ...) -> info
    kind: str = OTHER
    quantize: bool = False
    reason: str = ""
    vllm_prefix: str = ""
    fused_group: str | None = None  # vLLM fused prefix this Linear belongs to
    subtree: str | None = None  # root of a kept subtree (vision tower, MTP layer)
    matched_by: list[str] = field(default_factory=list)  # user patterns that matched it

    @property
    def weight(self) -> TensorInfo | None:
        return self.tensors.get("weight")


def group_modules(tensors: dict[str, TensorInfo]) -> dict[str, Module]:
    """Group tensor infos by module name, keeping the source order of first appearance."""
    mods: dict[str, Module] = {}
    for info in tensors.values():
        mods.setdefault(info.module, Module(info.module, {})).tensors[info.leaf] = info
    return mods


def _at_linear_position(last: str, recipe: Recipe) -> bool:
    """Whether a module named `last` is a Linear by name (``*_proj``, a fused member or an expert projection)."""
    return last.endswith("_proj") or last in recipe.member_to_fused() or last in expert_names(recipe).values()


def _kind(mod: Module, recipe: Recipe) -> str:
    w = mod.weight
    last = mod.name.rpartition(".")[2]
    if w is None or len(w.shape) != 2 or w.dtype not in FLOAT_SOURCE_DTYPES:
        if w is not None and _at_linear_position(last, recipe):
            return LINEAR  # a malformed Linear weight: validate.py refuses it (never silently copied)
        return NORM if w is not None and _NORM.search(last) else OTHER
    if recipe.is_router(mod.name):
        return ROUTER
    if _EMBEDDING.search(last):
        return EMBEDDING
    if _NORM.search(last):
        return NORM
    return LINEAR


def subtree_root(name: str, recipe: Recipe, num_layers: int | None) -> tuple[str, str] | None:
    """The kept subtree (root, reason) containing module `name`, if any.

    Subtrees are the recipe's ``subtrees`` patterns matched against each dotted prefix of the
    name, and decoder layers at index >= ``num_hidden_layers`` (DeepSeek-style MTP layers).
    """
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        for rule in recipe.subtrees:
            if rule.matches(prefix):
                return prefix, rule.reason
    m = _LAYER.match(name)
    if m and num_layers is not None and int(m.group(2)) >= num_layers:
        return f"{m.group(1)}.{m.group(2)}", f"multi-token-prediction (MTP) layer: index {m.group(2)} >= num_hidden_layers {num_layers}"
    return None


def vllm_prefix(module: str, recipe: Recipe) -> tuple[str, str | None]:
    """vLLM's module prefix for an HF module, and the group sharing its global scale, if any.

    Example: ``model.layers.0.self_attn.k_proj`` -> ``("model.layers.0.self_attn.qkv_proj", same)``;
    an expert ``model.layers.0.mlp.experts.3.up_proj`` -> ``("model.layers.0.mlp.experts",
    "model.layers.0.mlp.experts.3.gate_proj+up_proj")``: vLLM loads all experts as one module and
    fuses each expert's gate and up (w1/w3) into w13.
    """
    parent, _, last = module.rpartition(".")
    experts = expert_container(module)
    if experts:
        names = expert_names(recipe)
        pair = f"{parent}.{names['gate']}+{names['up']}" if last in (names["gate"], names["up"]) else None
        return experts, pair
    fused = recipe.member_to_fused().get(last)
    if fused and fused != last:
        p = f"{parent}.{fused}" if parent else fused
        return p, p
    return module, None


_EXPERT = re.compile(r"^(.*\.experts)\.\d+\.[^.]+$")


def expert_container(module: str) -> str | None:
    """``...mlp.experts`` for a per-expert module ``...mlp.experts.{e}.{proj}``, else None."""
    m = _EXPERT.match(module)
    return m.group(1) if m else None


def user_rule_match(mod: Module, patterns: list[str]) -> list[str]:
    """The user patterns that exclude `mod` under vLLM's rules (HF name or vLLM prefix)."""
    hits = []
    for pat in patterns:
        for entry in vllm_rewrite([pat]):
            if match_reason(mod.name, entry) or match_reason(mod.vllm_prefix, entry):
                hits.append(pat)
                break
    return hits


def classify(
    tensors: dict[str, TensorInfo], recipe: Recipe, user_excludes: list[str], num_layers: int | None
) -> dict[str, Module]:
    """Every module with its kind, decision and reason (see the module docstring for the order)."""
    mods = group_modules(tensors)
    for mod in mods.values():
        mod.kind = _kind(mod, recipe)
        mod.vllm_prefix, mod.fused_group = vllm_prefix(mod.name, recipe)
        if mod.kind != LINEAR:
            mod.fused_group = None
        sub = subtree_root(mod.name, recipe, num_layers)
        if mod.kind == LINEAR:
            mod.matched_by = user_rule_match(mod, user_excludes)
        if sub:
            mod.subtree, mod.reason = sub[0], f"kept: {sub[1]} (subtree {sub[0]}*)"
        elif mod.kind == ROUTER:
            mod.reason = "kept: MoE router (never quantized)"
        elif mod.kind == EMBEDDING:
            mod.reason = "kept: embedding (not a Linear)"
        elif mod.kind == NORM:
            mod.reason = "kept: norm (not a Linear)"
        elif mod.kind == OTHER:
            mod.reason = "copied: not a 2-D floating Linear weight"
        elif (rule := recipe.excluded_by(mod.name)) is not None:
            mod.reason = f"kept: {rule.reason} (recipe {recipe.name})"
        elif mod.matched_by:
            mod.reason = f"kept: --exclude {mod.matched_by[0]!r}"
        else:
            mod.quantize = True
            mod.reason = "quantized" + (f" (fused {mod.fused_group.rpartition('.')[2]})" if mod.fused_group else "")
    return mods


def fused_groups(mods: dict[str, Module], recipe: Recipe) -> dict[str, list[Module]]:
    """vLLM fused prefix -> its member Linears (groups of two or more, in the recipe's member order)."""
    groups: dict[str, list[Module]] = {}
    for mod in mods.values():
        if mod.kind == LINEAR and mod.fused_group:
            groups.setdefault(mod.fused_group, []).append(mod)
    rank = {m: i for members in recipe.fused.values() for i, m in enumerate(members)}
    names = expert_names(recipe)
    rank.update({names["gate"]: 0, names["up"]: 1})
    return {
        k: sorted(v, key=lambda m: rank.get(m.name.rpartition(".")[2], 0))
        for k, v in sorted(groups.items(), key=lambda kv: natural_key(kv[0]))
        if len(v) > 1
    }


def natural_key(name: str) -> list:
    """Sort key putting ``layers.2`` before ``layers.10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


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
