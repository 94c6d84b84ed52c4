"""Shared ``@triton.jit`` numerics: the scale rule, exact division, e4m3 / E2M1 / int8 rounding.

Every helper reproduces one step of ``quantize_cli.schemes.numerics`` (or ``torch``'s casts) bit for
bit. All math is fp32. Three facts shape this file:

* Triton's fp32 ``/`` lowers to an approximate division on the GPU, while torch divides exactly;
  :func:`div_rn` (``tl.math.div_rn``, IEEE round-to-nearest) is used everywhere.
* Note that torch itself, on CUDA, divides a tensor by a *Python scalar* (``amax / 448``) as a
  multiplication by the rounded reciprocal (ATen's ``div_true_kernel_cuda``), up to one ulp off;
  on the CPU it divides exactly. The kernels divide exactly, i.e. they equal the references as
  run on the CPU (the golden tests' numbers); see ``kernels/README.md``.
* The GPU cast fp32 -> float8e4nv (``cvt.rn.satfinite``) rounds to nearest-even, like torch, but the
  Triton *interpreter* (``TRITON_INTERPRET=1``, used by the CPU tests) rounds halves up and
  truncates sub-normals. With ``SOFT=True`` the e4m3 rounding is done in integer/fp32 arithmetic
  instead; it is exact on any backend, so the CPU tests, and GPUs older than sm_89 (no hardware
  e4m3 conversion), use it. The GPU tests check that both paths give the same bytes.

Rounding to an integer uses the fp32 adder itself: for ``|v| < 2**22``, ``v + 1.5 * 2**23`` lands
in the binade whose ulp is 1, so the addition rounds ``v`` to the nearest integer (ties to even, as
the sum's parity is ``v``'s), and the integer is the low bits of the sum: exact everywhere, 2 ops.
"""

from __future__ import annotations

import triton
import triton.language as tl

@triton.jit
def div_rn(x, y):
    """``x / y`` rounded to nearest-even in fp32 (torch's ``/`` on the CPU); ``y`` (never -0.0 here)
    is broadcast to ``x``'s shape by adding zeros, which leaves it unchanged."""
    x, y = tl.broadcast(x, y + tl.zeros_like(x))
    return tl.math.div_rn(x, y)


@triton.jit
def rcp_refined(d):
    """Reciprocal of ``d`` (fp32, normal, ``2^-60 <= d <= 2^60``) for :func:`div_rcp`: the GPU's
    approximate reciprocal refined by one Newton step (``rcp.approx`` + 2 FMAs). GPU only."""
    y0 = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [d], dtype=tl.float32, is_pure=True, pack=1)
    return tl.fma(y0, tl.fma(-d, y0, 1.0), y0)


@triton.jit
def div_rcp(x, d, y):
    """``x / d`` rounded to nearest-even, for ``x [G, 16]`` and one divisor per row ``d [G]`` with
    ``y = rcp_refined(d)``: ``q0 = x*y``, ``r = x - d*q0`` (exact, one FMA), ``q = q0 + y*r``.

    This is the fast path of the GPU's own ``div.rn.f32`` (MUFU.RCP, two FMAs refining it, then a
    quotient and one correction), with the reciprocal shared by a group instead of recomputed per
    element. ``div.rn`` takes it whenever its range check passes; callers must stay inside a range
    where it does: ``2^-60 <= d``, ``|x / d| <= 2^60``, and ``x`` normal whenever the result
    matters (NVFP4 only needs exact quotients of magnitude >= 0.25; below that only the sign
    counts, which this keeps). GPU only: the interpreter has no ``rcp.approx``.
    """
    q0 = x * y[:, None]
    r = tl.fma(-d[:, None], q0, x)
    return tl.fma(y[:, None], r, q0)


@triton.jit
def scale_from_amax(amax, qmax):
    """``amax / qmax`` in fp32; an all-zero group gets 1.0 (``numerics.scale_from_amax``).
    ``qmax`` is passed as a kernel argument, which keeps the divisor out of constant folding."""
    return tl.where(amax == 0.0, 1.0, div_rn(amax, qmax))


