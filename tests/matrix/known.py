"""Which matrix cells fail today, and why: one predicate per defect, over the cell's option values.

Each failing cell is a strict xfail (``raises=AssertionError``: a crash in the test itself still
fails) naming every defect that touches it, so a cell turns into an XPASS error only once all of
them are fixed; then its mark goes (delete the defect's entry here). Numbers are issue 23's list;
``M1``-``M3`` are defects the matrix found (tests/test_interactions.py reproduces each alone):

- M1: mixed precision without calibration: the card and the report take the activation-scale facts
  from ``--algo`` alone ("None needed" or "every input_scale is 1" while NVFP4 layers hold 1/6).
- M2: ``--verify --layout marlin`` converts the whole model, then fails (exit 1) because verify cannot
  read a packed layout: neither refused before the first byte nor verified through ``unpack``.
- M3: compressed-tensors NVFP4 without calibration: card and report say "every input_scale is 6"
  (that is ``input_global_scale``; the input scale is 1/6).
"""

from __future__ import annotations

import pytest


# Every defect found so far (issue 23's 1-9, the matrix's M1-M3) is fixed: a cell that fails now is
# a regression. A defect found later gets an entry here while it is being fixed.
_DEFECTS: dict = {}


def defects_of(o: dict) -> list[str]:
    """The defects (numbers / M-labels) that make cell options `o` fail today."""
    return [name for name, (_, applies) in _DEFECTS.items() if applies(o)]


def marks_for(cell) -> list:
    found = defects_of(cell.o)
    if not found:
        return []
    reason = "; ".join(f"issue 23 defect {n}: {_DEFECTS[n][0]}" if n[0].isdigit() else f"matrix defect {n}: {_DEFECTS[n][0]}"
                       for n in found)
    return [pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)]
