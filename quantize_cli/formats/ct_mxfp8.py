"""compressed-tensors MXFP8 (preset ``MXFP8``, format ``mxfp8-quantized``): the torch reference.

llm-compressor 0.14 / compressed-tensors 0.19 store the same tensors as ModelOpt's MXFP8 —
e4m3 ``weight [N, K]`` and a uint8 biased exponent ``weight_scale [N, K/32]`` (value
``2^(byte - 127)``), no input scale (activations are MX-quantized at serve time) — but pick the
exponent by another rule. For a weight ``w`` of dtype ``dt`` and a 32-element group's ``amax``
(exact, in ``dt``):

    p     = amax rounded to a power of two on its bits: add 1 << (mantissa_bits - 2), keep
            sign + exponent (so a mantissa of 1.75 or more rounds up, as E2M1's 1.5 step would)
    byte  = clamp(127 + log2(p) - 8, 0, 255)          8 = floor(log2(448)); p == 0 -> byte 0
    scale = dt(2^(byte - 127)), 0 -> 1.0              (fp16 underflow: compressed-tensors' eps
                                                       for a uint8 scale is 1, stored as 127)
    q     = e4m3(clamp(dt(w / scale), +-448))         a power-of-two division: exact in dt

The only difference from ModelOpt's ``ceil(log2(amax / 448))`` on normal bf16 data is a group
whose amax is exactly ``1.75 * 2^e``: compressed-tensors rounds up, ModelOpt keeps ``2^(e-8)``
(tests/test_ct_mxfp8.py). Pure torch on any device (no transcendental calls); torch is imported
inside the numeric functions, so the class describes its outputs without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..algorithms import E4M3_MAX
from ..schemes.base import k_group_problem
from ..schemes.mxfp8 import MX_BLOCK, E8M0_BIAS, e8m0_to_float, mx_outputs, pow2
from .ct_schemes import CtScheme, _t

if TYPE_CHECKING:
    import torch

MX_ELEM_OFFSET = 8  # floor(log2(448)): the group max lands in [256, 448)
# dtype name -> (integer view's name, mantissa bits, exponent bits)
_BITS = {"bfloat16": ("int16", 7, 8), "float16": ("int16", 10, 5), "float32": ("int32", 23, 8)}


def _bits(dtype: torch.dtype) -> tuple[str, int, int]:
    return _BITS[str(dtype).removeprefix("torch.")]


def power_of_two_exponent(amax: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' power-of-two rounding of non-negative `amax`, done on its own bits, as
    the biased exponent field ``E`` of the result (int64): ``p = 2^(E - bias)``, ``E == 0`` is p == 0.

    Reading ``E`` instead of forming ``p`` keeps a rounding that overflows the dtype finite:
    compressed-tensors forms ``p = inf`` there (an fp16 amax >= 57344; a bf16 one >= 3e38) and
    ends with byte 127 over an all-zero group (its cast of ``log2(inf)`` to int32); we write the
    power of two it meant. That is the one place our bytes differ on purpose (docs/formats.md)."""
    import torch

    view, mant, expo = _bits(amax.dtype)
    bits = amax.view(getattr(torch, view)).to(torch.int64) & ((1 << (1 + expo + mant)) - 1)  # the int16 view: a positive value
    return ((bits + (1 << (mant - 2))) >> mant) & ((1 << (expo + 1)) - 1)


def ct_mx_scales(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 bytes as stored, the scale in amax's dtype that divides the weight) per group.

    `amax`: ``[N, K/32]`` in the weight's dtype. p == 0 (a zero group, or a sub-normal amax
    that rounds to no exponent) is log2 = -inf in compressed-tensors, clamped to byte 0 as here."""
    import torch

    expo = _bits(amax.dtype)[2]
    field = power_of_two_exponent(amax)
    log2p = (field - ((1 << (expo - 1)) - 1)).float()
    byte = torch.where(field > 0, log2p + (E8M0_BIAS - MX_ELEM_OFFSET), torch.zeros_like(log2p)).clamp(0, 255)
    scale = pow2(byte.to(torch.int32) - E8M0_BIAS).to(amax.dtype)
    scale = torch.where(scale == 0, _t(1.0, scale), scale)  # an fp16 scale below 2^-24 underflowed
    stored = torch.where(scale == 1.0, torch.full_like(byte, E8M0_BIAS), byte)  # the byte of the scale used
    return stored.to(torch.uint8), scale


@dataclass(frozen=True)
class CtMxfp8(CtScheme):
    """``MXFP8``: e4m3 ``weight [N, K]`` and uint8 e8m0 ``weight_scale [N, K/32]``, compressed-tensors' rule."""

    def shape_problem(self, shape):
        return super().shape_problem(shape) or k_group_problem(shape, MX_BLOCK, "MXFP8 groups")

    def outputs(self, shape):  # the same tensors as ModelOpt's MXFP8; only the exponent rule differs
        return mx_outputs(shape)

    def quantize(self, w, global_amax=None):
        import torch

        n, k = w.shape
        groups = w.reshape(n, k // MX_BLOCK, MX_BLOCK)
        stored, scale = ct_mx_scales(groups.abs().amax(dim=2))
        q = (groups / scale[:, :, None]).clamp_(_t(-E4M3_MAX, w), _t(E4M3_MAX, w)).to(torch.float8_e4m3fn)
        return {"weight": q.reshape(n, k), "weight_scale": stored}

    def dequantize(self, q):
        w = q["weight"].float()
        s = e8m0_to_float(q["weight_scale"]).to(w.device)
        return w * s.repeat_interleave(MX_BLOCK, dim=1)
