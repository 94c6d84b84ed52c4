"""CUTLASS layouts (vLLM 0.33.0 ``CutlassNvFp4LinearKernel``; also FlashInfer-CUTLASS / CuTe-DSL /
cuDNN dense NVFP4, which prepare identically).

NVFP4 W4A4 is the only dense format whose bytes move:

* weight ``uint8 [N, K/2]`` zero-padded to ``[ceil32(N), ceil32(K)/2]``
  (``pad_nvfp4_weight_for_cutlass(w, 32)``; activations are padded by the same K at run time);
* block scales ``e4m3 [N, K/16]`` in the 128x4 swizzled layout ``[Mp, Kp] = [ceil128(N), ceil4(K/16)]``,
  zero padding. Scale (m, c) sits at the flat offset (spec §2.4, = TRT-LLM ``computeSFIndex``)::

      (m//128)*128*Kp + (c//4)*512 + (m%32)*16 + ((m%128)//32)*4 + c%4

  i.e. the rows of each 128-row band are dealt into 4 sub-bands of 32 and stored as
  ``[band][c//4][m%32][sub-band][c%4]``: one 512-byte atom holds a 128x4 scale tile so that a
  thread reading row m%32 finds its 4 sub-bands x 4 columns contiguous.

FP8 (per tensor / channel / 128x128 block) and INT8 W8A8 move no bytes on CUTLASS: the kernels take
``weight.t()`` (a view of the checkpoint's ``[N, K]`` bytes) and the checkpoint's fp32 scales
(spec §2.1-2.2, §2.5, §4), so there is nothing to pre-pack; :data:`DENSE` says why per scheme kind. What is written (names,
dtypes, shapes) is :mod:`.cutlass_shapes`, torch-free.
Pure torch (pad/reshape/permute): CPU and CUDA give the same bytes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..algorithms import NVFP4_GROUP
from ..schemes.numerics import e2m1_values, unpack_nibbles
# What is written (names, dtypes, shapes) and why FP8 / INT8 move nothing: torch-free, for the plan.
from .cutlass_shapes import DENSE, SUFFIX, WEIGHT_ALIGN, padded_weight_shape, specs, swizzled_shape  # noqa: F401


def swizzle_128x4(s: torch.Tensor) -> torch.Tensor:
    """``[..., M, C]`` scales -> ``[..., ceil128(M), ceil4(C)]`` in the 128x4 swizzled order.

    Leading dims are batch (MoE experts: each expert is swizzled on its own). Zero padding.
    """
    *lead, m, c = s.shape
    mp, cp = swizzled_shape(m, c)
    u = F.pad(s.view(torch.uint8), (0, cp - c, 0, mp - m))
    u = u.reshape(*lead, mp // 128, 4, 32, cp // 4, 4)
    nl = len(lead)
    order = list(range(nl)) + [nl + i for i in (0, 3, 2, 1, 4)]  # [band, c//4, m%32, sub-band, c%4]
    return u.permute(order).reshape(*lead, mp, cp).contiguous().view(s.dtype)


def unswizzle_128x4(s: torch.Tensor, m: int, c: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_128x4`, cropped back to ``[..., m, c]``."""
    *lead, mp, cp = s.shape
    u = s.view(torch.uint8).reshape(*lead, mp // 128, cp // 4, 32, 4, 4)
    nl = len(lead)
    order = list(range(nl)) + [nl + i for i in (0, 3, 2, 1, 4)]  # the permutation is an involution
    u = u.permute(order).reshape(*lead, mp, cp)
    return u[..., :m, :c].contiguous().view(s.dtype)


def pack(algo: str, plain: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Plain NVFP4 -> ``weight_cutlass`` (padded) and ``weight_scale_cutlass`` (swizzled)."""
    w, ws = plain["weight"], plain["weight_scale"]
    n, kb = w.shape
    np_, kbp = padded_weight_shape(n, 2 * kb)
    return {
        "weight" + SUFFIX: F.pad(w, (0, kbp - kb, 0, np_ - n)),
        "weight_scale" + SUFFIX: swizzle_128x4(ws),
    }


def unpack(algo: str, packed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`pack` for the weight; the logical ``[N, K/16]`` comes from the plain
    ``weight_scale`` kept beside."""
    n, c = packed["weight_scale"].shape
    return {"weight": packed["weight" + SUFFIX][:n, : c * NVFP4_GROUP // 2].contiguous()}


def dequantize(algo: str, packed: dict[str, torch.Tensor]) -> torch.Tensor:
    """fp32 ``[ceil32(N), ceil32(K)]`` weight read from the packed tensors as the kernel reads them:
    (E2M1 x unswizzled e4m3 block scale) x ``weight_scale_2``; padding decodes to 0.

    The swizzled scale tile always covers the padded weight (ceil128(N) >= ceil32(N) rows,
    4*ceil4(K/16) >= ceil32(K)/16 columns), so its zero padding scales the padded codes."""
    w = packed["weight" + SUFFIX]
    np_, cols = w.shape[0], w.shape[1] * 2 // NVFP4_GROUP
    s = unswizzle_128x4(packed["weight_scale" + SUFFIX], np_, cols).float()
    vals = e2m1_values(unpack_nibbles(w)).reshape(np_, cols, NVFP4_GROUP)
    return (vals * s[:, :, None]).reshape(np_, -1) * packed["weight_scale_2"]
