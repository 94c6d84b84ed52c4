"""vLLM's reading of ``exclude_modules``, reproduced exactly (vLLM 0.33 ``ModelOptQuantConfigBase``).

vLLM matches the list against its own module prefixes, not tensor names: a fused layer is
``...self_attn.qkv_proj`` (members ``q_proj``/``k_proj``/``v_proj``), all experts of a MoE layer
are one module ``...mlp.experts``. For a prefix it tries, in order:

1. exact match (``is_layer_skipped``): a fused prefix listed by its own name is skipped; otherwise
   it is skipped iff every member's name is listed, and a mix raises ("some but not all shards");
   a prefix containing ``experts`` is skipped if it is a substring of any listed name that
   contains ``experts`` (so one listed expert excludes the whole layer);
2. the legacy substring test ``entry in prefix`` (``model.layers.1`` also hits ``model.layers.10``);
3. ``fnmatch(prefix, entry)`` where ``*`` spans dots.

Before matching, models with a weight-name mapper rewrite ``x*`` to ``x`` and ``x.*`` (vLLM PR
#30164), which makes ``x`` a substring pattern too; :func:`vllm_rewrite` applies that.

A user's ``--exclude re:REGEX`` is llm-compressor's ``ignore`` syntax (compressed-tensors'
``match_name``: ``re.match``, anchored at the start of the module name) and selects modules only:
what is written is always the exact module names, so the lint of the written list keeps vLLM's rules.
"""

from __future__ import annotations

import re
from fnmatch import fnmatch
from typing import Iterable, Mapping


class MixedFusedShards(ValueError):
    """vLLM would raise: some but not all members of a fused layer are excluded."""


REGEX = "re:"  # llm-compressor's prefix of a regular-expression target or ignore entry


def regex_problem(pattern: str) -> str | None:
    """Why `pattern` (``re:...``) is not a Python regular expression, or None."""
    if not pattern.startswith(REGEX):
        return None
    try:
        re.compile(pattern[len(REGEX):])
    except re.error as exc:
        return f"--exclude {pattern!r}: not a Python regular expression ({exc}); fix it or use an fnmatch pattern"
    return None


def vllm_rewrite(entries: Iterable[str]) -> list[str]:
    """vLLM's ``apply_vllm_mapper`` rewrite: ``x*`` (not ``x.*``) -> ``x``, ``x.*``."""
    out: list[str] = []
    for e in entries:
        if e.startswith(REGEX):
            out.append(e)
        elif len(e) >= 2 and e[-1] == "*" and e[-2] != ".":
            out += [e[:-1], e[:-1] + ".*"]
        else:
            out.append(e)
    return out


def _exact_skipped(prefix: str, entries: list[str], packed: Mapping[str, Iterable[str]]) -> bool:
    proj = prefix.split(".")[-1]
    if proj in packed and prefix in entries:
        return True
    if proj in packed:
        flags = {prefix.replace(proj, member) in entries for member in packed[proj]}
        if len(flags) > 1:
            raise MixedFusedShards(
                f"some but not all shards of {prefix} are excluded; vLLM requires all shards of a fused layer to share one precision"
            )
        return flags.pop()
    if "experts" in prefix:
        return any(prefix in e for e in entries if "experts" in e)
    return prefix in entries


def vllm_is_excluded(prefix: str, entries: list[str], packed: Mapping[str, Iterable[str]]) -> bool:
    """Whether vLLM leaves the module at `prefix` unquantized given `entries` (exclude_modules).

    Raises :class:`MixedFusedShards` where vLLM raises. Example: with ``entries=["lm_head"]``,
    ``vllm_is_excluded("lm_head", ...)`` is True and ``"model.layers.0.mlp.gate_up_proj"`` False.
    """
    if not entries:
        return False
    if _exact_skipped(prefix, entries, packed):
        return True
    if any(e != prefix and e in prefix for e in entries):
        return True
    return any(fnmatch(prefix, e) for e in entries)


def match_reason(prefix: str, entry: str) -> str | None:
    """How one entry matches `prefix` under vLLM's rules ("exact", "substring", "wildcard"), or
    "regex" for llm-compressor's ``re:`` entry (``re.match``, as compressed-tensors' ``match_name``)."""
    if entry.startswith(REGEX):
        return "regex" if re.match(entry[len(REGEX):], prefix) else None
    if entry == prefix:
        return "exact"
    if entry in prefix:
        return "substring"
    if fnmatch(prefix, entry):
        return "wildcard"
    return None
