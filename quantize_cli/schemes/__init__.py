"""Quantization schemes: pure torch references, one per algorithm, looked up by CLI name.

The algorithm facts (names, ModelOpt's quant_algo, static or dynamic activations, shared amax,
group size) come from the one table, ``algorithms.ALGORITHMS``; this registry adds which numerics
class computes each. These are the ModelOpt format's schemes (its tensor layout is the reference
layout); compressed-tensors has its own (formats/compressed_tensors.py).
"""

from __future__ import annotations

from ..algorithms import ALGORITHMS, ALGOS, FP8_BLOCK, algo_of_quant_algo, canonical_algo, static_input_scale
from ..errors import UsageError
from .base import Scheme
from .fp8 import Fp8Block, Fp8PerChannel, Fp8PerTensor
from .int4 import Int4Group
from .int8 import Int8PerChannel
from .mxfp8 import Mxfp8
from .nvfp4 import Nvfp4

# algo -> (numerics class, its own keywords)
_CLASSES = {
    "FP8": (Fp8PerTensor, {}),
    "FP8_PER_CHANNEL_PER_TOKEN": (Fp8PerChannel, {}),
    "FP8_PB_WO": (Fp8Block, {"row_align": FP8_BLOCK}),
    "NVFP4": (Nvfp4, {}),
    "W4A16_NVFP4": (Nvfp4, {}),
    "INT8": (Int8PerChannel, {}),
    "MXFP8": (Mxfp8, {}),
    "INT4": (Int4Group, {"row_align": 2}),  # two output rows per byte
    "INT4_ASYM": (Int4Group, {"row_align": 2}),  # its numerics' reference; ModelOpt never writes it (formats/modelopt.py)
}


def _scheme(algo: str) -> Scheme:
    a = ALGORITHMS[algo]
    cls, extra = _CLASSES[algo]
    return cls(algo, a.quant_algo, shares_global_amax=a.shares_global_amax, group_size=a.group_size,
               static_input_scale=static_input_scale(algo) if a.static else None, **extra)


SCHEMES: dict[str, Scheme] = {algo: _scheme(algo) for algo in ALGOS}


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
