"""Static activation scales for the compressed-tensors FP8 and NVFP4 schemes.

Without calibration the value is ModelOpt's calibration-free convention (activation amax 448,
design §4.5), written in compressed-tensors' terms: FP8 ``input_scale = amax / 448 = 1.0`` and
NVFP4 ``input_global_scale = 2688 / amax = 6.0`` (the inverse of ModelOpt's ``input_scale``
1/6). Both derive from ``algorithms.static_input_scale`` (the one home of the convention); calibrated
values replace them per module (``CtScheme.calibrated_inputs``).
"""

from __future__ import annotations

from ..algorithms import static_input_scale


def static_input_value(algo: str) -> float:
    """The calibration-free static activation parameter compressed-tensors writes under `algo`:
    FP8 ``input_scale`` 1.0 (ModelOpt's ``input_scale``), NVFP4 ``input_global_scale`` 6.0 (its inverse)."""
    scale = static_input_scale(algo)
    return 1.0 / scale if algo == "NVFP4" else scale
