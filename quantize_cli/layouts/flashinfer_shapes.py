"""What the FlashInfer layouts write for a dense NVFP4 Linear and for MoE expert stacks (names,
dtypes, shapes) and the shape rules: torch-free, for the plan. The packing is :mod:`.flashinfer`."""

from __future__ import annotations

from ..algorithms import FP8_BLOCK, NVFP4_GROUP
from .cutlass_shapes import swizzled_shape


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
