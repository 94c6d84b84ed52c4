"""Which schemes a kernel layout pre-packs, and why not the others (torch-free, for the plan).

Each layout's shape module declares what it packs by *scheme kind* (:func:`kind`: the scheme's
numerics class, with NVFP4's weight-only form and int4 with zero points apart, which no layout here
packs as their W4A4 / symmetric siblings): ``DENSE`` for a dense Linear, ``MOE`` for MoE expert
stacks. A verdict is :data:`PACKS` or ``(rule, why)``; a kind missing from ``MOE`` gets the
layout's ``NO_MOE_KERNEL`` line. The layout owns the fact; no table names algorithms.
"""

from __future__ import annotations

from ..algorithms import ALGORITHMS
from ..problems import LAYOUT_NO_BYTES_MOVE, LAYOUT_UNSUPPORTED
from ..schemes.int4 import Int4Group
from ..schemes.nvfp4 import Nvfp4

PACKS = None  # the verdict of a kind the layout packs
NVFP4_WEIGHT_ONLY = "nvfp4-weight-only"  # W4A16_NVFP4: the Nvfp4 numerics without activation quantization
INT4_ZERO_POINTS = "int4-zero-points"  # INT4_ASYM: the int4 numerics with a zero point per group

MXFP8_BLACKWELL = (LAYOUT_UNSUPPORTED, (
    "vLLM 0.33.0 runs MXFP8 on Blackwell through FlashInfer's MXFP8 GEMM / TRT-LLM MoE kernels, whose "
    "scale swizzle this converter does not pre-pack; use --layout marlin (SM80+) or --layout plain"))
INT4_MARLIN_ONLY = (LAYOUT_UNSUPPORTED, (
    "INT4 W4A16 is pre-packed for vLLM's Marlin W4A16 GEMM (dense Linears, symmetric codes) only: vLLM 0.33.0 "
    "serves int4 through Marlin / Machete / CUTLASS mixed-input kernels (CompressedTensorsWNA16), whose other "
    "weight preps and the MoE stacks this converter does not reproduce; use --layout marlin or --layout plain"))
W4A16_ONLY = (LAYOUT_UNSUPPORTED, (
    "W4A16_NVFP4 is weight-only: vLLM 0.33.0 serves it with Marlin (or FlashInfer's CuTe-DSL "
    "W4A16 GEMM, whose weight prep this converter does not reproduce); use --layout marlin"))


def no_bytes_move(why: str) -> tuple[str, str]:
    """The verdict of a kernel that reads the plain bytes: nothing to pre-pack."""
    return LAYOUT_NO_BYTES_MOVE, why


def kind(scheme) -> object:
    """The scheme kind a layout's ``DENSE`` / ``MOE`` name: the numerics class, or one of the two refinements."""
    if isinstance(scheme, Nvfp4) and scheme.static_input_scale is None:
        return NVFP4_WEIGHT_ONLY
    if isinstance(scheme, Int4Group) and ALGORITHMS[scheme.algo].zero_points:
        return INT4_ZERO_POINTS
    return type(scheme)


def verdict(rules, scheme, moe: bool) -> tuple[str, str] | None:
    """None when the layout module `rules` packs `scheme` (``moe``: its expert stacks), else (rule, why)."""
    k = kind(scheme)
    if moe:
        return rules.MOE.get(k, (LAYOUT_UNSUPPORTED, rules.NO_MOE_KERNEL.format(algo=scheme.algo)))
    return rules.DENSE[k]
