"""What the Marlin layout writes for a Linear or an MoE layer: names, dtypes, padded shapes and
the shape rules (torch-free: the plan, ``check`` and ``--dry-run`` need these, not the packing).

The packing itself, and why the shapes are what they are, is :mod:`.marlin`.
"""

from __future__ import annotations

import math

from ..algorithms import FP8_BLOCK, MX_BLOCK, NVFP4_GROUP
from ..schemes import SCHEMES
from ..schemes.fp8 import Fp8Block, Fp8PerChannel, Fp8PerTensor
from ..schemes.int4 import INT4_GROUP, Int4Group
from ..schemes.int8 import Int8PerChannel
from ..schemes.mxfp8 import Mxfp8
from ..schemes.nvfp4 import Nvfp4
from .support import INT4_MARLIN_ONLY, INT4_ZERO_POINTS, NVFP4_WEIGHT_ONLY, PACKS

# scheme kind (layouts/support.py) -> what Marlin does: every dense kind is weight-only or has a W8A16 path
# (INT8 = ModelOpt W8A16) but int4 with zero points; MoE stacks: MXFP8 only
DENSE = {Fp8PerTensor: PACKS, Fp8PerChannel: PACKS, Fp8Block: PACKS, Nvfp4: PACKS, NVFP4_WEIGHT_ONLY: PACKS,
         Int8PerChannel: PACKS, Mxfp8: PACKS, Int4Group: PACKS, INT4_ZERO_POINTS: INT4_MARLIN_ONLY}
MOE = {Mxfp8: PACKS, Int4Group: INT4_MARLIN_ONLY, INT4_ZERO_POINTS: INT4_MARLIN_ONLY}
NO_MOE_KERNEL = ("Marlin MoE expert stacks are pre-packed for MXFP8 only (dense Linears for the others); "
                 "use --layout plain")

SUFFIX = "_marlin"
TILE_K, TILE_N = 16, 64
ACT_DTYPE_NAMES = ("bfloat16", "float16")


def act_name(act) -> str:
    """The name of an activation dtype given as a name or a torch dtype (``torch.float16`` -> ``float16``)."""
    return str(act).removeprefix("torch.")


def bits(algo: str) -> int:
    """Bits per Marlin code: the scheme's (``Scheme.bits``: 4 for the NVFP4 family and INT4, 8 otherwise)."""
    return SCHEMES[algo].bits


def group_size(algo: str) -> int:
    """Marlin group along K: the scheme's ``k_group`` (128 FP8 blocks and INT4, 16 NVFP4, 32 MXFP8),
    -1 where one scale spans K (one scale per column)."""
    return SCHEMES[algo].k_group or -1


def padded_nk(n: int, k: int, group: int = -1) -> tuple[int, int]:
    """Cheapest ``(Np, Nk)`` of the two GEMM families (N%64, K%128) / (N%128, K%64), K kept a
    multiple of the group; ties go to the smaller ``Np + Kp`` (vLLM ``marlin_padded_nk``)."""
    g = group if group > 0 else 1

    def up(x: int, m: int) -> int:
        return -(-x // m) * m

    cands = ((up(n, 64), up(k, math.lcm(128, g))), (up(n, 128), up(k, math.lcm(64, g))))
    return min(cands, key=lambda nk: (nk[0] * nk[1], nk[0] + nk[1]))


def specs(algo: str, shape: tuple[int, int], act) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Packed tensors of one Linear ``[N, K]``: suffix -> (safetensors dtype, shape).

    `act`: the activation dtype, ``"bfloat16"`` / ``"float16"`` (or the torch dtype)."""
    if act_name(act) not in ACT_DTYPE_NAMES:
        raise ValueError(f"Marlin needs bf16 or fp16 activations, got {act}")
    n, k = shape
    np_, kp = padded_nk(n, k, group_size(algo))
    b = bits(algo)
    out = {"weight" + SUFFIX: ("I32", (kp // 16, np_ * b // 2))}
    if algo == "INT4":  # uint4b8 codes; scales [Kp/128, Np] in the activation dtype, no global scale
        out["weight_scale" + SUFFIX] = ("BF16" if act_name(act) == "bfloat16" else "F16", (kp // INT4_GROUP, np_))
    elif b == 4:
        out["weight_scale" + SUFFIX] = ("F8_E4M3", (kp // NVFP4_GROUP, np_))
        out["weight_global_scale" + SUFFIX] = ("F32", ())
    elif algo == "MXFP8":
        out["weight_scale" + SUFFIX] = ("U8", (kp // MX_BLOCK, np_))
    else:
        g = kp // FP8_BLOCK if algo == "FP8_PB_WO" else 1
        out["weight_scale" + SUFFIX] = ("BF16" if act_name(act) == "bfloat16" else "F16", (g, np_))
    out["weight_shape" + SUFFIX] = ("I32", (2,))
    return out


def moe_shape_problem(algo: str, e: int, i: int, h: int) -> str | None:
    """Why Marlin stacks of (E, I, H) cannot be pre-packed, or None (MXFP8 only)."""
    if algo != "MXFP8":
        return "Marlin MoE expert stacks are pre-packed for MXFP8 only; use --layout plain"
    if i % TILE_N or h % TILE_N:
        return (f"Marlin MXFP8 MoE needs intermediate % 64 == 0 and hidden % 64 == 0 (vLLM 0.33.0 pads the "
                f"intermediate size otherwise; padding is not pre-packed), got I={i}, H={h}")
    return None


def moe_specs(algo: str, e: int, i: int, h: int) -> dict[str, dict]:
    """``{"w13": {name: (dtype, shape)}, "w2": {...}}``: per expert the dense MXFP8 Marlin tensors
    of w13 ``[2I, H]`` and w2 ``[H, I]``, stacked (no padding, see :func:`moe_shape_problem`)."""
    def one(n: int, k: int) -> dict:
        return {"weight" + SUFFIX: ("I32", (e, k // 16, 4 * n)), "weight_scale" + SUFFIX: ("U8", (e, k // MX_BLOCK, n))}

    return {"w13": one(2 * i, h), "w2": one(h, i)}
