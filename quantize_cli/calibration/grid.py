"""A format's value grid under fixed scales: what GPTQ rounds each column to.

GPTQ fixes the scales first (from the original weight, exactly as the scheme writes them: RTN,
or ``--scale-search mse``) and then rounds column by column, each column to the nearest value the
format can represent under those scales. This module turns one scheme's quantized output into
that grid, for any scheme whose payload is one of three value sets:

    E2M1 nibbles packed two per byte (NVFP4: ModelOpt ``weight``, compressed-tensors ``weight_packed``)
    e4m3 bytes (FP8 per tensor / channel / 128x128 block, MXFP8)
    int8 (INT8 per channel)

The per-element scale ``S [N, K]`` is read from the scheme itself: ``S = scheme.dequantize(out)``
with every payload code set to the code of 1.0, so a grid value ``v * S`` is bit for bit what
``scheme.dequantize`` gives for code ``v`` (what verify, eval and the engines compute). Rounding
is ``code = nearest(x / S)`` in fp32, ties to even, saturating at the format's largest value.

    int4 codes in groups of 128 (INT4: ModelOpt row pairs per byte, compressed-tensors eight per
    int32 along K, with zero points for W4A16_ASYM): values ``(code - z) * s`` (:class:`Int4Grid`)

Another value set plugs in as a :class:`Grid` subclass registered in :data:`FAMILIES`: it needs
``match``, the scale (and zero point) view, ``round`` and ``pack``.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..schemes.fp8 import fp8_cast
from ..schemes.numerics import e2m1_codes, e2m1_values, pack_nibbles

PAYLOAD_KEYS = ("weight", "weight_packed")


class Grid:
    """The values one weight ``[N, K]`` can take under fixed scales, and its output tensors.

    ``out`` is the scheme's output dict for the original weight (its scales are kept), ``key``
    the payload's name in it. :meth:`round` quantizes columns (original indices ``cols``) and
    remembers their codes; :meth:`outputs` returns ``out`` with the payload made of those codes.
    """

    one: int = 0  # the code of the value 1.0, as stored in :attr:`codes`
    zero: torch.Tensor | None = None  # fp32 [N, K] zero points (int4 asymmetric), else None
    code_dtype: torch.dtype = torch.uint8  # codes are kept as integers (index writes of fp8 are not everywhere)
    kernel: str = ""  # the GPU kernel's name for this rounding (kernels/gptq_block.py KINDS); "" = none
    code_range: tuple[int, int] = (0, 0)  # clamp bounds of an integer grid's codes

    def __init__(self, scheme, out: dict[str, torch.Tensor], key: str, shape: tuple[int, int]):
        self.scheme, self.out, self.key = scheme, out, key
        device = out[key].device
        self.codes = torch.zeros(shape, dtype=self.code_dtype, device=device)
        ones = torch.full(shape, self.one, dtype=self.code_dtype, device=device)
        self.scale = scheme.dequantize({**out, key: self.pack(ones)}).float()  # [N, K]: the value of code 1.0

    @classmethod
    def match(cls, payload: torch.Tensor, shape: tuple[int, int]) -> bool:
        raise NotImplementedError

    def code_values(self, codes: torch.Tensor) -> torch.Tensor:
        """fp32 values of `codes` (before the scale)."""
        raise NotImplementedError

    def nearest(self, q: torch.Tensor) -> torch.Tensor:
        """Codes nearest to fp32 `q` (already divided by the scale)."""
        raise NotImplementedError

    def pack(self, codes: torch.Tensor) -> torch.Tensor:
        """``[N, K]`` codes -> the payload tensor as the scheme writes it."""
        return codes

    def round(self, x: torch.Tensor, cols: torch.Tensor | slice) -> torch.Tensor:
        """Quantize ``x [N, c]`` (columns `cols` of the weight); returns the fp32 grid values ``[N, c]``."""
        codes, values = self.quantize_with(x, self.scale[:, cols], None if self.zero is None else self.zero[:, cols])
        self.codes[:, cols] = codes
        return values

    def quantize_with(self, x: torch.Tensor, s: torch.Tensor, z: torch.Tensor | None):
        """(codes, fp32 values) of ``x`` under scales `s` and zero points `z` (None: symmetric):
        ``code = nearest(x / s + z)``, ``value = (code - z) * s`` (the schemes' dequantization)."""
        q = x / s
        if z is not None:
            q = q + z
        codes = self.nearest(q)
        v = self.code_values(codes)
        if z is not None:
            v = v - z
        return codes, v * s

    def outputs(self) -> dict[str, torch.Tensor]:
        """The scheme's output tensors with the rounded codes as payload (scales unchanged)."""
        return {**self.out, self.key: self.pack(self.codes)}


class E2M1Grid(Grid):
    one = 2  # E2M1 code 2 is 1.0
    kernel = "e2m1"

    @classmethod
    def match(cls, payload, shape):
        return payload.dtype == torch.uint8 and tuple(payload.shape) == (shape[0], shape[1] // 2)

    def code_values(self, codes):
        return e2m1_values(codes)

    def nearest(self, q):
        return e2m1_codes(q)  # ties to the even code, saturating at 6; the sign bit as the schemes set it

    def pack(self, codes):
        return pack_nibbles(codes)


class E4M3Grid(Grid):
    one = 0x38  # the e4m3 bits of 1.0
    kernel = "e4m3"

    @classmethod
    def match(cls, payload, shape):
        return payload.dtype == torch.float8_e4m3fn and tuple(payload.shape) == tuple(shape)

    def code_values(self, codes):
        return codes.view(torch.float8_e4m3fn).float()

    def nearest(self, q):
        return fp8_cast(q).view(torch.uint8)  # clamp to +-448, round to nearest even

    def pack(self, codes):
        return codes.view(torch.float8_e4m3fn)


class Int8Grid(Grid):
    one = 1
    code_dtype = torch.int8
    kernel = "int"
    code_range = (-128, 127)

    @classmethod
    def match(cls, payload, shape):
        return payload.dtype == torch.int8 and tuple(payload.shape) == tuple(shape)

    def code_values(self, codes):
        return codes.float()

    def nearest(self, q):
        return q.round().clamp_(-128, 127).to(torch.int8)  # round half to even


class Int4Grid(Grid):
    """int4 codes in [-8, 7] under fixed group scales ``s`` and (asymmetric) zero points ``z``:
    value ``(code - z) * s``, as both INT4 schemes dequantize (schemes/int4.py, formats/ct_int4.py).
    The scale and zero point are read from the scheme's own outputs, not re-derived."""

    code_dtype = torch.int8
    kernel = "int"

    def __init__(self, scheme, out, key, shape):
        from ..schemes.int4 import INT4_MAX, INT4_MIN, expand_groups

        self.code_range = (INT4_MIN, INT4_MAX)
        self.scheme, self.out, self.key = scheme, out, key
        self.codes = torch.zeros(shape, dtype=torch.int8, device=out[key].device)
        self.scale = expand_groups(out["weight_scale"].float())  # [N, K]
        zp = self.zero_points(out, shape[0])
        self.zero = None if zp is None else expand_groups(zp.float())

    def zero_points(self, out, n: int):
        return None

    def code_values(self, codes):
        return codes.float()

    def nearest(self, q):
        from ..schemes.int4 import INT4_MAX, INT4_MIN

        return q.round().clamp_(INT4_MIN, INT4_MAX).to(torch.int8)  # half to even, as round_codes


class ModelOptInt4Grid(Int4Grid):
    """ModelOpt W4A16_AWQ: uint8 ``weight [N/2, K]``, two output rows per byte."""

    @classmethod
    def match(cls, payload, shape):
        return payload.dtype == torch.uint8 and tuple(payload.shape) == (shape[0] // 2, shape[1]) and shape[0] % 2 == 0

    def pack(self, codes):
        from ..schemes.int4 import pack_row_pairs

        return pack_row_pairs(codes)


class CtInt4Grid(Int4Grid):
    """compressed-tensors pack-quantized: int32 ``weight_packed [N, K/8]`` (+ zero points for ASYM)."""

    @classmethod
    def match(cls, payload, shape):
        return payload.dtype == torch.int32 and tuple(payload.shape) == (shape[0], -(-shape[1] // 8))

    def zero_points(self, out, n):
        from ..formats.ct_int4 import unpack_int32

        return unpack_int32(out["weight_zero_point"], n, dim=0) if "weight_zero_point" in out else None

    def pack(self, codes):
        from ..formats.ct_int4 import pack_int32

        return pack_int32(codes)


# Payload families, tried in order (their payload dtypes and shapes never overlap).
FAMILIES: list[type[Grid]] = [E2M1Grid, E4M3Grid, Int8Grid, ModelOptInt4Grid, CtInt4Grid]


def fixed_grid(scheme, w: torch.Tensor, global_amax: torch.Tensor | None,
               quantize: Callable | None = None) -> Grid:
    """The grid of `w` ``[N, K]`` under the scales `scheme` writes for it (shared `global_amax` for a
    fused group). `quantize` (default ``scheme.quantize``) makes those scales; a UsageError-free
    ValueError names the scheme when its payload is none of :data:`FAMILIES`."""
    out = (quantize or scheme.quantize)(w, global_amax)
    key = next((k for k in PAYLOAD_KEYS if k in out), None)
    shape = tuple(w.shape)
    for family in FAMILIES:
        if key is not None and family.match(out[key], shape):
            return family(scheme, out, key, shape)
    raise ValueError(f"{scheme.algo}: its weight payload is not a value grid GPTQ knows (E2M1, e4m3, int8, int4)")


__all__ = ["Grid", "E2M1Grid", "E4M3Grid", "Int8Grid", "Int4Grid", "FAMILIES", "fixed_grid"]
