"""Mixed precision (``--algo-for``) in the compressed-tensors format: one config group per algorithm.

Where ModelOpt writes MIXED_PRECISION (mixed.py), compressed-tensors expresses the same plan as
several ``config_groups``, one per preset, each the preset's arguments with its own ``targets``:

* the ``--algo`` group targets ``["Linear"]`` (as a single-algorithm checkpoint does);
* every other group targets the exact names of its modules (HF names: ``...q_proj``, every
  expert's ``...experts.3.gate_proj``), sorted (as ModelOpt's mixed ``config_groups``);
* the top-level ``format`` is ``mixed-precision`` when the groups' formats differ (as
  llm-compressor's ``model_free_ptq`` writes it), and ``ignore`` is the usual exact list.

Why this is read as intended: vLLM 0.33 (``find_matched_target``) and compressed-tensors
(``match_targets``) both try every exact / ``re:`` name target before any class-name target,
so a listed module takes its own group whatever the group order; a fused layer (``qkv_proj``)
matches when all its shards are listed in one group (they always are: a fused group has one
algorithm, mixed.findings), otherwise falls to ``Linear``. A MoE layer is read from expert 0's
names (``get_moe_method``). llm-compressor's own ``model_free_ptq`` takes the first group *in
order* instead; its golden (tests/golden/compressed_tensors/) is made with the ``Linear``
group last. vLLM serves every preset here per Linear and per MoE layer (vllm_ct.VLLM_CT,
checked in tests/golden/compressed_tensors/vllm_mixed_decisions.json), so no combination of
them is refused for serving; an algorithm missing from that table is refused (mixed.findings).
"""

from __future__ import annotations

from typing import Mapping

LINEAR_TARGET = "Linear"


def ct_groups(schemes: Mapping, default) -> dict[str, list[str]]:
    """preset -> targets for a mixed plan (`schemes`: module -> CtScheme; `default`: --algo's).

    Override groups first (in the order their first module is defined), the ``Linear`` group
    last, so that a first-match reader such as llm-compressor's gives the same assignment.
    Example: ``{"FP8_BLOCK": ["model.layers.0.self_attn.q_proj", ...], "NVFP4": ["Linear"]}``."""
    from ..mixed import definition_order

    by_preset: dict[str, list[str]] = {}
    for name in sorted(schemes, key=definition_order):
        by_preset.setdefault(schemes[name].preset, []).append(name)
    if default.preset in by_preset:
        by_preset.pop(default.preset)
        by_preset[default.preset] = [LINEAR_TARGET]
    return {preset: sorted(targets) for preset, targets in by_preset.items()}  # sorted, as ModelOpt's groups


def _matches(name: str, target: str) -> bool:
    from .exclusions import entry_matches

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
