"""Searched scales (``--scale-search mse``): the torch reference, the specification of the kernels.

Round-to-nearest (RTN, what ModelOpt writes) takes ``scale = amax / qmax``. A slightly smaller
scale clips the largest value a little and often lowers the error of the whole group. Per group we
try a fixed, ordered list of candidate scales and keep the one with the smallest squared error of
the dequantized group. The file format, tensor names, dtypes and shapes are unchanged: every
loader reads a searched checkpoint exactly as it reads an RTN one.

Groups and candidates (candidate 0 is always the RTN scale, so the search never does worse):

    INT8 rows, FP8 rows, FP8 128x128 blocks:
        scale_i = scale_from_amax(fp32(amax * m_i), qmax),  m_i = fp32(1 - 0.02 i), i = 0..15
        (1.00, 0.98, ..., 0.70 of amax / qmax)
    INT4 128-groups along K (ModelOpt W4A16_AWQ: scale = amax / 7, fp32; compressed-tensors W4A16:
    amax / 7.5 in the weight's dtype dt, as :func:`..formats.ct_int4.ct_int4_qparams`):
        amax_i = fp32(amax * m_i) (compressed-tensors: dt(fp32(amax) * m_i)), the scheme's own RTN
        scale formula applied to amax_i; m_i as for rows (compressed-tensors: `formats.ct_int4.ct_int4_search`)
    INT4_ASYM 128-groups (compressed-tensors W4A16_ASYM, scale and zero point from the group's
    lo = min(min w, 0) and hi = max(max w, 0), as llm-compressor's mse observer shrinks them):
        lo_i = dt(fp32(lo) * m_i), hi_i = dt(fp32(hi) * m_i); scale and zero point by the scheme's
        own RTN formula from (lo_i, hi_i); the dequantized value is (code - z) * s
    NVFP4 16-groups (the global ``weight_scale_2`` stays that of the fused group):
        the e4m3 block scale whose code is RTN's code + j, kept to the valid scale codes 1..126
        (2^-9 .. 448); data-free j in (0, +1, -1, -2, -3, -4): the RTN scale, its upper e4m3
        neighbour and the four below it (down to about 0.73x); weighted (with calibration data)
        j in (0, +1, -1, ..., -8, +2, ..., +8): eight codes either side (``NVFP4_WEIGHTED_CODE_STEPS``).

The error of a candidate is measured exactly the same way on every device, so that the Triton
kernels choose the same candidate as this reference, bit for bit:

    d   = fp64(x) - fp64(v) * fp64(s)          v the dequantized code, s the scale (NVFP4:
                                                 fp64(bs8) * fp64(weight_scale_2)); the product is
                                                 exact in fp64, so a fused multiply-add cannot differ
    t   = (d * d) * 2^(SHIFT - 2 e0)           e0: the fp32 exponent of the group's RTN scale, so t
                                                 is the squared error in units of 2^-SHIFT RTN-scale^2
    err = sum over the group of int64(t)       truncated to integers: an exact, order-free sum

SHIFT is 28 for rows and blocks (rows up to ~300k elements cannot overflow int64, weighted or
not: normalized weights are at most 1), 40 for 16-groups and 40 for INT4's 128-groups (an
element's error is below (16 s0)^2 < 2^10 4^e0 even at the smallest candidate or an asymmetric
group's clamped zero point: 128 * 2^10 * 2^40 = 2^57). The candidate with the smallest
``err`` wins; candidates are scanned in the order above and a later one must be strictly smaller,
so ties go to RTN, then to the larger scale. The truncation makes the comparison coarse by at most one unit (2^-SHIFT RTN-scale^2) per
element: the searched group's fp64 error is never above RTN's by more than
``L * 2^-SHIFT * 4^(e0+1)`` (``L`` elements), which the property test checks.

Activation-weighted search (``channel_weights``, the calibration's ``E[x_j^2]`` per input channel
j, see :mod:`.weighted`): each element's term is weighted by its column's normalized weight ``c``
(divided by the group's largest, so in [0, 1]; :func:`.weighted.normalized`; an INT4 group
g of a row takes channels ``(g % (K/128)) * 128 + [0, 128)``), in this order:

    t   = ((d * d) * c) * 2^(SHIFT - 2 e0)

and the bound above holds for the weighted error divided by the group's largest weight. Candidates,
groups and the written bytes' format are those of the unweighted search; equal weights give its
bytes exactly (they normalize to 1.0) over the same candidates (NVFP4: the weighted list).
"""

from __future__ import annotations

from typing import Callable

import torch

