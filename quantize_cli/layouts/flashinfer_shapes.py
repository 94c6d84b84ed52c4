"""What the FlashInfer layouts write for a dense NVFP4 Linear and for MoE expert stacks (names,
dtypes, shapes) and the shape rules: torch-free, for the plan. The packing is :mod:`.flashinfer`."""

from __future__ import annotations

from ..algorithms import FP8_BLOCK, NVFP4_GROUP
from ..problems import LAYOUT_UNSUPPORTED
from ..schemes.fp8 import Fp8Block, Fp8PerChannel, Fp8PerTensor
from ..schemes.int4 import Int4Group
from ..schemes.int8 import Int8PerChannel
from ..schemes.mxfp8 import Mxfp8
from ..schemes.nvfp4 import Nvfp4
from . import cutlass_shapes
from .cutlass_shapes import swizzled_shape
from .support import INT4_MARLIN_ONLY, INT4_ZERO_POINTS, MXFP8_BLACKWELL, NVFP4_WEIGHT_ONLY, PACKS, W4A16_ONLY, no_bytes_move

# scheme kind (layouts/support.py) -> what the FlashInfer TRT-LLM-gen kernels do with a dense Linear of it
DENSE = {
    Nvfp4: PACKS, NVFP4_WEIGHT_ONLY: W4A16_ONLY, Mxfp8: MXFP8_BLACKWELL, Int4Group: INT4_MARLIN_ONLY,
    INT4_ZERO_POINTS: INT4_MARLIN_ONLY,
    Fp8PerTensor: no_bytes_move(
        "no bytes move: FlashInfer's dense FP8 GEMM (bmm_fp8) reads the same weight.t() view "
        "and fp32 scalars as CUTLASS; write --layout plain"),
    Fp8Block: no_bytes_move(
        "no bytes move: FlashInfer's SM90 block-FP8 GEMM takes the plain [N, K] weight and "
        "[N/128, K/128] scales (after DeepGEMM's arch-dependent requant); write --layout plain"),
    Int8PerChannel: (LAYOUT_UNSUPPORTED, "FlashInfer has no INT8 GEMM in vLLM 0.33.0"),
    Fp8PerChannel: (LAYOUT_UNSUPPORTED,
                    "FlashInfer's dense FP8 GEMM takes per-tensor weight and activation scales only; per-channel FP8 "
                    "runs on CUTLASS, where no bytes move; write --layout plain"),
}
MOE = cutlass_shapes.MOE  # the same kinds: FlashInfer's TRT-LLM fused MoE
NO_MOE_KERNEL = "vLLM 0.33.0 has no flashinfer MoE kernel for {algo}"


def dense_shape_problem(shape: tuple[int, int]) -> str | None:
    n, k = shape
    if n % 128 or (k // NVFP4_GROUP) % 4:
        return (
            f"FlashInfer TRT-LLM NVFP4 GEMM needs N % 128 == 0 and K % 64 == 0 (its scale shuffle "
            f"has no padding), got [N, K] = [{n}, {k}]; use --layout cutlass"
        )
    return None


def specs(algo: str, shape: tuple[int, int], sfx: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    n, k = shape
    return {"weight" + sfx: ("U8", (n, k // 2)), "weight_scale" + sfx: ("F8_E4M3", (n, k // NVFP4_GROUP))}


def moe_shape_problem(backend: str, algo: str, e: int, i: int, h: int) -> str | None:
    """Why expert stacks of (E, I, H) cannot be packed for `backend` (vLLM would pad them), or None."""
    need_i, need_h = {
        ("trtllm", "FP8"): (16, 32),
        ("cutlass", "FP8"): (16, 1),
        ("trtllm", "NVFP4"): (64, 256),
        ("cutlass", "NVFP4"): (64, 16),
        ("trtllm", "FP8_PB_WO"): (128, 128),
        ("cutlass", "FP8_PB_WO"): (128, 128),
    }[(backend, algo)]
    if i % need_i or h % need_h:
        return (
            f"{backend} {algo} MoE needs intermediate % {need_i} == 0 and hidden % {need_h} == 0 "
            f"(vLLM 0.33.0 pads or refuses otherwise; padding is not pre-packed), got I={i}, H={h}"
        )
    return None


def moe_specs(backend: str, algo: str, e: int, i: int, h: int, sfx: str) -> dict[str, dict]:
    """Packed MoE tensors: ``{"w13": {name: (dtype, shape)}, "w2": {...}}``."""
    if algo == "NVFP4":
        s13, s2 = (e, 2 * i, h // NVFP4_GROUP), (e, h, i // NVFP4_GROUP)
        return {
            "w13": {"weight" + sfx: ("U8", (e, 2 * i, h // 2)),
                    "weight_scale" + sfx: ("F8_E4M3", (e, *swizzled_shape(*s13[1:])))},
            "w2": {"weight" + sfx: ("U8", (e, h, i // 2)),
                   "weight_scale" + sfx: ("F8_E4M3", (e, *swizzled_shape(*s2[1:])))},
        }
    if algo == "FP8":
        return {"w13": {"weight" + sfx: ("F8_E4M3", (e, 2 * i, h)), "weight_scale" + sfx: ("F32", (e,))},
                "w2": {"weight" + sfx: ("F8_E4M3", (e, h, i))}}
    w13 = (e, h // FP8_BLOCK, 2 * i, FP8_BLOCK) if backend == "trtllm" else (e, 2 * i, h)
    w2 = (e, i // FP8_BLOCK, h, FP8_BLOCK) if backend == "trtllm" else (e, h, i)
    return {
        "w13": {"weight" + sfx: ("F8_E4M3", w13),
                "weight_scale" + sfx: ("F32", (e, 2 * i // FP8_BLOCK, h // FP8_BLOCK))},
        "w2": {"weight" + sfx: ("F8_E4M3", w2), "weight_scale" + sfx: ("F32", (e, h // FP8_BLOCK, i // FP8_BLOCK))},
    }
