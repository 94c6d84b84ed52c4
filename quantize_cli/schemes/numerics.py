"""Number formats: constants, the one block-amax routine, E2M1 encoding and signal-to-noise.

All scale math is fp32. Every scheme's scales come from :func:`block_amax`: per tensor, per row,
per 128x128 block and per 16-element group are just different block shapes.
"""

from __future__ import annotations

import math

import torch

# The format constants live in algorithms.py (torch-free); re-exported here for the schemes.
from ..algorithms import E2M1_MAX, E4M3_MAX, FP8_BLOCK, INT8_MAX, MX_BLOCK, NVFP4_GROUP, NVFP4_SCALE_MIN  # noqa: F401

# Value of each E2M1 nibble: bit 3 is the sign, bits 0-2 index {0, .5, 1, 1.5, 2, 3, 4, 6}.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

# Rounding boundaries between consecutive E2M1 magnitudes. At a tie the even code wins, so the
# boundary belongs to the upper code when that code is even (0.75 -> 1.0, 1.75 -> 2.0, 3.5 -> 4.0)
# and to the lower code otherwise (0.25 -> 0, 1.25 -> 1.0, 2.5 -> 2.0, 5.0 -> 4.0).
E2M1_UP_AT_TIE = (0.75, 1.75, 3.5)
E2M1_DOWN_AT_TIE = (0.25, 1.25, 2.5, 5.0)