from .base import Scheme
from .fp8 import BLOCK, _fp32, fp8_cast
from .int4 import INT4_GROUP, INT4_MAX, INT4_MIN, INT4_SYM_MAX, expand_groups, pack_row_pairs, round_codes
from .int8 import Int8PerChannel
from .numerics import (
    E4M3_MAX,
    INT8_MAX,
    NVFP4_GROUP,
    block_amax,
    e2m1_codes,
    e2m1_values,
    expand_blocks,
    pack_nibbles,
    scale_from_amax,
)
from .nvfp4 import Nvfp4, block_scales, global_scale
from .weighted import check as check_weights, normalized

ROW_MULTIPLIERS = tuple(1.0 - 0.02 * i for i in range(16))  # as fp32: torch.tensor(ROW_MULTIPLIERS)
NVFP4_CODE_STEPS = (0, 1, -1, -2, -3, -4)  # the data-free search's candidates
# With calibration data, eight e4m3 codes either side of RTN's (about 0.6x to 1.7x of its scale): a
# group's weighted error is dominated by its high-energy channels' weights, which a scale other than
# RTN's often represents exactly, larger ones included (SmolLM2-135M: codes +4 to +6 won a third of
# the groups; W4A16_NVFP4 perplexity 23.28 with the six candidates, 21.93 with these, RTN 25.26;
# docs/accuracy.md). The data-free search keeps its six: fitting the weights alone harder does not
# help a decoder (issue 28), and its bytes stay those measured.
NVFP4_WEIGHTED_CODE_STEPS = NVFP4_CODE_STEPS + (-5, -6, -7, -8, 2, 3, 4, 5, 6, 7, 8)
E4M3_CODE_MIN, E4M3_CODE_MAX = 1, 126  # 2^-9 (NVFP4's scale floor) .. 448
ROW_SHIFT = 28
NVFP4_SHIFT = 40
INT4_SHIFT = 40
SLICE_ELEMENTS = 1 << 21  # groups are searched in slices of about this many elements (bounded temporaries)


# -- the one search routine --------------------------------------------------------------------
def error_units(s0: torch.Tensor, shift: int) -> torch.Tensor:
    """fp64 ``2^(shift - 2 e0)`` per group, e0 the unbiased fp32 exponent field of ``s0`` [G]."""
    e0 = ((s0.float().contiguous().view(torch.int32) >> 23) & 0xFF) - 127
    # Built from its fp64 bits (exponent field 1023 + n): exact on every device, as in the kernels.
    return ((1023 + shift - 2 * e0).to(torch.int64) << 52).view(torch.float64)


