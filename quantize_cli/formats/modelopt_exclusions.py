"""Build ``exclude_modules`` and prove that vLLM will read it as intended.

The list (design §7): exact HF names of every Linear left unquantized (lm_head, routers, user
exclusions), every embedding (ModelOpt lists ``model.embed_tokens``), whole kept subtrees as
``prefix*`` (vision towers, MTP layers) and MoE experts only as a whole layer (``...mlp.experts``).
Fused groups are complete by construction (a partial exclusion is refused earlier).

:func:`verify_exclusions` then replays vLLM's matcher over every module prefix, with and without
vLLM's ``x*`` rewrite: every quantized Linear must stay quantized and every kept Linear excluded.
A trap such as the router ``...mlp.gate`` being a substring of a quantized ``...mlp.gate_up_proj``
is reported with the fix instead of producing a checkpoint that loads wrong.
"""

from __future__ import annotations

from typing import Iterable

from ..algorithms import is_experts_prefix
from ..modules.classify import EMBEDDING, LINEAR, ROUTER, Module
from ..modules.matching import MixedFusedShards, match_reason, vllm_is_excluded, vllm_rewrite
from ..problems import EXCLUDE_MISREAD, Problem


def build_exclude_modules(mods: dict[str, Module], packed: dict[str, Iterable[str]]) -> list[str]:
    """The sorted ``exclude_modules`` list for the decided modules."""
    entries: set[str] = set()
    quantized_prefixes = [m.vllm_prefix for m in mods.values() if m.quantize]
    for mod in mods.values():
        if mod.quantize or mod.kind not in (LINEAR, ROUTER, EMBEDDING):
            continue
        if mod.subtree:
            pattern = mod.subtree + "*"
            variants = ([pattern], vllm_rewrite([pattern]))
            if not any(vllm_is_excluded(p, v, {}) for p in quantized_prefixes for v in variants):
                entries.add(pattern)
                continue
        # A kept expert excludes the whole MoE layer: vLLM has one module for all experts.
        entries.add(mod.vllm_prefix if is_experts_prefix(mod.vllm_prefix) else mod.name)
    return sorted(entries)


def verify_exclusions(mods: dict[str, Module], entries: list[str], packed: dict[str, Iterable[str]]) -> list[Problem]:
    """Where vLLM would not read `entries` as the plan decided (rule ``exclude-misread``, subject: the vLLM prefix)."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for mod in mods.values():
        if mod.kind not in (LINEAR, ROUTER) or mod.vllm_prefix in seen:
            continue
        seen.add(mod.vllm_prefix)
        for variant, label in ((entries, ""), (vllm_rewrite(entries), " (after vLLM's x* -> x, x.* rewrite)")):
            try:
                excluded = vllm_is_excluded(mod.vllm_prefix, variant, packed)
            except MixedFusedShards as exc:
                problems.append(Problem(EXCLUDE_MISREAD, mod.vllm_prefix, f"{mod.vllm_prefix}: {exc}"))
                break
            if excluded and mod.quantize:
                culprit = _culprit(mod.vllm_prefix, variant)
                problems.append(Problem(EXCLUDE_MISREAD, mod.vllm_prefix,
                    f"{mod.vllm_prefix}: quantized, but vLLM would treat it as excluded{label} because of entry "
                    f"{culprit!r} (substring/wildcard rule); also --exclude {mod.name!r} or keep {culprit!r} quantized"))
                break
            if not excluded and not mod.quantize:
                problems.append(Problem(EXCLUDE_MISREAD, mod.vllm_prefix,
                                        f"{mod.vllm_prefix}: kept in the source dtype but vLLM would quantize it{label}"))
                break
    return problems


def _culprit(prefix: str, entries: list[str]) -> str:
    return next((e for e in entries if match_reason(prefix, e)), "?")