def block_amax(w: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Max |w| over each ``block = (bn, bk)`` tile of a 2-D tensor, as fp32.

    Edge tiles of shapes that are not block multiples cover only the real elements (zero padding
    cannot change a max of absolute values). abs and max are exact in any float dtype, so the
    reduction runs in the source dtype and only the small result is converted.

    Example: ``w`` of shape ``[200, 96]`` with ``block=(128, 128)`` gives ``[2, 1]``;
    ``block=(1, 16)`` on ``[N, K]`` gives ``[N, K // 16]``; ``block=(N, K)`` gives ``[1, 1]``.
    """
    n, k = w.shape
    bn, bk = block
    nb, kb = -(-n // bn), -(-k // bk)
    if (bn, bk) == (n, k):
        return abs_max(w).float().reshape(1, 1) if w.numel() else torch.zeros(1, 1, device=w.device)
    if n % bn or k % bk:
        w = torch.nn.functional.pad(w, (0, kb * bk - k, 0, nb * bn - n))
    return abs_max(w.reshape(nb, bn, kb, bk), dim=(1, 3)).float()


def abs_max(x: torch.Tensor, dim: tuple[int, ...] | None = None) -> torch.Tensor:
    """``max |x|`` (over `dim`, else all of it) as ``max(-min(x), max(x))``: the same value as
    ``x.abs().amax()`` (negation is exact; NaN propagates through both), without writing ``|x|``
    to memory: on the CPU that full-size temporary cost 8x the two reductions."""
    if dim is None:
        lo, hi = torch.aminmax(x)
    else:
        lo, hi = x.amin(dim=dim), x.amax(dim=dim)
    return torch.maximum(lo.neg(), hi).abs()  # abs: max(-0.0, +0.0) may be -0.0 (an all-zero block)


def div_exact(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """``x / divisor`` correctly rounded on every device.

    On CUDA, torch divides a tensor by a Python number (or a CPU scalar) as a multiplication by
    the rounded reciprocal, one ulp off at times; dividing by a tensor on the same device is a true
    IEEE division, which is what the CPU, the Triton kernels (div_rn) and ModelOpt compute.
    """
    x = x.float()
    return x / x.new_tensor(divisor)


def scale_from_amax(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """``amax / qmax`` in fp32, with an all-zero group getting scale 1.0 (ModelOpt's convention)."""
    scale = div_exact(amax, qmax)
    return torch.where(amax == 0, torch.ones_like(scale), scale)


def expand_blocks(scale: torch.Tensor, block: tuple[int, int], shape: tuple[int, int]) -> torch.Tensor:
    """Broadcast a ``[nb, kb]`` per-block tensor to the element grid ``shape`` (cropping the edges)."""
    bn, bk = block
    n, k = shape
    return scale.repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]


def e2m1_codes(q: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to E2M1 nibbles (uint8 0..15), nearest with ties to the even code.

    Magnitudes above 5 saturate to 6 (code 7). The sign bit is set when ``q < 0``, so ``-0.0``
    encodes as 0x0 while a tiny negative value that rounds to zero encodes as 0x8 (ModelOpt).
    """
    a = q.abs()
    code = torch.zeros(q.shape, dtype=torch.uint8, device=q.device)
    for t in E2M1_UP_AT_TIE:
        code += a >= t
    for t in E2M1_DOWN_AT_TIE:
        code += a > t
    return code | ((q < 0).to(torch.uint8) << 3)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """Decode E2M1 nibbles (uint8 0..15) to fp32 values."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` nibbles -> ``[N, K/2]`` bytes, element 2j in the low nibble of byte j."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """``[N, K/2]`` bytes -> ``[N, K]`` nibbles (inverse of :func:`pack_nibbles`)."""
    lo, hi = packed & 0xF, packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(packed.shape[0], -1)


#: Below this ||ref||^2, fp32 squares may have underflowed enough to matter: sum in fp64 instead.
#: (Each lost square is < 1.2e-38, so with >= 1e-12 of signal even 1e9 of them move the SQNR only
#: where it is above ~170 dB.)
FP32_MIN_SIGNAL = 1e-12


def square_sums(ref: torch.Tensor, *approx: torch.Tensor) -> list[float]:
    """``[||ref||^2, ||ref - a||^2 for a in approx]`` (any equal shapes; one device sync).

    fp32 with torch's cascaded sums (relative error ~1e-7 here, against fp64's: far below the
    0.1 dB the reports print) at a third of fp64's cost on the CPU, where it made --report 3x
    slower; fp64 where fp32 would overflow (values above ~1.8e19) or underflow (a tensor of tiny
    values, :data:`FP32_MIN_SIGNAL`: a drowned fused-group member must not read as exact)."""
    for dtype in (torch.float32, torch.float64):
        r = ref.to(dtype)
        sums = torch.stack([r.square().sum()] + [(r - a.to(dtype)).square_().sum() for a in approx]).tolist()
        if all(math.isfinite(x) for x in sums) and sums[0] >= FP32_MIN_SIGNAL:
            break
    return sums


def error_fields(signal: float, noise: float) -> dict[str, float]:
    """``{"rel_error": |ref - approx| / |ref|, "sqnr_db": 10 log10(signal / noise)}`` from the squared
    norms :func:`square_sums` returns (rel_error 0 and SQNR inf when exact)."""
    rel = 0.0 if noise == 0 else (math.sqrt(noise / signal) if signal else math.inf)
    sqnr = math.inf if noise == 0 else (10 * math.log10(signal / noise) if signal else -math.inf)
    return {"rel_error": rel, "sqnr_db": sqnr}


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio ``20 log10(|ref| / |ref - approx|)`` in dB (inf if exact)."""
    return error_fields(*square_sums(ref, approx))["sqnr_db"]


def relative_error(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """``|ref - approx| / |ref|`` (Frobenius norms; 0 for an exact all-zero tensor)."""
    return error_fields(*square_sums(ref, approx))["rel_error"]


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in `t` (any dtype; integers always pass). For 16/32/64-bit floats by
    ``aminmax`` (NaN and +-Inf reach the min or the max): one reduction, 50x faster on the CPU
    than ``isfinite(t).all()``, which writes a full-size bool tensor first."""
    if not t.is_floating_point() or not t.numel():
        return True
    if t.element_size() == 1:  # fp8: no aminmax kernel for these dtypes
        return bool(torch.isfinite(t.float()).all())
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo) & torch.isfinite(hi))
