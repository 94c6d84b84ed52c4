"""``--layout``: wiring the kernel layouts (layouts/) into the plan and the executor.

Dense Linears are packed one fused group at a time (Marlin NVFP4 needs one ``scale_factor`` per
fused layer, as vLLM computes it). MoE layers are packed as vLLM holds them: every expert of a
layer is quantized (gate and up sharing their global scale), stacked into ``w13 [E, 2I, H]`` =
[gate ; up] and ``w2 [E, H, I]``, and written as ``<experts>.w13_weight_<layout>`` etc.; the plain
per-expert scales stay under their checkpoint names so ``unpack`` is exact.

The plan holds the activation dtype by name (``"bfloat16"`` / ``"float16"``): planning imports no
torch; :meth:`Packing.pack_group` and :meth:`Packing.pack_layer` (the executor) do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import layouts
from ..schemes import SCHEMES
from ..schemes.nvfp4 import Nvfp4
from . import Layout

if TYPE_CHECKING:
    import torch

# config.json dtype spellings -> the activation dtype's name (a torch attribute: torch.bfloat16, ...)
ACT_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "bf16": "bfloat16", "fp16": "float16"}


def act_dtype_from_config(config: dict) -> tuple[str | None, str]:
    """The activation dtype vLLM would serve with (config ``torch_dtype``/``dtype``) by name, or (None, why)."""
    name = config.get("torch_dtype") or config.get("dtype") or (config.get("text_config") or {}).get("torch_dtype")
    if name is None:
        return "bfloat16", "bfloat16 (config.json names no dtype; vLLM's default for bf16 checkpoints)"
    dtype = ACT_DTYPES.get(str(name).removeprefix("torch."))
    if dtype is None:
        return None, f"config.json dtype {name!r}: the packed layouts target 16-bit (bfloat16/float16) activations"
    return dtype, str(name)


@dataclass(frozen=True)
class Packing:
    """What ``--layout`` packs: dense Linears (``dense``; False where the kernel reads the plain
    bytes, e.g. CUTLASS FP8, so they are written plain) and MoE expert stacks."""

    layout: Layout
    algo: str
    act_dtype: str  # "bfloat16" or "float16"
    dense: bool = True

    @property
    def suffix(self) -> str:
        return layouts.suffix(self.layout)

    def dense_problem(self, shape: tuple[int, int]) -> str | None:
        if self.algo == "MXFP8" and self.act_dtype != "bfloat16":
            return "vLLM 0.33.0 serves MXFP8 with bfloat16 activations only (ModelOptMxFp8Config); set the model dtype to bfloat16"
        return layouts.shape_problem(self.layout, self.algo, shape)

    def dense_specs(self, shape: tuple[int, int]) -> dict:
        return layouts.packed_specs(self.layout, self.algo, shape, self.act_dtype)

    def moe_problem(self, e: int, i: int, h: int) -> str | None:
        if self.algo == "MXFP8" and self.act_dtype != "bfloat16":
            return "vLLM 0.33.0 serves MXFP8 with bfloat16 activations only (ModelOptMxFp8Config); set the model dtype to bfloat16"
        return layouts.moe_shape_problem(self.layout, self.algo, e, i, h)

    def moe_stack_specs(self, container: str, e: int, i: int, h: int) -> dict[str, tuple]:
        """Output name -> spec of the packed stacks of one MoE layer."""
        specs = layouts.moe_packed_specs(self.layout, self.algo, e, i, h)
        return {f"{container}.{side}_{k}": v for side, d in specs.items() for k, v in d.items()}

    def pack_group(self, plain: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict[str, torch.Tensor]]:
        """Members of one fused group (module -> plain tensors) -> module -> tensors to write."""
        import torch

        from . import marlin

        sf = None
        if self.layout is Layout.MARLIN and isinstance(SCHEMES[self.algo], Nvfp4):  # NVFP4, W4A16_NVFP4
            sf = marlin.nvfp4_scale_factor([p["weight_scale"] for p in plain.values()], getattr(torch, self.act_dtype))
        return {m: layouts.pack(self.layout, self.algo, p, self.act_dtype, scale_factor=sf) for m, p in plain.items()}

    def pack_layer(self, container: str, experts: list[dict[str, dict[str, torch.Tensor]]]) -> dict[str, torch.Tensor]:
        """Plain outputs of every expert (``[{"gate": .., "up": .., "down": ..}, ...]``) -> packed stacks."""
        w13, w2 = _stack(experts, self.algo)
        packed = layouts.pack_moe(self.layout, self.algo, w13, w2)
        return {f"{container}.{side}_{k}": v for side, d in packed.items() for k, v in d.items() if k.endswith(self.suffix)}

    def metadata(self) -> dict:
        return layouts.layout_metadata(self.layout, self.act_dtype)


def _stack(experts: list[dict], algo: str) -> tuple[dict, dict]:
    """vLLM's FusedMoE stacks: w13 = [gate ; up] per expert along dim 1, w2 = down."""
    import torch

    def cat(key, e):
        return torch.cat([e["gate"][key], e["up"][key]])

    w13 = {"weight": torch.stack([cat("weight", e) for e in experts])}
    w2 = {"weight": torch.stack([e["down"]["weight"] for e in experts])}
    if algo == "FP8":
        w13["weight_scale"] = torch.stack([torch.stack([e["gate"]["weight_scale"], e["up"]["weight_scale"]]) for e in experts])
        w2["weight_scale"] = torch.stack([e["down"]["weight_scale"] for e in experts])
    elif algo == "MXFP8":  # e8m0 bytes [rows, K/32], stacked like the weights
        w13["weight_scale"] = torch.stack([cat("weight_scale", e) for e in experts])
        w2["weight_scale"] = torch.stack([e["down"]["weight_scale"] for e in experts])
    elif algo == "FP8_PB_WO":
        w13["weight_scale"] = torch.stack([cat("weight_scale", e)[:, 0, :, 0] for e in experts])
        w2["weight_scale"] = torch.stack([e["down"]["weight_scale"][:, 0, :, 0] for e in experts])
    else:  # NVFP4 family
        w13["weight_scale"] = torch.stack([cat("weight_scale", e) for e in experts])
        w13["weight_scale_2"] = torch.stack([torch.stack([e["gate"]["weight_scale_2"], e["up"]["weight_scale_2"]]) for e in experts])
        w2["weight_scale"] = torch.stack([e["down"]["weight_scale"] for e in experts])
        w2["weight_scale_2"] = torch.stack([e["down"]["weight_scale_2"] for e in experts])
    return w13, w2


def unstack(w13: torch.Tensor, w2: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Inverse of the stacking for weights: per expert ``{"gate", "up", "down"}`` plain weights."""
    i = w13.shape[1] // 2
    return [{"gate": w13[e, :i], "up": w13[e, i:], "down": w2[e]} for e in range(w13.shape[0])]
