"""Mixed precision (``--algo-for``) in the compressed-tensors format: one config group per algorithm.

Where ModelOpt writes MIXED_PRECISION (mixed.py), compressed-tensors expresses the same plan as
several ``config_groups``, one per preset, each the preset's arguments with its own ``targets``:

* the ``--algo`` group targets ``["Linear"]`` (as a single-algorithm checkpoint does);
* every other group targets the exact names of its modules (HF names: ``...q_proj``), sorted
  (as ModelOpt's mixed ``config_groups``), a MoE layer's experts as one anchored ``re:`` target;
* the top-level ``format`` is ``mixed-precision`` when the groups' formats differ (as
  llm-compressor's ``model_free_ptq`` writes it), and ``ignore`` is the usual exact list.

Why this is read as intended: vLLM 0.33 (``find_matched_target``) and compressed-tensors
(``match_targets``) both try every exact / ``re:`` name target before any class-name target,
so a listed module takes its own group whatever the group order; a fused layer (``qkv_proj``)
matches when all its shards are listed in one group (they always are: a fused group has one
algorithm, mixed.findings), otherwise falls to ``Linear``. A MoE layer is read from expert 0's
names (``get_moe_method``). llm-compressor's own ``model_free_ptq`` takes the first group *in
order* instead; its golden (tests/golden/compressed_tensors/) is made with the ``Linear``
group last. vLLM serves every preset here per Linear and per MoE layer (each CtScheme's vllm_linear / vllm_moe,
checked in tests/golden/compressed_tensors/vllm_mixed_decisions.json), so no combination of
them is refused for serving; an algorithm missing from that table is refused (mixed.findings).
"""

from __future__ import annotations

import re
from typing import Mapping

LINEAR_TARGET = "Linear"


def ct_groups(schemes: Mapping, default, modules: Mapping | None = None) -> dict[str, list[str]]:
    """preset -> targets for a mixed plan (`schemes`: module -> CtScheme; `default`: --algo's;
    `modules`: the plan's modules, to write a MoE layer's experts as one regex, :func:`expert_regexes`).

    Override groups first (in the order their first module is defined), the ``Linear`` group
    last, so that a first-match reader such as llm-compressor's gives the same assignment.
    Example: ``{"FP8_BLOCK": ["model.layers.0.self_attn.q_proj", ...], "NVFP4": ["Linear"]}``."""
    from ..modules.classify import definition_order

    by_preset: dict[str, list[str]] = {}
    for name in sorted(schemes, key=definition_order):
        by_preset.setdefault(schemes[name].preset, []).append(name)
    if default.preset in by_preset:
        by_preset.pop(default.preset)
        by_preset[default.preset] = [LINEAR_TARGET]
    return {preset: targets if targets == [LINEAR_TARGET] else expert_regexes(sorted(targets), modules or {})
            for preset, targets in by_preset.items()}  # sorted, as ModelOpt's groups


def expert_regexes(names: list[str], modules: Mapping) -> list[str]:
    """`names` with every MoE layer whose expert Linears are all here written as one target,
    ``re:<layer>\\.\\d+\\.(?:down_proj|gate_proj|up_proj)$`` (vLLM and compressed-tensors match
    ``re:`` with ``re.match``: anchored at the start; ``$`` anchors the end). It matches exactly
    that layer's experts: 3 x E names become one (a 128-expert, 48-layer model: 18432 -> 48
    targets, a 0.95 MB config block -> 8 kB; vLLM 0.33's from_config + 240 lookups took 4.2-7.6 s with
    the exact names and 0.2 s with the regexes on a shared 2-core CPU)."""
    by_layer: dict[str, list[str]] = {}
    for m in modules.values():
        if m.vllm_prefix.endswith("experts") and m.name != m.vllm_prefix:
            by_layer.setdefault(m.vllm_prefix, []).append(m.name)
    chosen, out = set(names), []
    for prefix, members in by_layer.items():
        tails = [n[len(prefix) + 1:].split(".", 1) for n in members]
        if not set(members) <= chosen or not all(len(t) == 2 and t[0].isdigit() for t in tails):
            continue
        leaves = "|".join(sorted({t[1] for t in tails}))
        out.append(f"re:{re.escape(prefix)}\\.\\d+\\.(?:{leaves})$")
        chosen -= set(members)
    return sorted(chosen) + sorted(out)


def _matches(name: str, target: str) -> bool:
    from .ct_exclusions import entry_matches

    return entry_matches(name, target)


def group_of(name: str, groups: Mapping[str, list[str]]) -> str | None:
    """The config group vLLM gives module `name`: an exact / ``re:`` target first, then ``Linear``."""
    for group, targets in groups.items():
        if any(t != LINEAR_TARGET and _matches(name, t) for t in targets):
            return group
    return next((g for g, targets in groups.items() if LINEAR_TARGET in targets), None)


def group_targets(qconfig: dict) -> dict[str, list[str]]:
    """config group name -> its targets, from a ``quantization_config`` document."""
    return {g: list((cfg or {}).get("targets") or []) for g, cfg in (qconfig.get("config_groups") or {}).items()}


__all__ = ["LINEAR_TARGET", "ct_groups", "group_of", "group_targets"]
