"""What the CUTLASS layout writes (names, dtypes, padded and swizzled shapes) and why FP8 / INT8
move no bytes there: torch-free, for the plan. The packing itself is :mod:`.cutlass`."""

from __future__ import annotations

from ..algorithms import NVFP4_GROUP
from ..schemes.fp8 import Fp8Block, Fp8PerChannel, Fp8PerTensor
from ..schemes.int4 import Int4Group
from ..schemes.int8 import Int8PerChannel
from ..schemes.mxfp8 import Mxfp8
from ..schemes.nvfp4 import Nvfp4
from .support import INT4_MARLIN_ONLY, INT4_ZERO_POINTS, MXFP8_BLACKWELL, NVFP4_WEIGHT_ONLY, PACKS, W4A16_ONLY, no_bytes_move

SUFFIX = "_cutlass"
WEIGHT_ALIGN = 32  # rows and K elements

_FP8_PLAIN = no_bytes_move(
    "no bytes move: vLLM 0.33.0's CUTLASS FP8 GEMM reads weight.t(), a view of the plain [N, K] "
    "bytes, and the plain fp32 scales (fused shards share one scale already); write --layout plain")
# scheme kind (layouts/support.py) -> what CUTLASS does with a dense Linear of it
DENSE = {
    Nvfp4: PACKS, NVFP4_WEIGHT_ONLY: W4A16_ONLY, Mxfp8: MXFP8_BLACKWELL, Int4Group: INT4_MARLIN_ONLY,
    INT4_ZERO_POINTS: INT4_MARLIN_ONLY, Fp8PerTensor: _FP8_PLAIN, Fp8PerChannel: _FP8_PLAIN,
    Fp8Block: no_bytes_move(
        "no bytes move: the CUTLASS block-FP8 GEMM takes the plain [N, K] weight and [N/128, K/128] "
        "fp32 scales (DeepGEMM's UE8M0 requant and SM100 scale packing depend on GPU and env, so "
        "they are not pre-packed); write --layout plain"),
    Int8PerChannel: no_bytes_move(
        "no bytes move: vLLM 0.33.0's CUTLASS INT8 W8A8 GEMM reads weight.t(), a view of the plain "
        "[N, K] bytes, and [N, 1] fp32 scales; write --layout plain"),
}
# ... and with MoE expert stacks (FlashInfer-CUTLASS fused MoE)
MOE = {Fp8PerTensor: PACKS, Nvfp4: PACKS, Fp8Block: PACKS, NVFP4_WEIGHT_ONLY: W4A16_ONLY, Mxfp8: MXFP8_BLACKWELL,
       Int4Group: INT4_MARLIN_ONLY, INT4_ZERO_POINTS: INT4_MARLIN_ONLY}
NO_MOE_KERNEL = "vLLM 0.33.0 has no cutlass MoE kernel for {algo}"


def _up(x: int, m: int) -> int:
    return -(-x // m) * m


def swizzled_shape(rows: int, cols: int) -> tuple[int, int]:
    """``[ceil128(rows), ceil4(cols)]``: the shape of a 128x4-swizzled ``[rows, cols]`` scale."""
    return _up(rows, 128), _up(cols, 4)


def padded_weight_shape(n: int, k: int) -> tuple[int, int]:
    """Bytes shape of the padded NVFP4 weight: ``[ceil32(N), ceil32(K)/2]``."""
    return _up(n, WEIGHT_ALIGN), _up(k, WEIGHT_ALIGN) // 2


def specs(algo: str, shape: tuple[int, int]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Packed tensors of one NVFP4 Linear ``[N, K]``: suffix -> (safetensors dtype, shape)."""
    n, k = shape
    return {
        "weight" + SUFFIX: ("U8", padded_weight_shape(n, k)),
        "weight_scale" + SUFFIX: ("F8_E4M3", swizzled_shape(n, k // NVFP4_GROUP)),
    }
