"""MXFP8 reference (OCP microscaling): e4m3 values, one power-of-two e8m0 scale per 32 along K.

ModelOpt 0.47's exporter (``MXFP8QTensor``), step by step::

    amax  = max |w| over each 32-element block of a row             [N, K/32], exact
    d     = amax_fp32 / 448                                         fp32 division
    e     = clamp(ceil(log2_fp32(d)), -127, 127)   d == 0 -> -127   unbiased exponent
    scale = uint8(e + 127)                                          weight_scale [N, K/32] (U8)
    q     = e4m3(clamp(w_fp32 * 2^(127 - scale), -448, 448))        weight [N, K] (F8_E4M3)

An all-zero block gets byte 0 (2^-127) and all-zero codes. No ``input_scale``: activations are
quantized dynamically (MX) at serve time. ``K % 32 == 0`` is required (ModelOpt asserts it).

``log2_fp32`` is ``torch.log2`` in fp32, *rounded*: when ``d`` sits a few ulps above a power of
two ``2^e``, ``log2(d) = e + tiny`` rounds to ``e`` in fp32 and the ceil gives ``e`` (a scale a
hair too small; the clamp at 448 absorbs it). :func:`e8m0_exponent` reproduces that exactly from
the bits of ``d``, with no transcendental call (so CPU, CUDA and Triton agree): ``e + 1`` unless
the mantissa offset ``m`` (units of 2^-23 above ``2^e``) is at most ``T(e)``, the largest offset
whose correctly rounded ``e + log2(1 + m 2^-23)`` is still ``e`` (``T`` = 0 for |e| < 4, 22 for
64 <= |e| < 128, 44 for sub-normal d; see :func:`round_down_table`). Only fp32 sources can hit it: a bf16 / fp16 amax
divided by 448 never lands that close above a power of two.

torch is imported inside the numeric functions only (planning imports no torch).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..algorithms import E4M3_MAX, MX_BLOCK
from .base import Scheme, Spec, k_group_problem

if TYPE_CHECKING:
    import torch

E8M0_BIAS = 127
E8M0_MIN_EXP, E8M0_MAX_EXP = -127, 127
_TABLE_LO = -150  # smallest unbiased exponent of a positive fp32 (2^-149 = 2^-150 * (1 + 1))
# A finite fp32 amax gives e <= 120 (3.4e38 / 448 < 2^120): a larger byte means NaN/Inf in the block.
E8M0_MAX_FINITE_BYTE = 247


def _half_gap_above(e: int) -> float:
    """Half the distance from the integer `e` to the next fp32 value above it."""
    if e == 0:
        return 2.0**-150
    p = math.floor(math.log2(abs(e)))
    below_power = e < 0 and abs(e) == 2**p  # -8 -> -7.99..: the binade below 8 is finer
    return 2.0 ** (p - 24 - (1 if below_power else 0))


@functools.lru_cache(maxsize=None)
def round_down_table() -> tuple[int, ...]:
    """``T(e)`` for ``e`` in ``[-150, 127]`` (index ``e + 150``): the largest mantissa offset
    ``m`` with ``fl32(e + log2(1 + m * 2^-23)) == e`` (log2 correctly rounded; checked against
    ``torch.log2`` on every exponent in the tests)."""
    out = []
    for e in range(_TABLE_LO, E8M0_MAX_EXP + 1):
        h, m = _half_gap_above(e), 0
        while math.log2(1 + (m + 1) * 2.0**-23) < h:
            m += 1
        out.append(m)
    return tuple(out)


def e8m0_exponent(d: torch.Tensor) -> torch.Tensor:
    """``clamp(ceil(fl32(log2(d))), -127, 127)`` as int32, ``-127`` where ``d == 0``.

    `d` is fp32, >= 0 and finite. Sub-normal `d` is first scaled by 2^64 (exact) so that every
    value has a 23-bit mantissa ``m`` and an exponent ``e``; the result is ``e + (m > T(e))``.
    """
    import torch

    d = d.float()
    sub = d < 2.0**-126
    dn = torch.where(sub, d * 2.0**64, d)
    bits = dn.view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 - torch.where(sub, 64, 0).to(torch.int32)
    m = bits & 0x7FFFFF
    table = torch.tensor(round_down_table(), dtype=torch.int32, device=d.device)
    up = m > table[(e - _TABLE_LO).clamp(0, len(table) - 1).long()]
    exp = (e + up.to(torch.int32)).clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
    return torch.where(d == 0, torch.full_like(exp, E8M0_MIN_EXP), exp)


def e8m0_scales(w: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, K/32]`` biased exponents (``e + 127``) of the 32-blocks of `w` ``[N, K]``."""
    import torch

    from .numerics import block_amax, div_exact

    d = div_exact(block_amax(w, (1, MX_BLOCK)), E4M3_MAX)
    return (e8m0_exponent(d) + E8M0_BIAS).to(torch.uint8)


def pow2(e: torch.Tensor) -> torch.Tensor:
    """fp32 ``2^e`` for integer ``e`` in ``[-127, 127]``, built from its bits (2^-127 is sub-normal)."""
    import torch

    e = e.to(torch.int32)
    normal = ((e.clamp(min=-126) + 127) << 23).view(torch.float32)
    return torch.where(e == -127, torch.full_like(normal, 2.0**-127), normal)


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """uint8 biased exponents -> fp32 ``2^(scale - 127)`` (exact; byte 0 is 2^-127)."""
    import torch

    return pow2(scale.to(torch.int32) - E8M0_BIAS)


def mx_outputs(shape) -> dict[str, Spec]:
    """MXFP8's tensors for a ``[N, K]`` weight (ModelOpt and compressed-tensors alike)."""
    n, k = shape
    return {"weight": ("F8_E4M3", (n, k)), "weight_scale": ("U8", (n, k // MX_BLOCK))}


@dataclass(frozen=True)
class Mxfp8(Scheme):
    """``MXFP8``: e4m3 ``weight [N, K]`` and uint8 e8m0 ``weight_scale [N, K/32]``."""

    def modelopt_group(self, group_size):
        from .fp8 import MODELOPT_FP8

        g = {**MODELOPT_FP8, "group_size": group_size or MX_BLOCK}
        return {"input_activations": dict(g), "weights": dict(g)}

    def shape_problem(self, shape):
        return super().shape_problem(shape) or k_group_problem(shape, MX_BLOCK, "MXFP8 blocks")

    def outputs(self, shape):
        return mx_outputs(shape)

    def quantize(self, w, global_amax=None):
        import torch

        from .fp8 import _fp32, fp8_cast

        n, k = w.shape
        scale = e8m0_scales(w)  # [N, K/32]
        # 2^(127 - s) = 1 / 2^(s - 127): a multiply by a power of two, exact unless it underflows
        mult = pow2(E8M0_BIAS - scale.to(torch.int32))
        q = _fp32(w).reshape(n, k // MX_BLOCK, MX_BLOCK).mul_(mult[:, :, None])
        return {"weight": fp8_cast(q).reshape(n, k), "weight_scale": scale}

    def dequantize(self, q):
        w = q["weight"]
        n, k = w.shape
        s = e8m0_to_float(q["weight_scale"])
        return (w.float().reshape(n, k // MX_BLOCK, MX_BLOCK) * s[:, :, None]).reshape(n, k)
