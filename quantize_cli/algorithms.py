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

Several algorithms in one checkpoint (``--algo-for``) are written as ``MIXED_PRECISION``. ModelOpt's
own AWQ exports name NVFP4 tensors ``NVFP4_AWQ`` (``Algorithm.awq_quant_algo``: read by eval,
never written).
"""

from __future__ import annotations

from dataclasses import dataclass

# --- Format constants -------------------------------------------------------------------------

E4M3_MAX = 448.0  # largest finite float8_e4m3fn
E2M1_MAX = 6.0  # largest E2M1 magnitude (NVFP4 values)
INT8_MAX = 127.0  # symmetric int8: scale = amax / 127, codes clamped to [-128, 127]
FP8_BLOCK = 128  # FP8_PB_WO: one scale per 128 x 128 block
NVFP4_GROUP = 16  # NVFP4: elements along K sharing one e4m3 scale
NVFP4_SCALE_MIN = 2.0**-9  # NVFP4 block scales are clamped up to this (ModelOpt >= 0.45): no zero scales
MX_BLOCK = 32  # MXFP8: elements along K sharing one e8m0 scale
INT4_GROUP = 128  # INT4: elements along K sharing one scale (llm-compressor's W4A16, ModelOpt's INT4 configs)


# --- Algorithms -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Algorithm:
    """Every format-independent fact about one ``--algo`` (the one home of the algorithm list).

    Attributes:
        name: the CLI name (``FP8_PB_WO``).
        quant_algo: the name ModelOpt writes in ``hf_quant_config.json`` (``fp8_pb_wo``); the
            schemes carry it because ModelOpt's tensor layout is the reference layout.
        activations: ``static`` (a calibrated or constant per-tensor input scale is written),
            ``dynamic`` (the engine scales activations at serve time) or ``none`` (16-bit activations).
        activation_bound: for static activations, the input amax that maps to the format's largest
            code: FP8 448, NVFP4 6 x 448 (the e4m3 group scale times the E2M1 maximum).
        shares_global_amax: fused members (q/k/v, gate/up) must share one per-tensor scale, because
            vLLM keeps one such scale per fused layer.
        group_size: the quantization group written in the configs, else None.
        tag: the model-card tag; describe: one line for people (the card, ``--help``).
        awq_quant_algo: the quant_algo ModelOpt 0.47 writes for the same tensors after its AWQ
            (``NVFP4_AWQ``: export/quant_utils.py ``process_layer_quant_config``), plus a
            ``pre_quant_scale`` per Linear where it could not fold it into a norm or Linear; None:
            no other name (INT4's ``W4A16_AWQ`` is both). Read only (``quantize eval``).
        blackwell_kernels: the native activation-quantizing kernels vLLM has only on Blackwell
            (``FP4``, ``MX``); on Hopper it serves the algorithm weight-only (Marlin). None: the
            same kernels on both (``quantize eval`` says which figure it measured).
        sqnr_floor_db: the absolute SQNR floor (dB) verify holds every quantized weight to
            (justified in docs/verify.md, measured typical values there).
        act_kind: how an engine quantizes the activations at serve time, as ``quantize eval`` and
            calibration's fake quantization replay it (``eval/activations.KINDS``: ``fp8_tensor``,
            ``fp8_token``, ``fp8_group``, ``nvfp4``, ``mxfp8``); None: 16-bit activations (a
            format may write the same weights with quantized activations: ``Scheme.act_kind``).
        zero_points: the weights carry a zero point per group (asymmetric codes).
    """

    name: str
    quant_algo: str
    activations: str
    describe: str
    tag: str
    activation_bound: float | None = None
    shares_global_amax: bool = False
    group_size: int | None = None
    awq_quant_algo: str | None = None
    blackwell_kernels: str | None = None
    sqnr_floor_db: float = 20.0
    act_kind: str | None = None
    zero_points: bool = False

    @property
    def static(self) -> bool:
        """True when the output carries a static activation scale (calibration sets it)."""
        return self.activations == "static"


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("FP8", "FP8", "static", "FP8 e4m3 weights with one fp32 scale per tensor; static per-tensor FP8 activations",
              "fp8", activation_bound=E4M3_MAX, shares_global_amax=True, act_kind="fp8_tensor"),
    Algorithm("FP8_PER_CHANNEL_PER_TOKEN", "FP8_PER_CHANNEL_PER_TOKEN", "dynamic",
              "FP8 e4m3 weights with one scale per output channel; dynamic per-token FP8 activations", "fp8",
              act_kind="fp8_token"),
    Algorithm("FP8_PB_WO", "fp8_pb_wo", "dynamic",
              "FP8 e4m3 weights with one scale per 128x128 block; dynamic 1x128-group FP8 activations", "fp8",
              act_kind="fp8_group"),
    Algorithm("NVFP4", "NVFP4", "static", "NVFP4 (E2M1 in 16-element groups, e4m3 group scales, fp32 global scale); "
              "static global + dynamic group FP4 activations", "nvfp4", activation_bound=E4M3_MAX * E2M1_MAX,
              shares_global_amax=True, group_size=NVFP4_GROUP, awq_quant_algo="NVFP4_AWQ", blackwell_kernels="FP4",
              sqnr_floor_db=12.0, act_kind="nvfp4"),
    # W4A16_NVFP4_CFG with awq_lite is NVFP4_AWQ too: get_quantization_format tests for a
    # pre_quant_scale before it tests for a disabled input quantizer (it writes no input_scale)
    Algorithm("W4A16_NVFP4", "W4A16_NVFP4", "none", "NVFP4 weights (E2M1, 16-element groups); 16-bit activations", "nvfp4",
              shares_global_amax=True, group_size=NVFP4_GROUP, awq_quant_algo="NVFP4_AWQ", sqnr_floor_db=12.0),
    Algorithm("INT8", "W8A16", "none", "int8 weights with one scale per output channel (ModelOpt W8A16); 16-bit activations "
              "(compressed-tensors W8A8: dynamic per-token int8)", "int8"),
    Algorithm("MXFP8", "MXFP8", "dynamic", "MXFP8 e4m3 weights with one power-of-two (e8m0) scale per 32 along K; "
              "dynamic MX activations", "mxfp8", group_size=MX_BLOCK, blackwell_kernels="MX", act_kind="mxfp8"),
    # ModelOpt calls group-128 int4 weight-only W4A16_AWQ, AWQ-smoothed or not; it never writes zero points
    Algorithm("INT4", "W4A16_AWQ", "none", "int4 weights with one scale per 128-element group (W4A16, symmetric); "
              "16-bit activations", "int4", group_size=INT4_GROUP, sqnr_floor_db=10.0),
    Algorithm("INT4_ASYM", "W4A16_AWQ", "none", "int4 weights with one scale and zero point per 128-element group "
              "(W4A16_ASYM); 16-bit activations", "int4", group_size=INT4_GROUP, sqnr_floor_db=10.0,
              zero_points=True),
)}
ALGOS = tuple(ALGORITHMS)
ALIASES = {"W8A16": "INT8",  # ModelOpt's name for what this tool calls INT8
           "W4A16": "INT4", "W4A16_ASYM": "INT4_ASYM",  # llm-compressor's preset names (docs/cli.md, "--algo names")
           "FP8_DYNAMIC": "FP8_PER_CHANNEL_PER_TOKEN", "FP8_BLOCK": "FP8_PB_WO", "NVFP4A16": "W4A16_NVFP4", "W8A8": "INT8"}
# An alias that names what one format writes: INT8 is weight-only in the ModelOpt format (W8A16) and
# int8 weights with dynamic per-token int8 activations in compressed-tensors (W8A8); the other format
# would write something else under that name, so it is refused there (issue 36).
ALIAS_FORMAT = {"W8A16": "modelopt", "W8A8": "compressed-tensors"}
MIXED_PRECISION = "MIXED_PRECISION"  # the quant_algo of a checkpoint holding several algorithms
QUANT_ALGO = {a.name: a.quant_algo for a in ALGORITHMS.values()}  # a view of the table, for lookups

# Without calibration, ModelOpt's convention takes the activation amax as 448 (design section 4.5):
# FP8 input_scale = 448 / 448 = 1.0, NVFP4 input_scale = 448 / (6 * 448) = 1/6.
UNCALIBRATED_AMAX = 448.0


def static_input_scale(algo: str, amax: float = UNCALIBRATED_AMAX) -> float:
    """ModelOpt's ``input_scale`` for activation `amax` under a static algorithm: ``amax / bound``."""
    bound = ALGORITHMS[algo].activation_bound
    if bound is None:
        raise ValueError(f"{algo} has no static activation scale")
    return amax / bound


