"""compressed-tensors ``pack-quantized`` INT4 (presets W4A16 and W4A16_ASYM): llm-compressor 0.14's bytes.

What vLLM serves with Marlin / Machete / CUTLASS (``CompressedTensorsWNA16``) and transformers
reads. llm-compressor (``model_free_ptq`` on the CPU, compressed-tensors 0.19) computes every
step in the weight's own dtype ``dt`` (bf16 for a bf16 checkpoint) and rounds after each::

    per 128-group of a row: lo = min(min w, 0), hi = max(max w, 0)        (exact)
    W4A16       s = dt(max(-lo, hi) / 7.5), 0 -> eps(dt)              q = round(clamp(dt(w / s), -8, 7))
    W4A16_ASYM  s = dt(dt(hi - lo) / 15),  0 -> eps(dt) after z is computed
                z = round(clamp(dt(-8 - dt(lo / s)), -8, 7)), NaN (0 / 0) -> 0
                q = round(clamp(dt(dt(w / s) + z), -8, 7))

``round`` is half to even. The symmetric grid is amax / 7.5, so +amax -> 7 (clamped) and -amax ->
-8: unlike ModelOpt's amax / 7 it uses the code -8. Tensors written (dtype of the source for the
scale)::

    weight_packed      int32 [N, K/8]        codes + 8, eight per int32 along K, the first in bits 0-3
    weight_scale       dt    [N, K/128]
    weight_shape       int64 [2]             [N, K]
    weight_zero_point  int32 [N/8, K/128]    (ASYM) zero points + 8, eight per int32 along N

K must be a multiple of 128 (whole groups: vLLM's Marlin and llm-compressor need it) and, for
the asymmetric preset, N a multiple of 8 (its zero points pack eight output rows per int32; row
chunks of the converter are multiples of 8). ``weight_shape`` depends on the source shape alone:
it is written once per tensor (:meth:`CtInt4.shape_outputs`), not per row chunk.

torch is imported inside the numeric functions only (planning imports no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..schemes.base import Spec
from ..schemes.int4 import INT4_GROUP, INT4_MAX, INT4_MIN, int4_shape_problem
from .ct_schemes import CtScheme, _t

if TYPE_CHECKING:
    import torch

PACK = 8  # int4 codes per int32
OFFSET = 8  # codes are stored unsigned: q + 8 (vLLM's uint4b8 for W4A16, uint4 with zero points)
SYM_HALF_RANGE = 7.5  # compressed-tensors: (7 - -8) / 2
ASYM_RANGE = 15.0  # 7 - -8


def pack_int32(q: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """int8 codes in [-8, 7] -> int32, eight ``q + 8`` nibbles per word along `dim` (first in the
    low bits; a partial last word is zero-padded). ``[N, K]`` -> ``[N, K/8]`` (dim 1) or ``[N/8, K]``."""
    import torch

    u = (q.to(torch.int32) + OFFSET)
    if dim == 0:
        u = u.T
    rows, cols = u.shape
    u = torch.nn.functional.pad(u, (0, -cols % PACK)).reshape(rows, -1, PACK)
    shifts = torch.arange(PACK, dtype=torch.int32, device=u.device) * 4
    # eight 4-bit fields never overlap: the sum is the OR, and int32 wraps like the bits do
    packed = (u << shifts).sum(dim=2, dtype=torch.int32)
    return packed.T.contiguous() if dim == 0 else packed


def unpack_int32(packed: torch.Tensor, n: int, dim: int = 1) -> torch.Tensor:
    """Inverse of :func:`pack_int32`: `n` codes along `dim` (the padding dropped), int8 in [-8, 7]."""
    import torch

    p = packed.T if dim == 0 else packed
    shifts = torch.arange(PACK, dtype=torch.int32, device=p.device) * 4
    u = ((p.unsqueeze(-1) >> shifts) & 0xF).reshape(p.shape[0], -1)[:, :n]
    q = (u - OFFSET).to(torch.int8)
    return q.T.contiguous() if dim == 0 else q


def group_bounds(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) ``[N, K/128]`` in `w`'s dtype: ``min(min w, 0)`` and ``max(max w, 0)`` per 128-group."""
    import torch

    n, k = w.shape
    groups = w.reshape(n, k // INT4_GROUP, INT4_GROUP)
    return torch.clamp(groups.amin(dim=2), max=0), torch.clamp(groups.amax(dim=2), min=0)


def ct_int4_qparams_from(lo: torch.Tensor, hi: torch.Tensor, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """compressed-tensors' scale (dtype of `lo`) and, asymmetric, int8 zero point of groups with
    bounds `lo` <= 0 <= `hi` (any shape): RTN's from :func:`group_bounds`, the scale search's shrunk."""
    import torch

    eps = _t(torch.finfo(lo.dtype).eps, lo)
    if symmetric:
        s = torch.maximum(lo.abs(), hi) / _t(SYM_HALF_RANGE, lo)
        return torch.where(s == 0, eps, s), None
    s = (hi - lo) / _t(ASYM_RANGE, lo)
    # the zero point comes from the scale *before* a zero one becomes eps: 0 / 0 is NaN there,
    # which compressed-tensors casts to int8 as 0 (x86); nan_to_num makes that explicit everywhere
    z = (_t(float(INT4_MIN), lo) - lo / s).clamp_(INT4_MIN, INT4_MAX).round_()
    z = torch.nan_to_num(z, nan=0.0).to(torch.int8)
    return torch.where(s == 0, eps, s), z


def ct_int4_qparams(w: torch.Tensor, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """compressed-tensors' scale ``[N, K/128]`` (dtype of `w`) and, asymmetric, int8 zero point."""
    return ct_int4_qparams_from(*group_bounds(w), symmetric)


def ct_int4_codes(w: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None) -> torch.Tensor:
    """int8 codes of `w` on compressed-tensors' grid, in `w`'s dtype: ``round(clamp(w / s (+ z)))``.

    `w` ``[N, c]``, `scale` / `zero_point` broadcasting against it (``[N, 1]`` for one group's
    columns): what GPTQ needs to round a column with the group's scale fixed."""
    import torch

    x = w / scale.to(w.dtype)
    if zero_point is not None:
        x = x + zero_point.to(w.dtype)
    return x.clamp_(INT4_MIN, INT4_MAX).round_().to(torch.int8)


@dataclass(frozen=True)
class CtInt4(CtScheme):
    """W4A16 (``symmetric``) and W4A16_ASYM: ``pack-quantized`` int4 in groups of 128."""

    symmetric: bool = True

    def shape_problem(self, shape):
        problem = super().shape_problem(shape)
        if problem or self.symmetric:
            return problem or int4_shape_problem(shape, 1, "")
        return int4_shape_problem(shape, PACK, "W4A16_ASYM packs the zero points of eight output rows per int32")

    def outputs(self, shape):
        n, k = shape
        out: dict[str, Spec] = {"weight_packed": ("I32", (n, k // PACK)),
                                "weight_scale": (self.source_dtype, (n, k // INT4_GROUP)),
                                "weight_shape": ("I64", (2,))}
        if not self.symmetric:
            out["weight_zero_point"] = ("I32", (n // PACK, k // INT4_GROUP))
        return out

    def shape_outputs(self, shape) -> dict:
        """``weight_shape``: the source ``[N, K]``, written once per tensor (not per row chunk)."""
        import torch

        return {"weight_shape": torch.tensor(list(shape), dtype=torch.int64)}

    def quantize(self, w, global_amax=None):
        return self.quantize_with(w, *ct_int4_qparams(w, self.symmetric))

    def search_quantize(self, w, channel_weights=None):
        """``--scale-search mse`` (:class:`..schemes.searched.Searched` calls it): the tensors of
        :meth:`quantize` with searched qparams (:func:`ct_int4_search`)."""
        return self.quantize_with(w, *ct_int4_search(w, self.symmetric, channel_weights))

    def quantize_with(self, w, scale, zp):
        """The written tensors of `w` under group scales `scale` and zero points `zp` (None:
        symmetric), RTN's or the scale search's (:func:`ct_int4_search`)."""
        n, k = w.shape
        x = w.reshape(n, k // INT4_GROUP, INT4_GROUP)
        q = ct_int4_codes(x, scale[:, :, None], None if zp is None else zp[:, :, None]).reshape(n, k)
        out = {"weight_packed": pack_int32(q), "weight_scale": scale}
        if zp is not None:
            out["weight_zero_point"] = pack_int32(zp, dim=0)
        return out

    def dequantize(self, q):
        import torch

        s = q["weight_scale"]
        n = s.shape[0]
        codes = unpack_int32(q["weight_packed"], q["weight_packed"].shape[1] * PACK).float()
        groups = codes.reshape(n, s.shape[1], INT4_GROUP)
        if "weight_zero_point" in q:
            groups = groups - unpack_int32(q["weight_zero_point"], n, dim=0).float()[:, :, None]
        return (groups * s.float().to(codes.device)[:, :, None]).reshape(n, -1).to(torch.float32)


def ct_int4_search(w: torch.Tensor, symmetric: bool, channel_weights: torch.Tensor | None = None):
    """Searched compressed-tensors W4A16 / W4A16_ASYM qparams of ``w`` [N, K] in its dtype dt:
    (scale dt ``[N, K/128]``, int8 zero point ``[N, K/128]`` or None), see :mod:`..schemes.search` (the candidates)
    and this module (the qparams formula the candidates go through)."""
    import torch

    from ..schemes.int4 import INT4_GROUP
    from ..schemes.search import INT4_SHIFT, ROW_MULTIPLIERS, error_units, group_error, int4_group_weights, search

    n, k = w.shape
    lo, hi = group_bounds(w)  # dt [N, K/128]
    mults = torch.tensor(ROW_MULTIPLIERS, dtype=torch.float32, device=w.device)[:, None]
    los = (lo.reshape(-1).float()[None, :] * mults).to(w.dtype)  # [16, G], row 0 == lo exactly
    his = (hi.reshape(-1).float()[None, :] * mults).to(w.dtype)
    scales, zps = ct_int4_qparams_from(los, his, symmetric)  # [16, G] each (zps None when symmetric)
    x = w.reshape(-1, INT4_GROUP)
    units = error_units(scales[0].float(), INT4_SHIFT)
    weights = int4_group_weights(channel_weights, n, k, w.device)
    count = scales.shape[1]
    index = torch.arange(len(ROW_MULTIPLIERS), device=w.device)[:, None].expand(-1, count)

    def evaluate(xs, x64, c, sl):
        i = int(c[0]) if c.numel() else 0
        s = scales[i, sl]
        z = None if zps is None else zps[i, sl]
        v = ct_int4_codes(xs, s[:, None], None if z is None else z[:, None]).float()
        if z is not None:
            v = v - z.float()[:, None]
        return group_error(x64, v, s.double(), units[sl], None if weights is None else weights(sl))

    best = search(x, index, None, evaluate)[None, :]
    s = scales.gather(0, best)[0].reshape(n, k // INT4_GROUP)
    return s, None if zps is None else zps.gather(0, best)[0].reshape(n, k // INT4_GROUP)
