"""INT8 reference: symmetric per-output-row int8, written as ModelOpt ``W8A16`` (spec §2.6).

    scale = row amax / 127 (an all-zero row gets 1.0), fp32 [N]
    q     = clamp(round_half_even(w_fp32 / scale), -128, 127)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..algorithms import INT8_MAX
from .base import Scheme


@dataclass(frozen=True)
class Int8PerChannel(Scheme):
    """``INT8``: int8 ``weight [N, K]`` and fp32 ``weight_scale [N]``."""

    def outputs(self, shape):
        return {"weight": ("I8", tuple(shape)), "weight_scale": ("F32", (shape[0],))}

    def quantize(self, w, global_amax=None):
        import torch

        from .fp8 import _fp32
        from .numerics import block_amax, scale_from_amax

        scale = scale_from_amax(block_amax(w, (1, w.shape[1])), INT8_MAX)  # [N, 1]
        q = _fp32(w).div_(scale).round_().clamp_(-128, 127).to(torch.int8)
        return {"weight": q, "weight_scale": scale.reshape(-1)}

    def dequantize(self, q):
        return q["weight"].float() * q["weight_scale"][:, None]
