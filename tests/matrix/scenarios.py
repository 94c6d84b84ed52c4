"""The matrix's special scenarios (issue 35): what a cell's one command line cannot show.

Each is a dict of options in the cells' names (cells.FACTORS) plus ``scenario``, so known.py's defect
predicates read scenarios and cells alike; test_scenarios.py runs them. ``rounding: gptq`` is the
variant with a side folder (GPTQ weights made in a calibration forward); ``nearest`` the plain one.
"""

from __future__ import annotations

# FP8: static input scales, so the data decides bytes without GPTQ too; FP8_PB_WO for the option change
# (--scale-search none -> mse: FP8 has no search); GPTQ on either takes ~2 s on the CPU
SCENARIOS = tuple(
    {"scenario": s, "rounding": r, "algo": "FP8_PB_WO" if s == "changed-option" else "FP8", "calibration": "calib-data"}
    for s in ("changed-data", "changed-option", "changed-version", "two-runs")
    for r in ("nearest", "gptq")
) + tuple(  # a --resume of a finished output: "already complete", without a forward, nothing left beside DST
    {"scenario": "finished", "lifecycle": "finished", "rounding": r, "smooth": sm, "algo": "INT8" if sm != "none" else "FP8",
     "calibration": "calib-data"}
    for r, sm in (("nearest", "none"), ("gptq", "none"), ("nearest", "smoothquant"))
)


def scenario_id(o: dict) -> str:
    return "-".join([o["scenario"], o["rounding"]] + ([f"smooth={o['smooth']}"] if o.get("smooth", "none") != "none" else []))
