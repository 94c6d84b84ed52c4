"""Whether calibration decides any output byte: the one home of that rule.

Calibrated data changes the bytes a conversion writes in exactly three ways: a scheme with a static
activation scale takes the calibrated ``input_scale`` (instead of the documented constant), an FP8 KV
cache takes calibrated K/V scales (whatever the algorithms), and a weighted ``--scale-search`` takes
the per-channel statistics. ``convert --calib-data / --act-scales`` (entry.py), GPTQ / smoothing
(weights_entry.py: whether the plan keeps the scales document) and the plan's resolution
(apply.py) all ask this function, so the mixed-precision rules of ``--algo-for`` count everywhere
(issue 35 item 1: the GPTQ path once looked at the ``--algo`` scheme only).
"""

from __future__ import annotations

from typing import Iterable


def decides_bytes(schemes: Iterable, kv_cache_fp8: bool = False, scale_search: str | None = None) -> bool:
    """True when calibration changes an output byte of a conversion writing `schemes` (every
    scheme it writes: ``--algo``'s and each ``--algo-for`` rule's). The search is read from each
    scheme (a plan's) or given as `scale_search` (``--scale-search``, before a plan exists)."""
    if kv_cache_fp8 or (scale_search or "none").lower() != "none":
        return True
    return any(s.static_input_scale is not None or (getattr(s, "scale_search", None) or "none") != "none" for s in schemes)


__all__ = ["decides_bytes"]
