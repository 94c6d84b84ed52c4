"""The compressed-tensors ``ignore`` list and a replay of how vLLM 0.33 reads it.

vLLM's ``should_ignore_layer`` (compressed_tensors/utils.py) matches an ignore entry against a
module prefix exactly, or as a regex when it starts with ``re:`` (``re.match``: anchored at the
start only); there is no substring or wildcard rule as for ModelOpt's ``exclude_modules``. A
fused layer (``qkv_proj``) matched by no entry itself is ignored when every shard's name is
matched, and mixing ignored and quantized shards is an error. A MoE layer takes the scheme of
expert 0's ``gate/up/down`` names (``get_moe_method``).
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

from ..algorithms import is_experts_prefix
from ..modules.classify import LINEAR, ROUTER, Module
from ..problems import EXCLUDE_MISREAD, Problem


def ct_ignore(mods: dict[str, Module]) -> list[str]:
    """Exact names of every Linear and router left unquantized, sorted.

    Embeddings are not listed: compressed-tensors targets ``Linear`` modules only, and vLLM's
    embedding path reads no scheme unless one targets it explicitly.
    """
    return sorted(m.name for m in mods.values() if not m.quantize and m.kind in (LINEAR, ROUTER))


def entry_matches(name: str, entry: str) -> bool:
    """vLLM's ``is_equal_or_regex_match``: exact, or ``re:`` + a regex matched at the start."""
    return bool(re.match(entry[3:], name)) if entry.startswith("re:") else entry == name


def ct_is_ignored(prefix: str, ignore: list[str], packed: Mapping[str, Iterable[str]]) -> bool:
    """Whether vLLM treats `prefix` as ignored; ValueError where vLLM raises (mixed fused shards)."""
    if any(entry_matches(prefix, e) for e in ignore):
        return True
    proj = prefix.split(".")[-1]
    if proj not in packed:
        return False
    flags = [any(entry_matches(prefix.replace(proj, shard), e) for e in ignore) for shard in packed[proj]]
    if any(flags) and not all(flags):
        raise ValueError(f"some but not all shards of {prefix} are in ignore; vLLM requires one scheme for all shards")
    return all(flags)


def ct_misread(mods: dict[str, Module], ignore: list[str], packed: Mapping[str, Iterable[str]]) -> list[Problem]:
    """Where vLLM would read `ignore` differently from the plan (rule ``exclude-misread``, subject: the prefix)."""
    problems, seen = [], set()
    for mod in mods.values():
        if mod.kind not in (LINEAR, ROUTER):
            continue
        # vLLM asks for the fused prefix once; a MoE layer by its expert-0 names (one per expert here)
        prefix = mod.name if is_experts_prefix(mod.vllm_prefix) else mod.vllm_prefix
        if prefix in seen:
            continue
        seen.add(prefix)
        try:
            ignored = ct_is_ignored(prefix, ignore, packed)
        except ValueError as exc:
            problems.append(Problem(EXCLUDE_MISREAD, prefix, f"{prefix}: {exc}"))
            continue
        if ignored == mod.quantize:
            state = "quantized" if mod.quantize else "kept unquantized"
            problems.append(Problem(EXCLUDE_MISREAD, prefix, f"{prefix}: {state}, but vLLM's compressed-tensors loader would "
                                    f"read ignore as the opposite; exclude or keep the whole module consistently"))
    return problems
