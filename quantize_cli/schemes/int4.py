"""INT4 W4A16 reference: symmetric int4 in groups of 128 along K, written as ModelOpt ``W4A16_AWQ``.

ModelOpt 0.47's exporter (``INT4_BLOCKWISE_WEIGHT_ONLY_CFG`` / ``INT4_AWQ_CFG`` without the AWQ
pre-scale: ``get_scaling_factor`` then ``pack_int4_in_uint8``), step by step::

    amax  = max |w| over each 128-group of a row                  [N, K/128], exact
    scale = fp32(amax) / 7, an all-zero group -> 1.0              weight_scale fp32 [N, K/128]
    q     = clamp(round_half_even(w_fp32 / scale), -8, 7)         int4 codes (-8 is never reached)
    byte (i, k) = (q[2i, k] & 0xF) | (q[2i+1, k] & 0xF) << 4      weight uint8 [N/2, K]

The codes are packed two *output rows* per byte (two's-complement nibbles, the even row low),
not along K as NVFP4's: what TensorRT-LLM's ``W4A16_AWQ`` loader transposes and preprocesses.
So N must be even and K a multiple of 128 (ModelOpt asserts both). No ``input_scale``: the
activations stay 16-bit; no ``pre_quant_scale`` (ModelOpt writes one only after AWQ smoothing).

The grid itself (:func:`group_scales`, :func:`round_codes`, :func:`dequantize_codes`) is what
GPTQ rounds with: fixed per-group scales, one column or block of columns at a time.

torch is imported inside the numeric functions only (planning imports no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..algorithms import INT4_GROUP
from .base import Scheme, Spec, k_group_problem

if TYPE_CHECKING:
    import torch

INT4_MIN, INT4_MAX = -8, 7  # signed 4-bit codes
INT4_SYM_MAX = 7.0  # ModelOpt: scale = amax / 7 (its quantizer's maxbound), so +-amax -> +-7
# The ModelOpt config fields of W4A16_AWQ (ModelOpt's process_layer_quant_config writes them for every
# int4_awq layer, AWQ or not): no zero points; pre_quant_scale True even where no tensor is written.
MODELOPT_FIELDS = {"has_zero_point": False, "pre_quant_scale": True}


def group_scales(w: torch.Tensor, group: int = INT4_GROUP) -> torch.Tensor:
    """fp32 ``[N, K/group]`` scales of `w` ``[N, K]``: group amax / 7, an all-zero group 1.0."""
    from .numerics import block_amax, scale_from_amax

    return scale_from_amax(block_amax(w, (1, group)), INT4_SYM_MAX)


def round_codes(w: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None) -> torch.Tensor:
    """int8 codes in [-8, 7] of `w` on a fixed grid: ``clamp(round(w_fp32 / scale + zp), -8, 7)``.

    `w` is ``[N, c]`` (a block of columns, or all of K); `scale` (fp32) and `zero_point` broadcast
    against it: ``[N, 1]`` for one group's columns, ``[N, c]`` per element (:func:`expand_groups`).
    This is the rounding GPTQ applies column by column with the scales fixed beforehand.
    """
    import torch

    q = w.float() / scale
    if zero_point is not None:
        q = q + zero_point
    return q.round_().clamp_(INT4_MIN, INT4_MAX).to(torch.int8)


def dequantize_codes(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 values of int4 codes `q` on the grid of :func:`round_codes` (same broadcasting)."""
    v = q.float()
    if zero_point is not None:
        v = v - zero_point
    return v * scale


def expand_groups(s: torch.Tensor, group: int = INT4_GROUP) -> torch.Tensor:
    """Per-group ``[N, K/group]`` -> per-element ``[N, K]`` (each value repeated over its group)."""
    return s.repeat_interleave(group, dim=1)


def pack_row_pairs(q: torch.Tensor) -> torch.Tensor:
    """int8 codes ``[N, K]`` (N even) -> uint8 ``[N/2, K]``: row 2i in the low nibble, 2i+1 high."""
    import torch

    u = q.view(torch.uint8) & 0xF
    return u[0::2] | (u[1::2] << 4)


def unpack_row_pairs(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_row_pairs`: uint8 ``[N/2, K]`` -> int8 codes ``[N, K]`` (sign-extended)."""
    import torch

    p = packed.view(torch.uint8)
    lo, hi = (p & 0xF).to(torch.int8), (p >> 4).to(torch.int8)
    codes = torch.stack((lo, hi), dim=1).reshape(2 * p.shape[0], p.shape[1])
    return torch.where(codes > INT4_MAX, codes - 16, codes)


def int4_shape_problem(shape: tuple[int, ...], row_multiple: int, why_rows: str) -> str | None:
    """The INT4 rules: K a multiple of 128 (whole groups), N a multiple of `row_multiple`."""
    problem = k_group_problem(shape, INT4_GROUP, "INT4 groups of 128")
    if problem is None and shape[0] % row_multiple:
        problem = f"needs out-features (dim 0) divisible by {row_multiple} ({why_rows}), got {list(shape)}"
    return problem


@dataclass(frozen=True)
class Int4Group(Scheme):
    """``INT4`` (ModelOpt ``W4A16_AWQ``): uint8 ``weight [N/2, K]`` and fp32 ``weight_scale [N, K/128]``."""

    bits = 4

    def shape_problem(self, shape):
        return super().shape_problem(shape) or int4_shape_problem(shape, 2, "ModelOpt packs two rows per byte")

    def logical_shape(self, stored):
        return (2 * stored[0], stored[1])  # two output rows per byte

    @property
    def config_fields(self) -> dict:
        """Extra keys of ModelOpt's ``quantization`` block (after ``group_size``)."""
        return dict(MODELOPT_FIELDS)

    def outputs(self, shape):
        n, k = shape
        out: dict[str, Spec] = {"weight": ("U8", (n // 2, k)), "weight_scale": ("F32", (n, k // INT4_GROUP))}
        return out

    def quantize(self, w, global_amax=None):
        scale = group_scales(w)
        q = round_codes(w, expand_groups(scale))
        return {"weight": pack_row_pairs(q), "weight_scale": scale}

    def dequantize(self, q):
        codes = unpack_row_pairs(q["weight"])
        return dequantize_codes(codes, expand_groups(q["weight_scale"].float().to(codes.device)))
