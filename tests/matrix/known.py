"""Which matrix cells and scenarios fail today, and why: one predicate per defect, over the options.

A cell's options are ``Cell.o`` (cells.FACTORS); a scenario's are ``scenarios.SCENARIOS`` (the same
names where they mean the same, plus ``scenario``). Each failing one is a strict xfail
(``raises=AssertionError``: a crash in the test itself still fails) naming every defect that touches
it, so it turns into an XPASS error the moment the last fix lands; then the entry goes.
``test_matrix.py`` fails on an entry that matches nothing (a stale entry hides nothing and lies).

Labels: ``35.N`` is issue 35's item N (being fixed on main while this was written). Issue 23's 1-9 and
the matrix's own M1-M3 (tests/test_interactions.py reproduces each) are fixed: a cell that fails on
them now is a regression.
"""

from __future__ import annotations

import pytest


def _side_folder(o: dict) -> bool:
    """GPTQ or smoothing: the run makes a side folder of weights in a calibration forward."""
    return o.get("rounding", "nearest") == "gptq" or o.get("smooth", "none") != "none"


_DEFECTS: dict = {
    "35.2": ("a --resume of a finished GPTQ / --smooth output exits 1 or re-runs the forward and leaves .DST.weights behind",
             lambda o: _side_folder(o) and o.get("lifecycle") == "finished"),
    "35.3": ("a GPTQ --resume after the calibration data changed reuses the old weights (wrong bytes, exit 0)",
             lambda o: _side_folder(o) and o.get("scenario") == "changed-data"),
    "35.5": ("a second GPTQ run to the same -o rewrites .DST.weights under the first before the lock refuses it "
             "(and the first then fails)", lambda o: _side_folder(o) and o.get("scenario") == "two-runs"),
    "35.12": ("--resume with another --scale-search (or converter version) after an interrupted GPTQ run is refused only "
              "after a full GPTQ pass", lambda o: _side_folder(o) and o.get("scenario") in ("changed-option", "changed-version")),
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