def group_error(x64: torch.Tensor, v: torch.Tensor, s: torch.Tensor, units: torch.Tensor,
                cw: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [G]: the module doc's ``err`` of ``x64`` [G, L] (the fp32 groups as fp64) dequantized
    as ``v`` [G, L] (fp32 code values) times ``s`` [G] (fp64 scale); ``cw`` fp64 [G or 1, L]: the
    normalized channel weights of the group's elements (None: unweighted)."""
    d = v.double().mul_(s[:, None]).neg_().add_(x64)  # x - v * s: the product is exact in fp64
    d = d.mul_(d)
    if cw is not None:
        d = d.mul_(cw)
    return d.mul_(units[:, None]).to(torch.int64).sum(dim=1)


def search(x: torch.Tensor, candidates: torch.Tensor, valid: torch.Tensor | None,
           evaluate: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, slice], torch.Tensor]) -> torch.Tensor:
    """Index [G] of the best candidate per group.

    Args:
        x: ``[G, L]`` fp32 groups.
        candidates: ``[C, G]`` per-group candidate parameters, scanned in order (0 = RTN).
        valid: ``[C, G]`` bool, or None when every candidate is valid (candidate 0 must be).
        evaluate: ``(x[sl] [g, L], x[sl] as fp64, params [g], sl) -> int64 [g]`` errors (:func:`group_error`).
    """
    best = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    rows = max(1, SLICE_ELEMENTS // max(1, x.shape[1]))
    for g0 in range(0, x.shape[0], rows):
        sl = slice(g0, g0 + rows)
        x64 = x[sl].double()
        best_err = evaluate(x[sl], x64, candidates[0, sl], sl)
        for c in range(1, candidates.shape[0]):
            err = evaluate(x[sl], x64, candidates[c, sl], sl)
            better = err < best_err
            if valid is not None:
                better &= valid[c, sl]
            best_err = torch.where(better, err, best_err)
            best[sl] = torch.where(better, c, best[sl])
    return best


def _indices(sl: slice, total: int, device) -> torch.Tensor:
    """int64 indices of the groups ``sl`` selects among `total` (which column block each one is)."""
    return torch.arange(*sl.indices(total), device=device)


# -- rows and blocks (INT8, FP8 per channel, FP8 128x128) ----------------------------------------
def _int8_values(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (x / s[:, None]).round_().clamp_(-128, 127)


def _fp8_values(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return fp8_cast(x / s[:, None]).float()


def search_amax_scales(x: torch.Tensor, amax: torch.Tensor, qmax: float, values, weights=None,
                       shift: int = ROW_SHIFT) -> torch.Tensor:
    """Searched fp32 scales [G] of groups ``x`` [G, L] with max |x| ``amax`` [G] (see module doc).

    `weights`: ``sl -> fp64 [g or 1, L]`` normalized channel weights of the groups ``x[sl]``, or None;
    `shift`: the error units' SHIFT (rows and blocks 28, INT4 128-groups 40)."""
    mults = torch.tensor(ROW_MULTIPLIERS, dtype=torch.float32, device=x.device)
    cands = scale_from_amax(amax[None, :] * mults[:, None], qmax)  # [16, G], row 0 == RTN
    units = error_units(cands[0], shift)

    def evaluate(xs, x64, s, sl):
        return group_error(x64, values(xs, s), s.double(), units[sl], None if weights is None else weights(sl))

    best = search(x, cands, None, evaluate)
    return cands.gather(0, best[None, :])[0]


def _blocks(w: torch.Tensor) -> torch.Tensor:
    """``w`` [N, K] -> fp32 ``[ceil(N/128) * ceil(K/128), 128*128]`` blocks (edges zero padded)."""
    n, k = w.shape
    nb, kb = -(-n // BLOCK), -(-k // BLOCK)
    x = torch.nn.functional.pad(w.float(), (0, kb * BLOCK - k, 0, nb * BLOCK - n))
    return x.reshape(nb, BLOCK, kb, BLOCK).transpose(1, 2).reshape(nb * kb, BLOCK * BLOCK)


def quantize_rows(scheme: Scheme, w: torch.Tensor, channel_weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Searched INT8 / FP8 per-channel: the reference's tensors with searched row scales."""
    int8 = isinstance(scheme, Int8PerChannel)
    x = w.float()
    amax = block_amax(w, (1, w.shape[1]))[:, 0]
    cw = check_weights(channel_weights, w.shape[1])
    rows = None if cw is None else normalized(cw, w.shape[1], w.device)[None, :]  # one group: the whole row
    s = search_amax_scales(x, amax, INT8_MAX if int8 else E4M3_MAX, _int8_values if int8 else _fp8_values,
                           None if rows is None else (lambda sl: rows))
    q = _fp32(w).div_(s[:, None])
    q = q.round_().clamp_(-128, 127).to(torch.int8) if int8 else fp8_cast(q)
    return {"weight": q, "weight_scale": s}


def quantize_blocks(w: torch.Tensor, channel_weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Searched FP8_PB_WO: 128x128 block scales ``[nb, 1, kb, 1]``."""
    n, k = w.shape
    amax = block_amax(w, (BLOCK, BLOCK))  # [nb, kb]
    cw = check_weights(channel_weights, k)
    weights = None
    if cw is not None:
        kb = amax.shape[1]
        per_block = torch.nn.functional.pad(normalized(cw, BLOCK, w.device), (0, kb * BLOCK - k)).reshape(kb, BLOCK)
        tiled = per_block.repeat(1, BLOCK)  # [kb, 128*128]: a block's elements, row-major, take their column's weight

        def weights(sl):
            return tiled[_indices(sl, amax.numel(), w.device) % kb]

    s = search_amax_scales(_blocks(w), amax.reshape(-1), E4M3_MAX, _fp8_values, weights).reshape(amax.shape)
    q = fp8_cast(_fp32(w).div_(expand_blocks(s, (BLOCK, BLOCK), (n, k))))
    return {"weight": q, "weight_scale": s[:, None, :, None].contiguous()}


# -- INT4 128-groups (ModelOpt W4A16_AWQ; compressed-tensors W4A16 and W4A16_ASYM) ----------------
def _int4_values(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (x / s[:, None]).round_().clamp_(INT4_MIN, INT4_MAX)  # as int4.round_codes


def int4_group_weights(channel_weights: torch.Tensor | None, n: int, k: int, device):
    """``sl -> fp64 [g, 128]``: the normalized channel weights of the 128-groups ``sl`` of the
    ``[N*K/128, 128]`` view of a weight [N, K] (group g covers channels ``(g % (K/128)) * 128 +
    [0, 128)``), or None (unweighted)."""
    cw = check_weights(channel_weights, k)
    if cw is None:
        return None
    per_group = normalized(cw, INT4_GROUP, device).reshape(k // INT4_GROUP, INT4_GROUP)

    def weights(sl):
        return per_group[_indices(sl, n * per_group.shape[0], device) % per_group.shape[0]]

    return weights


def int4_group_scales(w: torch.Tensor, channel_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Searched fp32 ``[N, K/128]`` INT4 (ModelOpt) group scales of ``w`` [N, K] (module doc)."""
    n, k = w.shape
    x = w.float().reshape(-1, INT4_GROUP)
    amax = block_amax(w, (1, INT4_GROUP)).reshape(-1)
    s = search_amax_scales(x, amax, INT4_SYM_MAX, _int4_values, int4_group_weights(channel_weights, n, k, w.device),
                           shift=INT4_SHIFT)
    return s.reshape(n, k // INT4_GROUP)


def quantize_int4(w: torch.Tensor, channel_weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Searched INT4 (ModelOpt ``W4A16_AWQ``): ``Int4Group.quantize``'s tensors with searched scales."""
    scale = int4_group_scales(w, channel_weights)
    return {"weight": pack_row_pairs(round_codes(w, expand_groups(scale))), "weight_scale": scale}


# -- NVFP4 16-groups -------------------------------------------------------------------------
def _e4m3(codes: torch.Tensor) -> torch.Tensor:
    return codes.to(torch.uint8).view(torch.float8_e4m3fn)


def nvfp4_code_steps(weighted: bool) -> tuple[int, ...]:
    """The NVFP4 search's candidates as e4m3 code steps from RTN's code, scanned in order (0 first)."""
    return NVFP4_WEIGHTED_CODE_STEPS if weighted else NVFP4_CODE_STEPS


def nvfp4_block_scales(w: torch.Tensor, wsf2: torch.Tensor, channel_weights: torch.Tensor | None = None,
                       steps: tuple[int, ...] | None = None) -> torch.Tensor:
    """Searched e4m3 ``[N, K/16]`` block scales of ``w`` [N, K] against the global scale ``wsf2``
    (weighted by ``channel_weights`` [K] when given); `steps`: the candidates (default
    :func:`nvfp4_code_steps` of whether it is weighted)."""
    n, k = w.shape
    rtn = block_scales(w, wsf2).reshape(-1)
    code0 = rtn.view(torch.uint8).long()
    cw = check_weights(channel_weights, k)
    steps = torch.tensor(nvfp4_code_steps(cw is not None) if steps is None else steps, device=w.device)
    codes = code0[None, :] + steps[:, None]  # [C, G]
    valid = (codes >= E4M3_CODE_MIN) & (codes <= E4M3_CODE_MAX)
    codes = codes.clamp(E4M3_CODE_MIN, E4M3_CODE_MAX)
    x = w.float().reshape(-1, NVFP4_GROUP)
    w64 = wsf2.double()
    units = error_units(rtn.float() * wsf2, NVFP4_SHIFT)
    groups = None if cw is None else normalized(cw, NVFP4_GROUP, w.device).reshape(k // NVFP4_GROUP, NVFP4_GROUP)

    def evaluate(xs, x64, code, sl):
        bs = _e4m3(code).float()
        v = e2m1_values(e2m1_codes(xs / (bs * wsf2)[:, None]))
        g = None if groups is None else groups[_indices(sl, x.shape[0], w.device) % groups.shape[0]]
        return group_error(x64, v, bs.double() * w64, units[sl], g)

    best = search(x, codes, valid, evaluate)
    return _e4m3(codes.gather(0, best[None, :])[0]).reshape(n, k // NVFP4_GROUP)


def nvfp4_payload(w: torch.Tensor, bs8: torch.Tensor, wsf2: torch.Tensor) -> torch.Tensor:
    """Packed uint8 ``[N, K/2]`` of ``w`` with block scales ``bs8`` (as ``Nvfp4.quantize`` does)."""
    n, k = w.shape
    denom = bs8.float() * wsf2
    q = _fp32(w).reshape(n, k // NVFP4_GROUP, NVFP4_GROUP).div_(denom[:, :, None]).reshape(n, k)
    return pack_nibbles(e2m1_codes(q))


def quantize_nvfp4(scheme: Nvfp4, w: torch.Tensor, global_amax: torch.Tensor | None,
                   channel_weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    gamax = scheme.global_amax(w) if global_amax is None else global_amax
    wsf2 = global_scale(gamax.to(w.device))
    bs8 = nvfp4_block_scales(w, wsf2, channel_weights)
    out = {"weight": nvfp4_payload(w, bs8, wsf2), "weight_scale": bs8, "weight_scale_2": wsf2}
    if scheme.static_input_scale is not None:
        out["input_scale"] = scheme.input_scale_tensor
    return out


__all__ = ["search", "group_error", "nvfp4_code_steps", "quantize_blocks", "quantize_rows", "quantize_nvfp4", "quantize_int4", "int4_group_scales"]
