"""Quantization schemes: pure torch references, one per algorithm, looked up by CLI name."""

from __future__ import annotations

from ..algorithms import ALGOS, FP8_BLOCK, MX_BLOCK, NVFP4_GROUP, QUANT_ALGO, algo_of_quant_algo, canonical_algo
from ..errors import UsageError
from .base import Scheme
from .fp8 import Fp8Block, Fp8PerChannel, Fp8PerTensor
from .int4 import INT4_GROUP, Int4Group
from .int8 import Int8PerChannel
from .mxfp8 import Mxfp8
from .nvfp4 import Nvfp4

# Calibration-free activation scales (ModelOpt's convention, activation amax = 448):
# FP8 input_scale = 448 / 448, NVFP4 input_scale = 448 / (6 * 448).
FP8_STATIC_INPUT_SCALE = 1.0
NVFP4_STATIC_INPUT_SCALE = 1.0 / 6.0

SCHEMES: dict[str, Scheme] = {
    s.algo: s
    for s in (
        Fp8PerTensor("FP8", QUANT_ALGO["FP8"], shares_global_amax=True, static_input_scale=FP8_STATIC_INPUT_SCALE),
        # vLLM's ModelOptFp8MoEMethod takes only per-tensor scales: no MoE for these two (spec §5).
        Fp8PerChannel("FP8_PER_CHANNEL_PER_TOKEN", QUANT_ALGO["FP8_PER_CHANNEL_PER_TOKEN"], moe_served=False),
        Fp8Block("FP8_PB_WO", QUANT_ALGO["FP8_PB_WO"], row_align=FP8_BLOCK, moe_served=False),
        Nvfp4("NVFP4", QUANT_ALGO["NVFP4"], shares_global_amax=True, static_input_scale=NVFP4_STATIC_INPUT_SCALE,
              group_size=NVFP4_GROUP),
        Nvfp4("W4A16_NVFP4", QUANT_ALGO["W4A16_NVFP4"], shares_global_amax=True, group_size=NVFP4_GROUP),
        Int8PerChannel("INT8", QUANT_ALGO["INT8"]),
        Mxfp8("MXFP8", QUANT_ALGO["MXFP8"], group_size=MX_BLOCK),
        Int4Group("INT4", QUANT_ALGO["INT4"], group_size=INT4_GROUP, row_align=2),
        Int4Group("INT4_ASYM", QUANT_ALGO["INT4_ASYM"], group_size=INT4_GROUP, row_align=2, modelopt_refusal=(
            "ModelOpt's W4A16_AWQ (TensorRT-LLM) carries no zero points; use --format compressed-tensors "
            "(W4A16_ASYM, served by vLLM) or --algo INT4")),
    )
}
assert tuple(SCHEMES) == ALGOS  # one list of algorithms (algorithms.py)


def get_scheme(algo: str) -> Scheme:
    """The scheme for a case-insensitive algorithm name (``fp8_pb_wo`` -> FP8_PB_WO)."""
    key = canonical_algo(algo)
    if key is None:
        raise UsageError(f"unknown algorithm {algo!r}; choose one of {', '.join(SCHEMES)}")
    return SCHEMES[key]


def scheme_for_quant_algo(quant_algo: str) -> Scheme | None:
    """The scheme whose checkpoints carry `quant_algo` (``fp8_pb_wo``, ``W8A16``; case-insensitive), or None."""
    algo = algo_of_quant_algo(quant_algo)
    return SCHEMES[algo] if algo else None


__all__ = ["SCHEMES", "Scheme", "get_scheme", "scheme_for_quant_algo"]