def canonical_algo(name: str) -> str | None:
    """The algorithm a case-insensitive CLI name means (``fp8_pb_wo`` -> ``FP8_PB_WO``, ``W8A16``
    -> ``INT8``), or None when it names none."""
    key = str(name).upper()
    key = ALIASES.get(key, key)
    return key if key in ALGOS else None


def alias_format_problem(name: str, fmt: str) -> str | None:
    """Why `--algo name` cannot be written in format `fmt` (an alias naming the other format's INT8), or None."""
    wanted = ALIAS_FORMAT.get(str(name).upper())
    if wanted is None or wanted == fmt:
        return None
    other = next(a for a, f in ALIAS_FORMAT.items() if f == fmt)
    return (f"--algo {name} --format {fmt}: {fmt} writes INT8 as {other} ({'int8 weights and dynamic per-token int8 activations' if other == 'W8A8' else 'int8 weights, 16-bit activations'}), "
            f"not {str(name).upper()}; use --algo {other} (or INT8) with --format {fmt}, or --format {wanted} for {str(name).upper()}")


def algo_of_quant_algo(quant_algo: str) -> str | None:
    """The algorithm whose checkpoints carry `quant_algo` (case-insensitive), or None."""
    wanted = str(quant_algo).upper()
    return next((a for a, q in QUANT_ALGO.items() if q.upper() == wanted), None)


def algo_of_awq_quant_algo(quant_algo: str, static: bool) -> str | None:
    """The algorithm of a Linear that ModelOpt's AWQ export labels `quant_algo` (``NVFP4_AWQ``,
    case-insensitive), or None: the one with static activations when the Linear has an input scale
    (`static`; ``NVFP4_AWQ_LITE_CFG``), else the weight-only one (``W4A16_NVFP4_CFG`` + awq_lite)."""
    wanted = str(quant_algo).upper()
    found = [a for a in ALGORITHMS.values() if (a.awq_quant_algo or "").upper() == wanted]
    return next((a.name for a in found if a.static == static), None)


# --- Module names -----------------------------------------------------------------------------


def is_experts_prefix(prefix: str) -> bool:
    """True when the vLLM module prefix names a FusedMoE layer (``...mlp.experts``): vLLM loads
    all its experts as one module, so they are excluded, stacked and checked together."""
    return prefix.endswith("experts")


def is_expert_linear(name: str, vllm_prefix: str) -> bool:
    """True for one expert's Linear (``...mlp.experts.3.up_proj``, vLLM prefix ``...mlp.experts``),
    not the FusedMoE layer itself."""
    return is_experts_prefix(vllm_prefix) and vllm_prefix != name
