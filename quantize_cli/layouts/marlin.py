"""Marlin W8A16 / W4A16 layout (vLLM 0.33.0 ``gptq_marlin_repack`` + ``marlin_gemm``).

Marlin reads the weight as ``[K, N]`` codes cut into 16x64 tiles (16 along K, 64 along N). One
row of the packed int32 tensor holds one 16-deep K slab for all N; the tiles of that slab follow
each other along N. Inside a tile every thread of a warp owns exactly its ``mma.m16n8k16``
B fragment: rows ``2t, 2t+1, 2t+8, 2t+9`` of columns ``col`` and ``col+8`` of a 16-wide n block::

    packed int32 [K/16, N*16/pf]          pf = 32 / bits (8 codes per int for 4-bit, 4 for 8-bit)
    row kt = k // 16 :  | tile nt=0 (16 k x 64 n) | tile nt=1 | ... | tile N/64-1 |
    code (k, n):  kk = k%16 = 8h + 2t + l,   nn = n%64 = 16w + 8b + col
    byte/nibble stream of a tile, slowest index first:
        col(8)  t(4)  w(4)  b(2)  l(2)  h(2)          8-bit: one byte per code
        col(8)  t(4)  w(4)  l(2)  b(2)  h(2)          4-bit: one nibble per code, LSB first
    (= int ``4*(4col+t) + w`` holding nibbles (b,r)=(0,0)(0,2)(1,0)(1,2)(0,1)(0,3)(1,1)(1,3), or
     int ``8*(4col+t) + 2w + b`` holding bytes for k offsets +0, +8, +1, +9: spec §1.2)

The interleaved nibble/byte order lets the kernel turn codes into 16-bit floats with a couple of
``prmt``/``lop3`` instructions. Code conventions: FP8 and MXFP8 = the raw e4m3 byte, NVFP4 = the
raw E2M1 nibble, INT8 = ``q + 128`` (``uint8b128``), INT4 = ``q + 8`` (``uint4b8``, what
``gptq_marlin_repack`` reads from GPTQ / compressed-tensors W4A16 checkpoints).

Scales are ``[G, N]`` (G = 1 per tensor / per channel, K/group otherwise) in the activation dtype,
permuted on the row-major flattening: grouped -> each 64-chunk 8x8-transposed; one group ->
each 32-chunk gathered with ``off = [0,1,8,9,16,17,24,25]`` (spec §1.3). Then format finishing
(spec §1.4): FP8 scales x2^120 (bf16) / x2^8 (fp16) because the kernel builds 16-bit floats from
e4m3 bits by shifting; NVFP4 scales become S0E5M3 bytes (x scale_factor x2^7, runs of 4 swapped
[0,2,1,3], values < 2 dropped) and the global scale carries x2^119 (bf16) / x2^7 (fp16) / scale_factor;
MXFP8 e8m0 scale bytes ``[Kp/32, Np]`` only move (grouped permutation, runs of 4 swapped [0,2,1,3]),
bf16 activations only; INT4 scales ``[Kp/128, Np]`` are the plain fp32 group scales rounded to the
activation dtype, grouped permutation, no bias (the kernel turns ``q + 8`` into ``q`` itself).

Shapes that fit neither (N%64, K%128) nor (N%128, K%64) are zero-padded to the cheaper family
(``marlin_padded_nk``); the logical [N, K] is written beside as ``weight_shape_marlin``.
The names, dtypes and shapes written (and the shape rules) are :mod:`.marlin_shapes`, torch-free.
Everything here is pure torch (reshape/permute, no index tables), so it runs on CPU and CUDA with
the same bytes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..schemes.int4 import INT4_GROUP, pack_row_pairs, unpack_row_pairs
from ..schemes.mxfp8 import e8m0_to_float
from ..algorithms import FP8_BLOCK, MX_BLOCK, NVFP4_GROUP
from ..schemes.numerics import unpack_nibbles
# What is written (names, dtypes, padded shapes, shape rules): torch-free, for the plan.
from .marlin_shapes import SUFFIX, TILE_K, TILE_N, group_size, moe_shape_problem, moe_specs, padded_nk, specs  # noqa: F401
from .marlin_shapes import bits as _bits

ACT_DTYPES = (torch.bfloat16, torch.float16)
# Exponent-bias factors (spec §1.4): 2^(2^(e-1) - 2^3) for FP8, 2^(2^(e-1) - 2^1 - 7) for NVFP4.
FP8_BIAS = {torch.bfloat16: 2.0**120, torch.float16: 2.0**8}
NVFP4_GLOBAL_BIAS = {torch.bfloat16: 2.0**119, torch.float16: 2.0**7}
NVFP4_SCALE_MAX = 448.0 * 2**7  # scale_factor makes max(s * sf * 2^7) land in (224*2^7, 448*2^7]

# Axis orders of a code grid viewed as [NT, w, b, col, KT, h, t, l] (see the module diagram).
_ORDER = {8: (4, 0, 3, 6, 1, 2, 7, 5), 4: (4, 0, 3, 6, 1, 7, 2, 5)}


def _inverse(order: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(order)
    for i, o in enumerate(order):
        inv[o] = i
    return tuple(inv)


# --------------------------------------------------------------------------------------------
# weight repack (spec §1.2)


def repack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes ``[N, K]`` (one code per element) -> Marlin int32 ``[K/16, N*bits/2]``.

    Needs ``N % 64 == 0`` and ``K % 16 == 0`` (pad first)."""
    n, k = codes.shape
    if n % TILE_N or k % TILE_K:
        raise ValueError(f"Marlin repack needs N%64 == 0 and K%16 == 0, got [N, K] = [{n}, {k}]")
    grid = codes.reshape(n // 64, 4, 2, 8, k // 16, 2, 4, 2).permute(_ORDER[bits])
    stream = grid.reshape(k // 16, n * 16)  # one code per byte, in kernel order
    if bits == 4:
        stream = stream[:, 0::2] | (stream[:, 1::2] << 4)  # earlier nibble in the low half
    return stream.contiguous().view(torch.int32)


def unrepack_codes(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`repack_codes`: int32 ``[K/16, N*bits/2]`` -> uint8 codes ``[N, K]``."""
    kt = q.shape[0]
    stream = q.contiguous().view(torch.uint8)
    if bits == 4:
        stream = torch.stack((stream & 0xF, stream >> 4), dim=-1).reshape(kt, -1)
    n = stream.shape[1] // 16
    shape = [kt, n // 64] + [8, 4, 4, 2, 2, 2]
    grid = stream.reshape(shape).permute(_inverse(_ORDER[bits]))
    return grid.reshape(n, kt * 16)


def weight_codes(algo: str, weight: torch.Tensor) -> torch.Tensor:
    """Plain checkpoint weight -> uint8 codes ``[N, K]`` as the repack reads them (spec §1.1)."""
    if algo == "INT4":  # ModelOpt [N/2, K] row pairs -> q + 8
        return (unpack_row_pairs(weight) + 8).view(torch.uint8)
    if _bits(algo) == 4:
        return unpack_nibbles(weight.view(torch.uint8))  # [N, K/2] -> [N, K], low nibble = even k
    u = weight.view(torch.uint8)
    return u ^ 0x80 if weight.dtype == torch.int8 else u  # INT8: uint8b128 = q + 128


def codes_to_weight(algo: str, codes: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`weight_codes`."""
    if algo == "INT4":
        return pack_row_pairs((codes.to(torch.int16) - 8).to(torch.int8))
    if _bits(algo) == 4:
        return codes[:, 0::2] | (codes[:, 1::2] << 4)
    if algo == "INT8":
        return (codes ^ 0x80).view(torch.int8)
    return codes.view(torch.float8_e4m3fn)


# --------------------------------------------------------------------------------------------
# scale permutations (spec §1.3)


def _grouped(group: int, kp: int) -> bool:
    # One group spanning all of K (FP8 block with K == 128) takes the channel-wise branch.
    return group != -1 and group < kp


def permute_scales(s: torch.Tensor, grouped: bool) -> torch.Tensor:
    """``[G, N]`` -> ``[G, N]`` in Marlin order (row-major flattening, chunks of 64 or 32)."""
    g, n = s.shape
    if grouped:  # out[64c + 8i + j] = in[64c + 8j + i]
        return s.reshape(-1, 8, 8).transpose(1, 2).reshape(g, n).contiguous()
    # out[32c + 8i + 2a + m] = in[32c + 8a + 2i + m]
    return s.reshape(-1, 4, 4, 2).transpose(1, 2).reshape(g, n).contiguous()


def unpermute_scales(s: torch.Tensor, grouped: bool) -> torch.Tensor:
    """Inverse of :func:`permute_scales` (both permutations are involutions of their chunk)."""
    return permute_scales(s, grouped)


# --------------------------------------------------------------------------------------------
# format finishing (spec §1.4)


def channel_scales(algo: str, ws: torch.Tensor, n: int, np_: int, kp: int, act: torch.dtype) -> torch.Tensor:
    """Plain fp32 FP8 / INT8 scale -> Marlin ``[G, Np]`` in `act`, permuted; FP8 also x2^120 / x2^8
    (INT8 codes q+128 are turned into floats by magic-number arithmetic: no exponent bias)."""
    s = ws.to(act)  # rounded to the activation dtype first (fp16: RNE with sub-normals)
    if algo == "FP8_PB_WO":  # [nb, 1, kb, 1] -> [kb, N]: each block scale repeated over its 128 columns
        s = s.reshape(s.shape[0], s.shape[2]).T.repeat_interleave(FP8_BLOCK, dim=1)[:, :n]
        s = F.pad(s, (0, np_ - n, 0, kp // FP8_BLOCK - s.shape[0]))
    else:  # per tensor: broadcast to [1, N]; per channel: [N] -> [1, N]
        s = F.pad(s.reshape(1, -1).expand(1, n), (0, np_ - n))
    s = permute_scales(s, _grouped(group_size(algo), kp))
    if algo == "INT8":
        return s
    return s * torch.tensor(FP8_BIAS[act], dtype=act, device=s.device)


def int4_scales(ws: torch.Tensor, n: int, np_: int, kp: int, act: torch.dtype) -> torch.Tensor:
    """fp32 ``[N, K/128]`` group scales -> Marlin ``[Kp/128, Np]`` in `act` (rounded to it first),
    zero-padded, grouped permutation (the layout vLLM's MarlinLinearKernel gives uint4b8 scales)."""
    s = ws.T.to(act)
    s = F.pad(s, (0, np_ - n, 0, kp // INT4_GROUP - s.shape[0]))
    return permute_scales(s, _grouped(INT4_GROUP, kp))


def nvfp4_scale_factor(weight_scales: torch.Tensor | list[torch.Tensor], act: torch.dtype) -> float:
    """vLLM's data-dependent power-of-two ``scale_factor`` for NVFP4 Marlin (bf16 only; fp16: 1).

    ``2^floor(log2(448*2^7 / max(s*2^7)))`` over the non-zero block scales, 1 if that max is
    already >= 448*2^7. Pass every member of a fused group (q/k/v, gate/up): vLLM computes one
    factor over the fused layer. floor(log2) is taken from the fp32 exponent (frexp) so CPU and
    CUDA agree; the quotient is never within an ulp of a power of two for e4m3 inputs.
    """
    if act == torch.float16:
        return 1.0
    scales = weight_scales if isinstance(weight_scales, (list, tuple)) else [weight_scales]
    vals = torch.stack([s.float().amax() * 2**7 for s in scales])  # scales are >= 0
    max_val = vals.amax()
    if max_val <= 0 or max_val >= NVFP4_SCALE_MAX:
        return 1.0
    _, e = torch.frexp(torch.tensor(NVFP4_SCALE_MAX, device=max_val.device) / max_val)
    return 2.0 ** (int(e.item()) - 1)


def nvfp4_scales(ws: torch.Tensor, n: int, np_: int, kp: int, act: torch.dtype, sf: float) -> torch.Tensor:
    """e4m3 ``[N, K/16]`` -> Marlin S0E5M3 bytes ``[Kp/16, Np]`` (typed float8_e4m3fn)."""
    s = ws.T.to(act)
    s = F.pad(s, (0, np_ - n, 0, kp // NVFP4_GROUP - s.shape[0]))
    s = permute_scales(s, _grouped(NVFP4_GROUP, kp)).to(torch.float16)
    s = s.reshape(-1, 2, 2).transpose(1, 2).reshape(s.shape)  # runs of 4: [0, 2, 1, 3]
    if sf > 1.0:
        s = (s.float() * sf).to(torch.float16)
    s = s * 2**7
    s = torch.where(s < 2, torch.zeros_like(s), s)  # e4m3 sub-normals left below 2^-6: dropped
    byte = (s.view(torch.int16) >> 7) & 0xFF  # high byte of (fp16 bits << 1): unsigned E5M3
    return byte.to(torch.uint8).view(torch.float8_e4m3fn)


def mxfp8_scales(ws: torch.Tensor, n: int, np_: int, kp: int) -> torch.Tensor:
    """uint8 e8m0 ``[N, K/32]`` -> Marlin e8m0 bytes ``[Kp/32, Np]`` (vLLM 0.33
    ``prepare_mxfp8_layer_for_marlin``): transposed, zero-padded (byte 0), the grouped (8x8)
    permutation, then in runs of 4 entries ``[0, 2, 1, 3]`` (``mxfp8_marlin_process_scales``).
    vLLM goes through bf16 and back, which is exact for every power of two: a byte permutation."""
    s = F.pad(ws.view(torch.uint8).T, (0, np_ - n, 0, kp // MX_BLOCK - ws.shape[1]))
    s = permute_scales(s, _grouped(MX_BLOCK, kp))
    return s.reshape(-1, 2, 2).transpose(1, 2).reshape(s.shape).contiguous()


def decode_mxfp8_scales(b: torch.Tensor, kp: int) -> torch.Tensor:
    """Inverse of :func:`mxfp8_scales` up to the padding: uint8 ``[Kp/32, Np]`` in plain order."""
    s = b.view(torch.uint8)
    s = s.reshape(-1, 2, 2).transpose(1, 2).reshape(s.shape)
    return unpermute_scales(s, _grouped(MX_BLOCK, kp))


def decode_nvfp4_scales(b: torch.Tensor, kp: int) -> torch.Tensor:
    """Marlin S0E5M3 bytes -> fp16 ``s * sf * 2^7`` in plain ``[Kp/16, Np]`` order (kernel view)."""
    h = (b.view(torch.uint8).to(torch.int16) << 7).view(torch.float16)
    h = h.reshape(-1, 2, 2).transpose(1, 2).reshape(h.shape)
    return unpermute_scales(h, _grouped(NVFP4_GROUP, kp))


# --------------------------------------------------------------------------------------------
# one Linear


def _check_act(act: torch.dtype) -> None:
    if act not in ACT_DTYPES:
        raise ValueError(f"Marlin needs bf16 or fp16 activations, got {act}")


def pack(algo: str, plain: dict[str, torch.Tensor], act: torch.dtype, scale_factor: float | None = None):
    """Plain scheme tensors -> Marlin tensors (``weight_marlin``, ``weight_scale_marlin``,
    NVFP4 ``weight_global_scale_marlin``, ``weight_shape_marlin``).

    `scale_factor` (NVFP4, bf16) overrides the per-tensor factor: pass
    :func:`nvfp4_scale_factor` of the whole fused group so the members concatenate into the
    tensor vLLM builds for the fused layer.
    """
    _check_act(act)
    w, ws = plain["weight"], plain["weight_scale"]
    bits = _bits(algo)
    n, k = (2 * w.shape[0], w.shape[1]) if algo == "INT4" else (w.shape[0], w.shape[1] * (2 if bits == 4 else 1))
    np_, kp = padded_nk(n, k, group_size(algo))
    codes = F.pad(weight_codes(algo, w), (0, kp - k, 0, np_ - n))  # padded codes decode to 0
    out = {"weight" + SUFFIX: repack_codes(codes, bits)}
    if algo == "INT4":
        out["weight_scale" + SUFFIX] = int4_scales(ws, n, np_, kp, act)
    elif bits == 4:
        sf = nvfp4_scale_factor(ws, act) if scale_factor is None else float(scale_factor)
        out["weight_scale" + SUFFIX] = nvfp4_scales(ws, n, np_, kp, act, sf)
        out["weight_global_scale" + SUFFIX] = plain["weight_scale_2"].float() * NVFP4_GLOBAL_BIAS[act] / sf
    elif algo == "MXFP8":
        out["weight_scale" + SUFFIX] = mxfp8_scales(ws, n, np_, kp)
    else:
        out["weight_scale" + SUFFIX] = channel_scales(algo, ws, n, np_, kp, act)
    out["weight_shape" + SUFFIX] = torch.tensor([n, k], dtype=torch.int32, device=w.device)
    return out


def _logical_shape(packed: dict[str, torch.Tensor]) -> tuple[int, int]:
    n, k = packed["weight_shape" + SUFFIX].tolist()
    return int(n), int(k)


def unpack(algo: str, packed: dict[str, torch.Tensor], act: torch.dtype) -> dict[str, torch.Tensor]:
    """Marlin tensors -> ``{"weight": plain weight}`` (the plain scales are kept beside)."""
    n, k = _logical_shape(packed)
    codes = unrepack_codes(packed["weight" + SUFFIX], _bits(algo))[:n, :k]
    return {"weight": codes_to_weight(algo, codes).contiguous()}


def dequantize(algo: str, packed: dict[str, torch.Tensor], act: torch.dtype) -> torch.Tensor:
    """fp32 ``[Np, Kp]`` weight as the kernel computes it from the Marlin tensors alone.

    Emulates the kernel's bit tricks: a code is moved into a 16-bit float of `act` by shifting
    (e4m3 -> value x2^-120 in bf16 / x2^-8 in fp16; E2M1 -> x2^-126 / x2^-14) and multiplied by
    the finished scales, which carry the compensating powers of two.
    """
    bits = _bits(algo)
    q = packed["weight" + SUFFIX]
    kp = q.shape[0] * 16
    codes = unrepack_codes(q, bits).to(torch.int16)
    if algo == "MXFP8":  # exact values: e4m3 code x 2^(scale - 127) (the kernel's own bit tricks are not emulated)
        vals = codes.to(torch.uint8).view(torch.float8_e4m3fn).float()
        s = e8m0_to_float(decode_mxfp8_scales(packed["weight_scale" + SUFFIX], kp))
        return vals * s.repeat_interleave(MX_BLOCK, dim=0).T
    if algo == "INT8":
        vals = codes.float() - 128
    elif algo == "INT4":  # uint4b8: the kernel subtracts 8 (exact in 16-bit floats)
        vals = codes.float() - 8
    elif bits == 8:  # e4m3 s.eeee.mmm -> 16-bit float with the same exponent field, wrong bias
        shift = 4 if act == torch.bfloat16 else 7
        vals = (((codes & 0x80) << 8) | ((codes & 0x7F) << shift)).view(act).float()
    else:  # E2M1 s.ee.m
        shift = 6 if act == torch.bfloat16 else 9
        vals = (((codes & 0x8) << 12) | ((codes & 0x7) << shift)).view(act).float()
    s = packed["weight_scale" + SUFFIX]
    g = group_size(algo)
    if algo == "INT4":
        s = unpermute_scales(s, _grouped(g, kp)).float()
    elif bits == 4:
        s = decode_nvfp4_scales(s, kp).float()
    else:
        s = unpermute_scales(s, _grouped(g, kp)).float()
    per_k = s.repeat_interleave(kp // s.shape[0], dim=0).T  # [Np, Kp]
    w = vals * per_k
    if bits == 4 and algo != "INT4":
        w = w * packed["weight_global_scale" + SUFFIX]
    return w


# --------------------------------------------------------------------------------------------
# MoE expert stacks (MXFP8: vLLM 0.33 prepare_mxfp8_moe_layer_for_marlin)


def _pack_expert(algo: str, w: torch.Tensor, ws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = w.shape
    return repack_codes(weight_codes(algo, w), 8), mxfp8_scales(ws, n, n, k)


def pack_moe(algo: str, w13: dict, w2: dict) -> dict[str, dict]:
    """Stacked plain experts (``w13 [E, 2I, H]`` = [gate ; up], ``w2 [E, H, I]``, e8m0 scales
    ``[E, rows, K/32]``) -> Marlin stacks, expert by expert as vLLM does."""
    out = {}
    for side, plain in (("w13", w13), ("w2", w2)):
        parts = [_pack_expert(algo, w, s) for w, s in zip(plain["weight"], plain["weight_scale"])]
        out[side] = {"weight" + SUFFIX: torch.stack([p[0] for p in parts]),
                     "weight_scale" + SUFFIX: torch.stack([p[1] for p in parts])}
    return out


def unpack_moe(algo: str, packed: dict[str, dict]) -> dict[str, dict]:
    """Inverse of :func:`pack_moe` for the weights (the plain scales are kept beside)."""
    return {side: {"weight": torch.stack([codes_to_weight(algo, unrepack_codes(q, 8)) for q in packed[side]["weight" + SUFFIX]])}
            for side in ("w13", "w2")}
