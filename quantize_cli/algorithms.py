"""The algorithms and the format constants: one torch-free home (``quantize --help`` imports it).

Everything here is plain Python data, so the CLI can list and parse algorithm names without
importing torch; the schemes (``schemes/``), layouts, verify and the benches read the same names
and numbers from here instead of keeping copies.

    algorithm (CLI)              quant_algo written        block / group
    FP8                          FP8                       whole tensor
    FP8_PER_CHANNEL_PER_TOKEN    FP8_PER_CHANNEL_PER_TOKEN one output row
    FP8_PB_WO                    fp8_pb_wo                 128 x 128
    NVFP4, W4A16_NVFP4           NVFP4, W4A16_NVFP4        1 x 16 (e4m3 scales) + fp32 global
    INT8                         W8A16                     one output row
    MXFP8                        MXFP8                     1 x 32 (e8m0 scales)
    INT4, INT4_ASYM              W4A16_AWQ                 1 x 128 (int4; ASYM: compressed-tensors only)

Several algorithms in one checkpoint (``--algo-for``) are written as ``MIXED_PRECISION``.
"""

from __future__ import annotations

# --- Algorithms -------------------------------------------------------------------------------

ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "INT8", "MXFP8", "INT4", "INT4_ASYM")
ALIASES = {"W8A16": "INT8",  # ModelOpt's name for what this tool calls INT8
           "W4A16": "INT4", "W4A16_ASYM": "INT4_ASYM"}  # llm-compressor's preset names
MIXED_PRECISION = "MIXED_PRECISION"  # the quant_algo of a checkpoint holding several algorithms

# The ``quant_algo`` each algorithm writes in hf_quant_config.json / config.json.
QUANT_ALGO = {
    "FP8": "FP8",
    "FP8_PER_CHANNEL_PER_TOKEN": "FP8_PER_CHANNEL_PER_TOKEN",
    "FP8_PB_WO": "fp8_pb_wo",
    "NVFP4": "NVFP4",
    "W4A16_NVFP4": "W4A16_NVFP4",
    "INT8": "W8A16",
    "MXFP8": "MXFP8",
    "INT4": "W4A16_AWQ",  # what ModelOpt calls group-128 int4 weight-only, AWQ-smoothed or not
    "INT4_ASYM": "W4A16_AWQ",  # with zero points (has_zero_point): never written as ModelOpt here
}


def canonical_algo(name: str) -> str | None:
    """The algorithm a case-insensitive CLI name means (``fp8_pb_wo`` -> ``FP8_PB_WO``, ``W8A16``
    -> ``INT8``), or None when it names none."""
    key = str(name).upper()
    key = ALIASES.get(key, key)
    return key if key in ALGOS else None


def algo_of_quant_algo(quant_algo: str) -> str | None:
    """The algorithm whose checkpoints carry `quant_algo` (case-insensitive), or None."""
    wanted = str(quant_algo).upper()
    return next((a for a, q in QUANT_ALGO.items() if q.upper() == wanted), None)


# --- Format constants -------------------------------------------------------------------------

E4M3_MAX = 448.0  # largest finite float8_e4m3fn
E2M1_MAX = 6.0  # largest E2M1 magnitude (NVFP4 values)
INT8_MAX = 127.0  # symmetric int8: scale = amax / 127, codes clamped to [-128, 127]
FP8_BLOCK = 128  # FP8_PB_WO: one scale per 128 x 128 block
NVFP4_GROUP = 16  # NVFP4: elements along K sharing one e4m3 scale
NVFP4_SCALE_MIN = 2.0**-9  # NVFP4 block scales are clamped up to this (ModelOpt >= 0.45): no zero scales
MX_BLOCK = 32  # MXFP8: elements along K sharing one e8m0 scale

# --- Module names -----------------------------------------------------------------------------


def is_experts_prefix(prefix: str) -> bool:
    """True when the vLLM module prefix names a FusedMoE layer (``...mlp.experts``): vLLM loads
    all its experts as one module, so they are excluded, stacked and checked together."""
    return prefix.endswith("experts")


def is_expert_linear(name: str, vllm_prefix: str) -> bool:
    """True for one expert's Linear (``...mlp.experts.3.up_proj``, vLLM prefix ``...mlp.experts``),
    not the FusedMoE layer itself."""
    return is_experts_prefix(vllm_prefix) and vllm_prefix != name
