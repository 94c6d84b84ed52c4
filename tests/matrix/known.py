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

from .cells import calibrated


_DEFECTS = {
    "1": ("Ray asks --algo's scheme, not the task's, whether a fused group shares its amax (NVFP4 weight_scale_2 "
          "unshared across shards)", lambda o: o["executor"] == "ray" and o["algo_for"] == "mixed" and o["algo"] == "FP8_PB_WO"),
    "3": ("calibration dropped for mixed precision and for KV scales with a dynamic --algo",
          lambda o: o["calibration"] == "act-scales" and o["algo"] != "NVFP4" and (o["algo_for"] == "mixed" or (o["kv"] == "fp8" and o["algo"] == "FP8_PB_WO"))),
    "4": ("--resume of a finished DST skips --verify and --push-to-hub",
          lambda o: o["lifecycle"] == "finished" and "on" in (o["verify"], o["push"])),
    "5": ("a push rewrites the card's serve lines from hf_quant_config.json alone (compressed-tensors, MIXED_PRECISION)",
          lambda o: o["push"] == "on" and o["lifecycle"] != "finished" and (o["format"] == "compressed-tensors" or o["algo_for"] == "mixed")),
    "7": ("a finished Ray output is never sealed (.quantize-checksums)", lambda o: o["executor"] == "ray"),
    "9": ("the card says a calibrated output is not calibrated (and 'KV cache: no scales' beside calibrated KV scales)",
          calibrated),
    "M1": ("mixed precision without calibration: card and report state --algo's activation-scale facts for every layer",
           lambda o: o["algo_for"] == "mixed" and o["calibration"] == "none" and o["algo"] in ("FP8", "FP8_PB_WO")),
    "M2": ("--verify --layout marlin converts everything, then exits 1 (verify reads no packed layout)",
           lambda o: o["layout"] == "marlin" and o["verify"] == "on" and o["lifecycle"] != "finished"),
    "M3": ("compressed-tensors NVFP4 uncalibrated: card and report say every input_scale is 6 (the global scale; it is 1/6)",
           lambda o: o["format"] == "compressed-tensors" and o["calibration"] == "none" and o["algo"] == "NVFP4"),
}


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
