"""The scheme interface shared by every algorithm.

A scheme turns one 2-D weight ``[N, K]`` (bf16, fp16 or fp32) into the named tensors ModelOpt
writes beside it (``weight``, ``weight_scale``, ``weight_scale_2``, ``input_scale``) and back.
Schemes are pure torch: no files, no modules, any device. Their description (names, dtypes,
shapes, shape rules) needs no torch, so planning (``check``, ``--dry-run``) imports none: torch is
imported inside the numeric methods only.

Every output is either 0-d (derived from the global amax alone), indexed by output row along
dim 0, or a function of the source shape alone (:meth:`Scheme.shape_outputs`), so a tensor may be
quantized in row chunks (multiples of ``row_align``) and the chunks concatenated: that is how
large tensors are processed with bounded memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

Spec = tuple[str, tuple[int, ...]]  # (safetensors dtype, shape)


def k_group_problem(shape: tuple[int, ...], group: int, what: str) -> str | None:
    """The rule of formats with scales along K: in-features must divide into `group`s (`what` names them)."""
    if shape[1] % group:
        return f"needs in-features (dim 1) divisible by {group} for {what}, got {list(shape)}"
    return None


@dataclass(frozen=True)
class Scheme:
    """One quantization algorithm.

    Attributes:
        algo: the CLI name (``FP8_PB_WO``).
        quant_algo: the name written in ``hf_quant_config.json`` (``fp8_pb_wo``).
        shares_global_amax: members of a fused group must share one global amax (one per-tensor
            weight scale / ``weight_scale_2``), because vLLM keeps one such scale per fused layer.
        static_input_scale: the calibration-free ``input_scale`` written for static-activation
            algorithms (ModelOpt's convention: activation amax 448), or None when none is written.
        group_size: the quantization group written in the configs (NVFP4: 16), else None.
        row_align: row chunks passed to :meth:`quantize` must be multiples of this.
    """

    algo: str
    quant_algo: str
    shares_global_amax: bool = False
    static_input_scale: float | None = None
    group_size: int | None = None
    row_align: int = 1
    # the 0-d scale over the group scales (NVFP4's ``weight_scale_2``), which vLLM merges over a fused
    # layer: its tensor name in the format, None where the scheme has no such second level
    global_scale_key = None
    # the static input scale is stored as its inverse (compressed-tensors NVFP4's input_global_scale)
    inverse_input_scale = False
    bits = 8  # bits per weight code (NVFP4's E2M1 and INT4: 4): what a kernel layout packs
    # ModelOpt 0.47's exporter writes config_groups for a single-algorithm checkpoint of this scheme
    modelopt_single_group = False

    def modelopt_group(self, group_size: int | None) -> dict | None:
        """ModelOpt's ``_quant_algo_to_group_config`` for this scheme (`group_size`: the one its
        document names, None: the scheme's own); None where ModelOpt has no group details for it."""
        return None

    @property
    def act_kind(self) -> str | None:
        """How an engine quantizes this scheme's activations at serve time (``eval/activations.KINDS``),
        None for 16-bit ones: the algorithm's (``Algorithm.act_kind``) unless the format's scheme
        says otherwise (compressed-tensors' INT8 is W8A8)."""
        from ..algorithms import ALGORITHMS

        return ALGORITHMS[self.algo].act_kind

    @property
    def k_group(self) -> int | None:
        """Input channels (along K) that share one weight scale, where fewer than a whole row
        (NVFP4 16, INT4 128, FP8_PB_WO's 128x128 blocks 128); None: one scale spans K."""
        return self.group_size

    def shape_problem(self, shape: tuple[int, ...]) -> str | None:
        """Why a weight of `shape` cannot be quantized with this scheme, or None if it can."""
        if len(shape) != 2 or 0 in shape:
            return f"needs a non-empty 2-D weight, got shape {list(shape)}"
        return None

    def logical_shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        """The source weight shape ``[N, K]`` of a stored ``weight`` (packed formats override)."""
        return tuple(stored)

    def shape_outputs(self, shape: tuple[int, int]) -> dict[str, torch.Tensor]:
        """Outputs that depend on the source shape ``[N, K]`` alone (compressed-tensors' INT4
        ``weight_shape``): written once per tensor, with its first row chunk. Most schemes: none."""
        return {}

    def outputs(self, shape: tuple[int, int]) -> dict[str, Spec]:
        """The tensors written for a weight of `shape`: suffix -> (safetensors dtype, shape)."""
        raise NotImplementedError

    def outputs_for(self, info) -> dict[str, Spec]:
        """:meth:`outputs` for a source tensor (a format whose scales keep the source dtype needs it)."""
        return self.outputs(tuple(info.shape))

    def global_amax(self, w: torch.Tensor) -> torch.Tensor:
        """0-d fp32 max |w| (exact: abs/max run in the source dtype)."""
        import torch

        from .numerics import abs_max

        return abs_max(w).float() if w.numel() else torch.zeros((), device=w.device)

    def quantize(self, w: torch.Tensor, global_amax: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Quantize `w` ``[N, K]``; `global_amax` (0-d fp32) overrides max |w| for shared scales."""
        raise NotImplementedError

    def dequantize(self, q: dict[str, torch.Tensor]) -> torch.Tensor:
        """fp32 ``[N, K]`` reconstruction from the tensors :meth:`quantize` returned."""
        raise NotImplementedError

    def calibrated_inputs(self, amax: float, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The static activation tensors for a calibrated input `amax` (replacing the constants in `out`).

        ModelOpt: fp32 0-d ``input_scale = amax / 448`` (FP8) or ``amax / (6 * 448)`` (NVFP4)."""
        import torch

        from ..algorithms import ALGORITHMS

        bound = ALGORITHMS[self.algo].activation_bound
        return {"input_scale": torch.tensor(amax, dtype=torch.float32) / torch.tensor(bound, dtype=torch.float32)}

    @property
    def input_scale_tensor(self) -> torch.Tensor | None:
        if self.static_input_scale is None:
            return None
        import torch

        return torch.tensor(self.static_input_scale, dtype=torch.float32)
