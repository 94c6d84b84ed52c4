"""Which matrix cells and scenarios fail today, and why: one predicate per defect, over the options.

A cell's options are ``Cell.o`` (cells.FACTORS); a scenario's are ``scenarios.SCENARIOS`` (the same
names where they mean the same, plus ``scenario``). Each failing one is a strict xfail
(``raises=AssertionError``: a crash in the test itself still fails) naming every defect that touches
it, so it turns into an XPASS error the moment the last fix lands; then the entry goes.
``test_matrix.py`` fails on an entry that matches nothing (a stale entry hides nothing and lies).

Labels: ``35.N`` is issue 35's item N, ``35.MN`` a defect the matrix found (M1-M3 by the first
array, M4 onwards by the second: test_algorithms.py). Issue 23's 1-9, issue 35's 2, 3, 5, 12 and
the matrix's own M1-M3 (tests/test_interactions.py reproduces each) and M4 (verify --source of a compressed-tensors
output made with GPTQ / smoothing: the card records the method, test_algorithms.py's cells) are fixed: a cell that fails on
them now is a regression.
"""

from __future__ import annotations

import pytest


# Issue 23's 1-9, the matrix's M1-M4 and issue 35's 2, 3, 5, 12 (calibration/stage.py) are fixed. A defect
# found later gets an entry here, ``"label": ("what fails", lambda o: <the options it touches>)``; `o` is a
# cell's options (either array's factor names: read them with .get) or a scenario's.
_DEFECTS: dict = {
}


def defects_of(o: dict) -> list[str]:
    """The defects (labels) that make options `o` fail today."""
    return [name for name, (_, applies) in _DEFECTS.items() if applies(o)]


def unmatched(options: list[dict]) -> list[str]:
    """The defect labels that none of `options` (every cell's and scenario's) triggers: stale entries."""
    return [name for name in _DEFECTS if not any(name in defects_of(o) for o in options)]


def marks_for_options(o: dict) -> list:
    found = defects_of(o)
    if not found:
        return []
    reason = "; ".join(f"issue {n.replace('.', ' item ')}: {_DEFECTS[n][0]}" for n in found)
    return [pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)]


def marks_for(cell) -> list:
    return marks_for_options(cell.o)
