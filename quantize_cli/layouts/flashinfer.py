"""FlashInfer layouts (flashinfer 0.7.2 as driven by vLLM 0.33.0): TRT-LLM-gen GEMM / MoE kernels
and, for MoE, FlashInfer's CUTLASS kernels.

Row shuffle (``shuffle_matrix_a``, epilogue_tile_m 128 -> B = 32 rows, 64 -> B = 16)::

    out[r] = in[(r//B)*B + (r%8)*(B/8) + (r%B)//8]      i.e. each B-row block viewed [8, B/8]
                                                         is stored transposed as [B/8, 8]

Dense NVFP4 (``FlashInferTrtllmNvFp4LinearKernel``): weight ``uint8 [N, K/2]`` rows 32-shuffled;
block scales ``e4m3 [N, K/16]`` rows 32-shuffled then 128x4-swizzled (see ``cutlass.py``) and
viewed back as ``[N, K/16]`` (no padding: needs N%128 and (K/16)%4).

MoE expert stacks (vLLM FusedMoE: ``w13 [E, 2I, H]`` = [w1 gate ; w3 up], ``w2 [E, H, I]``;
NVFP4 payloads have H/2, I/2 bytes, scales H/16, I/16 columns):

* w31 swap: ``[w3 ; w1]`` (row r <- row (r + I) % 2I); FlashInfer kernels want up first.
* gated interleave + 32-row shuffle (TRT-LLM): row r <- src(r) of the original [w1 ; w3] stack,
  ``s = (r//32)*32 + (r%8)*4 + (r%32)//8``, ``src = I + s//2`` if s even (up) else ``s//2`` (gate).
* per-expert 128x4 swizzle of block scales (NVFP4).

Backends (``trtllm`` = layout flashinfer, ``cutlass`` = layout cutlass, FlashInfer's CUTLASS MoE):

* FP8 per tensor: trtllm w13 gated+shuffle, w2 32-row shuffle; cutlass w31 swap. Both: w13 scale
  ``[E]`` = max(w1, w3) (vLLM's per-expert requant target; equal halves required, so no requant).
* FP8 128x128 block: w31 swap of weight and block scales, scales clamped >= 1e-10; trtllm also
  16-row shuffle + BlockMajorK ``[E, K/128, M, 128]`` of both weights.
* NVFP4: trtllm w13 gated+shuffle of weight and scale rows, w2 32-row shuffle; cutlass w31 swap.
  Both: scales 128x4-swizzled per expert.

Pure torch (reshape/permute/flip): CPU and CUDA give the same bytes. What is written (names,
dtypes, shapes) and the shape rules are :mod:`.flashinfer_shapes`, torch-free.
"""

from __future__ import annotations

import torch

from ..algorithms import FP8_BLOCK, NVFP4_GROUP
from ..schemes.numerics import e2m1_values, unpack_nibbles
from .cutlass import swizzle_128x4, unswizzle_128x4
# What is written (names, dtypes, shapes) and the shape rules: torch-free, for the plan.
from .flashinfer_shapes import dense_shape_problem, moe_shape_problem, moe_specs, specs  # noqa: F401

BLOCK_SCALE_MIN = 1e-10  # FlashInfer CUTLASS block-FP8 MoE: dead-block scales clamped (NaN otherwise)
DENSE_TILE = 32  # epilogue_tile_m 128


