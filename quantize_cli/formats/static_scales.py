"""Static activation scales for the compressed-tensors FP8 and NVFP4 schemes.

Without calibration the value is ModelOpt's calibration-free convention (activation amax 448,
design §4.5), written in compressed-tensors' terms: FP8 ``input_scale = amax / 448 = 1.0`` and
NVFP4 ``input_global_scale = 2688 / amax = 6.0`` (the inverse of ModelOpt's ``input_scale``
1/6). Every static value is read through :func:`static_input_value`, the one place to wire
calibrated per-module amaxes in.
"""

from __future__ import annotations

from ..schemes import FP8_STATIC_INPUT_SCALE, NVFP4_STATIC_INPUT_SCALE


def static_input_value(algo: str, module: str | None = None) -> float:
    """The static activation scale written for `module` (None: any module) under `algo`.

    FP8 -> ``input_scale`` (1.0 uncalibrated); NVFP4 -> ``input_global_scale`` (6.0 uncalibrated).
    """
    if algo == "FP8":
        return FP8_STATIC_INPUT_SCALE
    if algo == "NVFP4":
        return 1.0 / NVFP4_STATIC_INPUT_SCALE
    raise ValueError(f"{algo} has no static activation scale")