@triton.jit
def rint_i32(v):
    """``v`` (fp32, ``|v| < 2**22``) rounded to the nearest integer, ties to even, as int32
    (12582912 = 1.5 * 2**23, bit pattern 0x4B400000; see the module docstring)."""
    return (v + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000


@triton.jit
def _e4m3_bits_soft(x):
    """Bits (int32, 0..255) of ``x`` (fp32, ``|x| <= 448``) rounded to e4m3fn, nearest-even."""
    a = tl.abs(x)
    bits = a.to(tl.int32, bitcast=True)
    # Normal range (a >= 2^-6): round the fp32 mantissa to 3 bits in place (nearest-even; a carry
    # moves into the exponent), keep exponent + 3 mantissa bits, then rebias 127 -> 7.
    lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + lsb) >> 20) - ((127 - 7) << 3)
    # Sub-normal range: multiples of 2^-9, so the code is round(a * 512); 8 is the smallest normal.
    code = tl.where(a < 0.015625, rint_i32(a * 512.0), normal)
    # The sign comes from the bits, so -0.0 and tiny negatives give 0x80, as torch's cast does.
    sign = ((x.to(tl.int32, bitcast=True) >> 31) & 1) << 7
    return code | sign


@triton.jit
def e4m3(x, SOFT: tl.constexpr):
    """fp32 -> float8e4nv: clamp to [-448, 448] first (torch's cast gives NaN above 464, the GPU's
    saturates; clamping makes them agree), then round to nearest-even."""
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    if SOFT:
        return _e4m3_bits_soft(x).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
    else:
        return x.to(tl.float8e4nv)


@triton.jit
def e4m3_to_f32(v, SOFT: tl.constexpr):
    """float8e4nv -> fp32 (exact). The soft path decodes the bits (the interpreter's upcast goes
    through a float16 routine we do not rely on for sub-normals)."""
    if SOFT:
        c = v.to(tl.uint8, bitcast=True).to(tl.int32)
        e = (c >> 3) & 15
        m = (c & 7).to(tl.float32)
        # 2^(e - 10) built from its fp32 bits; e == 0 is the sub-normal case m * 2^-9.
        pow2 = ((e + (127 - 10)) << 23).to(tl.float32, bitcast=True)
        mag = tl.where(e == 0, m * 0.001953125, (m + 8.0) * pow2)
        return (mag.to(tl.int32, bitcast=True) | ((c >> 7) << 31)).to(tl.float32, bitcast=True)  # the sign in the bits keeps -0.0
    else:
        return v.to(tl.float32)


@triton.jit
def e2m1_codes(q):
    """E2M1 nibbles (int32, 0..15) of fp32 ``q``: nearest, ties to the even code, saturating at 6.

    Same result as ``numerics.e2m1_codes`` (a count of rounding boundaries), computed as a float
    rounding: E2M1 is a float with 1 mantissa bit, whose sub-normal step (below 1) is 0.5. Ties to
    the even code are ties to the even mantissa. Bit 3 is set when ``q < 0`` (so -0.0 gives 0x0).
    """
    a = tl.minimum(tl.abs(q), 6.0)  # saturate first: 6 is the largest magnitude
    b = a.to(tl.int32, bitcast=True)
    # a >= 1: round the fp32 mantissa to 1 bit in place (nearest-even), keep exponent + bit;
    # 1.0 has exponent 127, mantissa 0 -> (127 << 1) - 252 = 2, the code of 1.0.
    normal = ((b + 0x1FFFFF + ((b >> 22) & 1)) >> 22) - 252
    # a < 1: multiples of 0.5 -> code round(2a), i.e. 0 (0.0), 1 (0.5) or 2 (1.0).
    code = tl.where(a < 1.0, rint_i32(a * 2.0), normal)
    return tl.where(q < 0.0, code | 8, code)


@triton.jit
def int8_code(q):
    """fp32 -> int8: round half to even (``torch.round``), then clamp to [-128, 127].
    ``|q| <= 127 * (1 + 2^-23)`` here (``|w| <= amax``), well inside ``rint_i32``'s range."""
    return tl.minimum(tl.maximum(rint_i32(q), -128), 127).to(tl.int8)