def shuffle_rows(x: torch.Tensor, block: int, dim: int = 0) -> torch.Tensor:
    """``shuffle_matrix_a`` row permutation along `dim` (size must be a multiple of `block`)."""
    dim = dim % x.dim()
    m = x.shape[dim]
    v = x.reshape(*x.shape[:dim], m // block, 8, block // 8, *x.shape[dim + 1 :])
    return v.transpose(dim + 1, dim + 2).reshape(x.shape).contiguous()


def unshuffle_rows(x: torch.Tensor, block: int, dim: int = 0) -> torch.Tensor:
    """Inverse of :func:`shuffle_rows`."""
    dim = dim % x.dim()
    m = x.shape[dim]
    v = x.reshape(*x.shape[:dim], m // block, block // 8, 8, *x.shape[dim + 1 :])
    return v.transpose(dim + 1, dim + 2).reshape(x.shape).contiguous()


def _u8(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8)


# --------------------------------------------------------------------------------------------
# dense NVFP4, TRT-LLM GEMM


def pack(algo: str, plain: dict[str, torch.Tensor], sfx: str) -> dict[str, torch.Tensor]:
    """Plain NVFP4 -> shuffled weight ``[N, K/2]`` and shuffled + swizzled scale ``[N, K/16]``."""
    w, ws = plain["weight"], plain["weight_scale"]
    problem = dense_shape_problem((w.shape[0], w.shape[1] * 2))
    if problem:
        raise ValueError(problem)
    s = swizzle_128x4(shuffle_rows(_u8(ws), DENSE_TILE)).view(ws.dtype)
    return {"weight" + sfx: shuffle_rows(w, DENSE_TILE), "weight_scale" + sfx: s}


def unpack(algo: str, packed: dict[str, torch.Tensor], sfx: str) -> dict[str, torch.Tensor]:
    return {"weight": unshuffle_rows(packed["weight" + sfx], DENSE_TILE)}


def dequantize(algo: str, packed: dict[str, torch.Tensor], sfx: str) -> torch.Tensor:
    """fp32 ``[N, K]`` read from the shuffled operands (rows restored, scales unswizzled)."""
    w = unshuffle_rows(packed["weight" + sfx], DENSE_TILE)
    s = packed["weight_scale" + sfx]
    s = unshuffle_rows(unswizzle_128x4(s, *s.shape), DENSE_TILE).float()
    n, k = w.shape[0], w.shape[1] * 2
    vals = e2m1_values(unpack_nibbles(w)).reshape(n, k // NVFP4_GROUP, NVFP4_GROUP)
    return (vals * s[:, :, None]).reshape(n, k) * packed["weight_scale_2"]


# --------------------------------------------------------------------------------------------
# MoE row maps on [E, 2I, X] stacks


def swap_w13(x: torch.Tensor) -> torch.Tensor:
    """[w1 ; w3] <-> [w3 ; w1] along dim 1 (its own inverse)."""
    e, m = x.shape[:2]
    return x.reshape(e, 2, m // 2, *x.shape[2:]).flip(1).reshape(x.shape).contiguous()


def gated_shuffle(x: torch.Tensor) -> torch.Tensor:
    """[w1 ; w3] -> interleaved (up, gate) rows, then the 32-row shuffle (TRT-LLM w13)."""
    e, m = x.shape[:2]
    inter = swap_w13(x).reshape(e, 2, m // 2, *x.shape[2:]).transpose(1, 2).reshape(x.shape)
    return shuffle_rows(inter, 32, dim=1)


def gated_unshuffle(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`gated_shuffle`."""
    e, m = x.shape[:2]
    inter = unshuffle_rows(x, 32, dim=1).reshape(e, m // 2, 2, *x.shape[2:]).transpose(1, 2)
    return swap_w13(inter.reshape(x.shape))


def block_major_k(w: torch.Tensor) -> torch.Tensor:
    """``[E, M, K]`` -> 16-row-shuffled BlockMajorK ``[E, K/128, M, 128]`` (TRT-LLM block FP8)."""
    e, m, k = w.shape
    return shuffle_rows(_u8(w).reshape(e, m, k // FP8_BLOCK, FP8_BLOCK).transpose(1, 2), 16, dim=2).view(w.dtype)


def from_block_major_k(w: torch.Tensor) -> torch.Tensor:
    e, kb, m, bk = w.shape
    return unshuffle_rows(_u8(w), 16, dim=2).transpose(1, 2).reshape(e, m, kb * bk).contiguous().view(w.dtype)


# --------------------------------------------------------------------------------------------
# MoE pack / unpack


def _equal_halves(x: torch.Tensor, what: str) -> None:
    # vLLM keeps one w13 scalar per expert (FP8: requantizes w1/w3 to the max; NVFP4: takes
    # column 0). Equal halves make that a no-op; unequal ones would change bytes or results.
    if x.dim() != 2 or x.shape[1] != 2 or not torch.equal(x[:, 0], x[:, 1]):
        raise ValueError(
            f"w13.{what} must be [E, 2] with equal w1/w3 entries (quantize gate/up of each expert "
            f"as one fused group), got shape {list(x.shape)}"
        )


def _block_scales(s: torch.Tensor) -> torch.Tensor:
    # Scheme output per expert is [nb, 1, kb, 1]; stacked [E, nb, 1, kb, 1] -> [E, nb, kb].
    return s[:, :, 0, :, 0] if s.dim() == 5 else s


def pack_moe(backend: str, algo: str, w13: dict, w2: dict, sfx: str) -> dict[str, dict]:
    """Stacked plain expert tensors -> packed MoE tensors (see the module table)."""
    a, b = w13["weight"], w2["weight"]
    out13: dict[str, torch.Tensor] = {}
    out2: dict[str, torch.Tensor] = {}
    if algo == "FP8":
        _equal_halves(w13["weight_scale"], "weight_scale")
        if backend == "trtllm":
            out13["weight" + sfx] = gated_shuffle(_u8(a)).view(a.dtype)
            out2["weight" + sfx] = shuffle_rows(_u8(b), 32, dim=1).view(b.dtype)
        else:
            out13["weight" + sfx] = swap_w13(_u8(a)).view(a.dtype)
            out2["weight" + sfx] = b.contiguous()
        out13["weight_scale" + sfx] = w13["weight_scale"].amax(dim=1)
    elif algo == "NVFP4":
        _equal_halves(w13["weight_scale_2"], "weight_scale_2")
        s13, s2 = w13["weight_scale"], w2["weight_scale"]
        if backend == "trtllm":
            out13["weight" + sfx] = gated_shuffle(a)
            s13 = gated_shuffle(_u8(s13)).view(s13.dtype)
            out2["weight" + sfx] = shuffle_rows(b, 32, dim=1)
            s2 = shuffle_rows(_u8(s2), 32, dim=1).view(s2.dtype)
        else:
            out13["weight" + sfx] = swap_w13(a)
            s13 = swap_w13(_u8(s13)).view(s13.dtype)
            out2["weight" + sfx] = b.contiguous()
        out13["weight_scale" + sfx] = swizzle_128x4(s13)
        out2["weight_scale" + sfx] = swizzle_128x4(s2)
    else:  # FP8_PB_WO
        a = swap_w13(_u8(a)).view(a.dtype)
        out13["weight" + sfx] = block_major_k(a) if backend == "trtllm" else a
        out2["weight" + sfx] = block_major_k(b) if backend == "trtllm" else b.contiguous()
        out13["weight_scale" + sfx] = swap_w13(_block_scales(w13["weight_scale"])).clamp(min=BLOCK_SCALE_MIN)
        out2["weight_scale" + sfx] = _block_scales(w2["weight_scale"]).clamp(min=BLOCK_SCALE_MIN)
    return {"w13": out13, "w2": out2}


def unpack_moe(backend: str, algo: str, packed: dict[str, dict], sfx: str) -> dict[str, dict]:
    """Packed MoE tensors -> ``{"w13": {"weight": ...}, "w2": {"weight": ...}}`` (plain stacks).

    Only the weights are inverted: the plain scales are kept beside (the clamp of block scales
    and the [E] max of FP8 scales lose information)."""
    a, b = packed["w13"]["weight" + sfx], packed["w2"]["weight" + sfx]
    block = algo == "FP8_PB_WO"  # BlockMajorK; the others packed here (FP8, NVFP4): gated interleave + shuffle
    if block and backend == "trtllm":
        a, b = from_block_major_k(a), from_block_major_k(b)
    if not block and backend == "trtllm":
        a = gated_unshuffle(_u8(a)).view(a.dtype)
        b = unshuffle_rows(_u8(b), 32, dim=1).view(b.dtype)
    else:
        a = swap_w13(_u8(a)).view(a.dtype)
    return {"w13": {"weight": a}, "w2": {"weight": b.contiguous()}}
