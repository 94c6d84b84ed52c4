"""Quantization schemes: pure torch references, one per algorithm, looked up by CLI name."""

from __future__ import annotations

from ..errors import UsageError
from .base import Scheme
from .fp8 import Fp8Block, Fp8PerChannel, Fp8PerTensor
from .int8 import Int8PerChannel
from .mxfp8 import MX_BLOCK, Mxfp8
from .nvfp4 import Nvfp4

# Calibration-free activation scales (ModelOpt's convention, activation amax = 448):
# FP8 input_scale = 448 / 448, NVFP4 input_scale = 448 / (6 * 448).
FP8_STATIC_INPUT_SCALE = 1.0
NVFP4_STATIC_INPUT_SCALE = 1.0 / 6.0

SCHEMES: dict[str, Scheme] = {
    s.algo: s
    for s in (
        Fp8PerTensor("FP8", "FP8", shares_global_amax=True, static_input_scale=FP8_STATIC_INPUT_SCALE),
        # vLLM's ModelOptFp8MoEMethod takes only per-tensor scales: no MoE for these two (spec §5).
        Fp8PerChannel("FP8_PER_CHANNEL_PER_TOKEN", "FP8_PER_CHANNEL_PER_TOKEN", moe_served=False),
        Fp8Block("FP8_PB_WO", "fp8_pb_wo", row_align=128, moe_served=False),
        Nvfp4("NVFP4", "NVFP4", shares_global_amax=True, static_input_scale=NVFP4_STATIC_INPUT_SCALE, group_size=16),
        Nvfp4("W4A16_NVFP4", "W4A16_NVFP4", shares_global_amax=True, group_size=16),
        Int8PerChannel("INT8", "W8A16"),
        Mxfp8("MXFP8", "MXFP8", group_size=MX_BLOCK),
    )
}


def get_scheme(algo: str) -> Scheme:
    """The scheme for a case-insensitive algorithm name (``fp8_pb_wo`` -> FP8_PB_WO)."""
    key = algo.upper()
    if key == "W8A16":
        key = "INT8"
    if key not in SCHEMES:
        raise UsageError(f"unknown algorithm {algo!r}; choose one of {', '.join(SCHEMES)}")
    return SCHEMES[key]


__all__ = ["SCHEMES", "Scheme", "get_scheme"]
