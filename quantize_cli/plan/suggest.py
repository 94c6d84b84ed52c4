"""One ``--exclude`` that fixes many errors at once (issue 36, 7).

A shape or layout error names its module and suggests ``--exclude <that module>``; a BERT with a
width no INT4 group divides gets one such line per layer (31 of them). :func:`one_exclude` finds a
single pattern that keeps exactly the modules those errors name (with their fused groups) and
nothing else, checked with the planner's own matcher (``classify.user_rule_match``, vLLM's rules
and ``re:``), trying the most readable form first:

1. a wildcard over the layer index: ``encoder.layer.*.intermediate.dense``;
2. a suffix wildcard: ``*.intermediate.dense``;
3. a regular expression over the name shapes, layer index generalised:
   ``re:(encoder\\.layer\\.\\d+\\.attention\\.output\\.dense|pooler\\.dense)$``;
4. the names themselves: ``re:(a|b|c)$`` (always exact).
Torch-free.
"""

from __future__ import annotations

import re
import shlex

from ..modules.classify import LINEAR, Module, user_rule_match
from ..problems import ERROR, Finding

FIXED_BY_EXCLUDE = ("shape", "layout")  # error codes whose fix is to keep the module (validate.py)
_INDEX = re.compile(r"\.\d+\.")  # a layer index, generalised in the patterns


def one_exclude(mods: dict[str, Module], findings: list[Finding]) -> tuple[list[str], list[str], int] | None:
    """(the --exclude pattern(s), the modules they keep, how many errors they fix) for two or more
    errors of FIXED_BY_EXCLUDE, or None. One pattern when one short enough is exact; else one per
    name shape (a message cuts words over 120 characters)."""
    errors = [f for f in findings if f.level == ERROR and f.code in FIXED_BY_EXCLUDE and f.subject in mods]
    if len(errors) < 2:
        return None
    prefixes = sorted({mods[f.subject].vllm_prefix or f.subject for f in errors})  # a fused group / MoE layer goes whole
    linears = [m for m in mods.values() if m.kind == LINEAR]
    want = sorted(m.name for m in linears if (m.vllm_prefix or m.name) in prefixes)

    def exact(patterns: list[str]) -> bool:
        return sorted(m.name for m in linears if user_rule_match(m, patterns)) == want

    for pattern in _candidates(prefixes):
        if len(pattern) <= MAX_PATTERN and exact([pattern]):
            return [pattern], want, len(errors)
    for patterns in (sorted({_INDEX.sub(".*.", n) for n in prefixes}), prefixes):
        if exact(patterns):
            return patterns, want, len(errors)
    return None


MAX_PATTERN = 110


def _candidates(names: list[str]):
    """Single patterns, most readable first (module docstring)."""
    shapes = sorted({_INDEX.sub(".*.", n) for n in names})
    if len(shapes) == 1:
        yield shapes[0]
    tails = [n.split(".") for n in names]
    common: list[str] = []
    while all(len(t) > len(common) for t in tails) and len({t[-1 - len(common)] for t in tails}) == 1:
        common.insert(0, tails[0][-1 - len(common)])
    if common:
        yield "*." + ".".join(common)
    # regular expressions: the shared leading components, then the shortest distinguishing tails
    comps = [[r"\d+" if c.isdigit() else re.escape(c) for c in n.split(".")] for n in names]
    head = 0
    while all(len(c) > head + 1 for c in comps) and len({c[head] for c in comps}) == 1:
        head += 1
    lead = "".join(c + r"\." for c in comps[0][:head])
    longest = max(len(c) for c in comps) - head
    for k in range(1, longest + 1):
        alts = sorted({r"\.".join(c[head:head + k]) + ("$" if len(c) - head <= k else r"\.") for c in comps})
        yield "re:" + lead + (alts[0] if len(alts) == 1 else "(" + "|".join(alts) + ")")


def fix_line(mods: dict[str, Module], findings: list[Finding]) -> str | None:
    """The line said after the errors, or None."""
    found = one_exclude(mods, findings)
    if found is None:
        return None
    patterns, kept, n = found
    flags = " ".join(f"--exclude {shlex.quote(p)}" for p in patterns)
    return (f"fix: {'one ' if len(patterns) == 1 else ''}{flags} keeps exactly the {len(kept)} module(s) these {n} errors "
            "name (in the source dtype), or choose another --algo")


__all__ = ["one_exclude", "fix_line", "FIXED_BY_EXCLUDE"]
