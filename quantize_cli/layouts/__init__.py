"""Kernel layouts: the plain ModelOpt tensors re-arranged the way a serving kernel reads them.

Writer contract (design §7): a packed Linear writes its packed tensors under ``<name>_<layout>``
suffixes no stock loader expects (``weight_marlin``, ``weight_scale_cutlass``, ...), never the
plain ``weight``, so a stock loader fails loudly; the plain scales (``weight_scale``,
``weight_scale_2``, ``input_scale``) are kept unchanged beside them, so :func:`unpack` is exact
even where the kernel's own scale format is lossy. ``unpack(pack(x)) == x`` byte for byte.

Targets: vLLM 0.33.0 and flashinfer 0.7.2 (docs/layouts.md names the function each layout reproduces), tensor-parallel size 1.

This module is torch-free: what each layout writes (``*_shapes.py``) is all the plan needs; the
packing modules (``marlin.py``, ``cutlass.py``, ``flashinfer.py``, torch) are imported by
:func:`pack` and its siblings when tensors are packed. The activation dtype is given by name
(``"bfloat16"``, ``"float16"``) or as a torch dtype.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from ..algorithms import ALGOS
from ..problems import Problem
from ..schemes import SCHEMES, get_scheme
from . import cutlass_shapes, flashinfer_shapes, marlin_shapes
from .marlin_shapes import act_name
from .support import verdict

if TYPE_CHECKING:
    import torch

VLLM = "vllm 0.33.0"
FLASHINFER = "flashinfer 0.7.2"


class Layout(str, Enum):
    """Where the quantized bytes of a Linear go. ``Layout("marlin")`` parses the CLI value."""

    def __new__(cls, value: str, doc: str):
        obj = str.__new__(cls, value)
        obj._value_ = value
        obj.__doc__ = doc
        return obj

    PLAIN = ("plain", """ModelOpt unified HF checkpoint, nothing moved: weight [N, K] (FP8 e4m3 /
        INT8 int8) or uint8 [N, K/2] (NVFP4, low nibble = even k); scales linear.""")
    MARLIN = ("marlin", """vLLM Marlin W8A16/W4A16: weight_marlin int32 [Kp/16, Np*bits/2] in
        16x64 tiles (per thread its mma B fragment; nibble order (b,r) 00 02 10 12 01 03 11 13,
        byte order k+0 k+8 k+1 k+9); weight_scale_marlin [G, Np] permuted (8x8 transpose per
        64-chunk, or the 32-chunk single permutation), FP8 x2^120 (bf16) / x2^8 (fp16) in the
        activation dtype, NVFP4 S0E5M3 bytes [Kp/16, Np] (runs of 4 swapped [0,2,1,3]);
        weight_global_scale_marlin = ws2 x 2^119 (bf16) / 2^7 (fp16) / scale_factor; padded to
        (N%64, K%128) or (N%128, K%64); weight_shape_marlin = [N, K].""")
    CUTLASS = ("cutlass", """vLLM CUTLASS / FlashInfer-CUTLASS NVFP4: weight_cutlass uint8
        [ceil32(N), ceil32(K)/2] zero-padded; weight_scale_cutlass e4m3 [ceil128(N), ceil4(K/16)]
        128x4-swizzled (offset (m//128)*128*Kp + (c//4)*512 + (m%32)*16 + ((m%128)//32)*4 + c%4).
        MoE: FlashInfer-CUTLASS stacks (w3 before w1, per-expert swizzled scales).""")
    FLASHINFER = ("flashinfer", """FlashInfer TRT-LLM-gen kernels: dense NVFP4 weight rows
        32-shuffled (out[r] = in[(r//32)*32 + (r%8)*4 + (r%32)//8]), scales shuffled then
        128x4-swizzled, [N, K/16]; MoE stacks with gated interleave + shuffle (FP8, NVFP4) or
        16-row shuffle + BlockMajorK (block FP8).""")


# each packed layout's declaration of the scheme kinds it packs (DENSE, MOE, NO_MOE_KERNEL)
_RULES = {Layout.MARLIN: marlin_shapes, Layout.CUTLASS: cutlass_shapes, Layout.FLASHINFER: flashinfer_shapes}


def _algo(algo: str) -> str:
    return get_scheme(algo).algo  # case-insensitive; W8A16 -> INT8; unknown -> UsageError


def _layout(layout: Layout | str) -> Layout:
    return layout if isinstance(layout, Layout) else Layout(str(layout).lower())


def suffix(layout: Layout | str) -> str:
    """The name suffix of every packed tensor of `layout` (``_marlin``, ...)."""
    return "_" + _layout(layout).value


def supported(layout: Layout | str, algo: str, moe: bool = False) -> str | None:
    """None if (`layout`, `algo`) can be pre-packed (dense Linear, or MoE expert stacks with
    ``moe=True``), else the reason (:func:`support` gives it with its rule id)."""
    problem = support(layout, algo, moe)
    return problem.message if problem else None


def support(layout: Layout | str, algo: str, moe: bool = False) -> Problem | None:
    """None if (`layout`, `algo`) can be pre-packed, else why: rule ``layout-no-bytes-move`` where
    the kernel reads the plain bytes (nothing to pre-pack), ``layout-unsupported`` otherwise."""
    layout, algo = _layout(layout), _algo(algo)
    subject = f"{layout.value}/{algo}"
    if layout is Layout.PLAIN:
        return None
    found = verdict(_RULES[layout], SCHEMES[algo], moe)  # the layout's own declaration (*_shapes.py)
    return None if found is None else Problem(found[0], subject, found[1])


def _require(layout: Layout, algo: str, moe: bool = False) -> None:
    reason = supported(layout, algo, moe)
    if reason:
        raise ValueError(f"--layout {layout.value} --algo {algo}: {reason}")


def shape_problem(layout: Layout | str, algo: str, shape: tuple[int, int]) -> str | None:
    """Why a Linear weight of `shape` ``[N, K]`` cannot be packed (beyond the scheme's own rules)."""
    layout, algo = _layout(layout), _algo(algo)
    problem = SCHEMES[algo].shape_problem(tuple(shape)) or supported(layout, algo)
    if problem is None and layout is Layout.FLASHINFER:
        problem = flashinfer_shapes.dense_shape_problem(tuple(shape))
    return problem


def _kept(algo: str, shape: tuple[int, int]) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {k: v for k, v in SCHEMES[algo].outputs(tuple(shape)).items() if k != "weight"}


def packed_specs(layout: Layout | str, algo: str, shape: tuple[int, int], act_dtype: str | torch.dtype = "bfloat16"):
    """Every tensor written for one Linear of weight shape ``[N, K]``: name suffix ->
    (safetensors dtype, shape); packed tensors first, then the plain scales kept beside."""
    layout, algo = _layout(layout), _algo(algo)
    shape = tuple(shape)
    if layout is Layout.PLAIN:
        return dict(SCHEMES[algo].outputs(shape))
    problem = shape_problem(layout, algo, shape)
    if problem:
        raise ValueError(f"--layout {layout.value} --algo {algo}, shape {list(shape)}: {problem}")
    if layout is Layout.MARLIN:
        out = marlin_shapes.specs(algo, shape, act_name(act_dtype))
    elif layout is Layout.CUTLASS:
        out = cutlass_shapes.specs(algo, shape)
    else:
        out = flashinfer_shapes.specs(algo, shape, suffix(layout))
    return {**out, **_kept(algo, shape)}


def _split(layout: Layout, d: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    sfx = suffix(layout)
    return {k: v for k, v in d.items() if k.endswith(sfx)}, {k: v for k, v in d.items() if not k.endswith(sfx)}


def _torch_dtype(act: str | torch.dtype) -> torch.dtype:
    """The torch dtype of an activation dtype given by name or as a torch dtype (packing needs torch)."""
    import torch

    return getattr(torch, act_name(act))


def pack(layout: Layout | str, algo: str, plain: dict[str, torch.Tensor], act_dtype: str | torch.dtype = "bfloat16",
         *, scale_factor: float | None = None) -> dict[str, torch.Tensor]:
    """Plain scheme tensors (``SCHEMES[algo].quantize(w)``) -> the tensors to write: packed ones
    plus the plain scales unchanged. `scale_factor`: Marlin NVFP4 only, see
    :func:`marlin.nvfp4_scale_factor` (one factor per fused group)."""
    layout, algo = _layout(layout), _algo(algo)
    kept = {k: v for k, v in plain.items() if k != "weight" and v is not None}
    if layout is Layout.PLAIN:
        return dict(plain)
    _require(layout, algo)
    from . import cutlass, flashinfer, marlin

    if layout is Layout.MARLIN:
        out = marlin.pack(algo, plain, _torch_dtype(act_dtype), scale_factor)
    elif layout is Layout.CUTLASS:
        out = cutlass.pack(algo, plain)
    else:
        out = flashinfer.pack(algo, plain, suffix(layout))
    return {**out, **kept}


def unpack(layout: Layout | str, algo: str, packed: dict[str, torch.Tensor],
           act_dtype: str | torch.dtype = "bfloat16") -> dict[str, torch.Tensor]:
    """Inverse of :func:`pack`: the plain scheme tensors, byte for byte."""
    layout, algo = _layout(layout), _algo(algo)
    if layout is Layout.PLAIN:
        return dict(packed)
    _require(layout, algo)
    _, kept = _split(layout, packed)
    from . import cutlass, flashinfer, marlin

    if layout is Layout.MARLIN:
        w = marlin.unpack(algo, packed, _torch_dtype(act_dtype))
    elif layout is Layout.CUTLASS:
        w = cutlass.unpack(algo, packed)
    else:
        w = flashinfer.unpack(algo, packed, suffix(layout))
    return {**w, **kept}


def dequantize(layout: Layout | str, algo: str, packed: dict[str, torch.Tensor],
               act_dtype: str | torch.dtype = "bfloat16") -> torch.Tensor:
    """fp32 weight as the target kernel computes it from the packed operands (padded extent for
    Marlin / CUTLASS). Marlin reads only its own tensors; CUTLASS / FlashInfer also the plain
    ``weight_scale_2`` (the kernels get it as a scalar ``alpha``). For verification and tests."""
    layout, algo = _layout(layout), _algo(algo)
    _require(layout, algo)
    from . import cutlass, flashinfer, marlin

    if layout is Layout.MARLIN:
        return marlin.dequantize(algo, packed, _torch_dtype(act_dtype))
    if layout is Layout.CUTLASS:
        return cutlass.dequantize(algo, packed)
    if layout is Layout.FLASHINFER:
        return flashinfer.dequantize(algo, packed, suffix(layout))
    return SCHEMES[algo].dequantize(packed)


# --------------------------------------------------------------------------------------------
# MoE expert stacks


def _moe_backend(layout: Layout) -> str:
    return "trtllm" if layout is Layout.FLASHINFER else "cutlass"


def moe_shape_problem(layout: Layout | str, algo: str, experts: int, intermediate: int, hidden: int) -> str | None:
    """Why MoE stacks of (E, I, H) cannot be packed for (`layout`, `algo`), or None."""
    layout, algo = _layout(layout), _algo(algo)
    if layout is Layout.PLAIN:
        return None
    if layout is Layout.MARLIN:
        return supported(layout, algo, moe=True) or marlin_shapes.moe_shape_problem(algo, experts, intermediate, hidden)
    return supported(layout, algo, moe=True) or flashinfer_shapes.moe_shape_problem(
        _moe_backend(layout), algo, experts, intermediate, hidden)


def moe_packed_specs(layout: Layout | str, algo: str, experts: int, intermediate: int, hidden: int):
    """Packed tensors of one MoE layer: ``{"w13": {name: (dtype, shape)}, "w2": {...}}``.

    Only the packed stacks: the plain per-expert scales stay under their checkpoint names."""
    layout, algo = _layout(layout), _algo(algo)
    problem = moe_shape_problem(layout, algo, experts, intermediate, hidden)
    if problem:
        raise ValueError(f"--layout {layout.value} --algo {algo} MoE: {problem}")
    if layout is Layout.MARLIN:
        return marlin_shapes.moe_specs(algo, experts, intermediate, hidden)
    return flashinfer_shapes.moe_specs(_moe_backend(layout), algo, experts, intermediate, hidden, suffix(layout))


def pack_moe(layout: Layout | str, algo: str, w13: dict[str, torch.Tensor], w2: dict[str, torch.Tensor]) -> dict:
    """Stacked plain experts -> ``{"w13": {...}, "w2": {...}}`` (packed + plain scales passed through).

    `w13`: ``weight [E, 2I, H]`` (NVFP4 ``[E, 2I, H/2]``) in vLLM's [w1 = gate ; w3 = up] order,
    ``weight_scale`` FP8 ``[E, 2]`` / block ``[E, 2I/128, H/128]`` / NVFP4 ``[E, 2I, H/16]``,
    NVFP4 ``weight_scale_2 [E, 2]``; `w2`: ``weight [E, H, I]`` (``[E, H, I/2]``), ``weight_scale``
    ``[E]`` / ``[E, H/128, I/128]`` / ``[E, H, I/16]``, ``weight_scale_2 [E]``. Other entries
    (``input_scale``) pass through unchanged.
    """
    layout, algo = _layout(layout), _algo(algo)
    e, h = w2["weight"].shape[:2]
    i = w13["weight"].shape[1] // 2
    problem = moe_shape_problem(layout, algo, e, i, h)
    if problem:
        raise ValueError(f"--layout {layout.value} --algo {algo} MoE: {problem}")
    from . import flashinfer, marlin

    if layout is Layout.MARLIN:
        out = marlin.pack_moe(algo, w13, w2)
    else:
        out = flashinfer.pack_moe(_moe_backend(layout), algo, w13, w2, suffix(layout))
    for side, plain in (("w13", w13), ("w2", w2)):
        out[side].update({k: v for k, v in plain.items() if k != "weight" and v is not None})
    return out


def unpack_moe(layout: Layout | str, algo: str, packed: dict) -> dict:
    """Inverse of :func:`pack_moe`: ``{"w13": plain stack, "w2": plain stack}``, byte for byte."""
    layout, algo = _layout(layout), _algo(algo)
    _require(layout, algo, moe=True)
    from . import flashinfer, marlin

    if layout is Layout.MARLIN:
        out = marlin.unpack_moe(algo, packed)
    else:
        out = flashinfer.unpack_moe(_moe_backend(layout), algo, packed, suffix(layout))
    for side in ("w13", "w2"):
        out[side].update(_split(layout, packed[side])[1])
    return out


# --------------------------------------------------------------------------------------------
# config.json record


def layout_metadata(layout: Layout | str, act_dtype: str | torch.dtype = "bfloat16") -> dict:
    """What config.json records about a packed layout (``quantization_config.layout``)."""
    layout = _layout(layout)
    meta: dict = {"name": layout.value, "format_version": 1}
    if layout is Layout.PLAIN:
        return meta
    act = act_name(act_dtype)
    meta.update({"suffix": suffix(layout), "tensor_parallel_size": 1, "kept_plain_tensors":
                 ["weight_scale", "weight_scale_2", "input_scale"]})
    if layout is Layout.MARLIN:
        meta.update({
            "target": VLLM, "activation_dtype": act, "is_a_8bit": False,
            "kernels": {"FP8*": "MarlinFP8ScaledMMLinearKernel (W8A16)", "NVFP4": "MarlinNvFp4LinearKernel (W4A16)",
                        "INT8": "MarlinLinearKernel uint8b128 (W8A16)", "MXFP8": "MarlinMxfp8LinearKernel (W8A16)",
                        "INT4": "MarlinLinearKernel uint4b8 (W4A16, group 128)",
                        "MXFP8 MoE": "Marlin fused MoE (prepare_mxfp8_moe_layer_for_marlin)"},
            "tile": {"k": marlin_shapes.TILE_K, "n": marlin_shapes.TILE_N},
            "padding": "marlin_padded_nk: zero-pad to the cheaper of (N%64, K%128) / (N%128, K%64), "
                       "K a multiple of the group; logical [N, K] in weight_shape_marlin",
            "fp8_scale_log2_multiplier": {"bfloat16": 120, "float16": 8}.get(act),
            "nvfp4_global_scale_log2_multiplier": {"bfloat16": 119, "float16": 7}.get(act),
            "nvfp4_scale_format": "S0E5M3 bytes (typed F8_E4M3), data-dependent scale_factor folded into "
                                  "weight_global_scale_marlin",
            "mxfp8_scale_format": "e8m0 bytes (U8) [Kp/32, Np], grouped permutation, runs of 4 swapped [0,2,1,3]",
        })
    elif layout is Layout.CUTLASS:
        meta.update({
            "target": f"{VLLM}; {FLASHINFER}",
            "kernels": {"NVFP4": "CutlassNvFp4LinearKernel (= FlashInfer-CUTLASS/CuTe-DSL/cuDNN prep)",
                        "MoE": "FlashInfer-CUTLASS fused MoE (w3 before w1)"},
            "weight_padding": {"rows": cutlass_shapes.WEIGHT_ALIGN, "k_elements": cutlass_shapes.WEIGHT_ALIGN},
            "scale_swizzle": "128x4", "scale_padding": {"rows": 128, "cols": 4},
        })
    else:
        meta.update({
            "target": f"{VLLM}; {FLASHINFER}",
            "kernels": {"NVFP4": "FlashInferTrtllmNvFp4LinearKernel", "MoE": "FlashInfer TRT-LLM fused MoE"},
            "epilogue_tile_m": 128, "shuffle_block_rows": 32, "scale_swizzle": "128x4",
            "block_fp8_moe": {"epilogue_tile_m": 64, "shuffle_block_rows": 16, "weight_layout": "BlockMajorK"},
        })
    return meta


__all__ = [
    "ALGOS", "Layout", "supported", "support", "shape_problem", "packed_specs", "pack", "unpack", "dequantize",
    "moe_shape_problem", "moe_packed_specs", "pack_moe", "unpack_moe", "layout_metadata", "suffix",
]
