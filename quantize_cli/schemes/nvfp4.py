"""NVFP4 reference: E2M1 values in 16-element groups, e4m3 group scales, fp32 global (spec §2.4).

    weight_scale_2 = gamax / (6 * 448)                 gamax: max |w| over the fused group
    bs   = block_amax / (6 * weight_scale_2)           fp32; an all-zero block gets 1.0
    bs8  = e4m3(clamp(bs, 2^-9, 448))                  weight_scale [N, K/16], linear (not swizzled)
    q    = w_fp32 / (float(bs8) * weight_scale_2)      rounded to E2M1, ties to the even code
    byte j of a row = nibble(2j) | nibble(2j+1) << 4   weight uint8 [N, K/2]

ModelOpt's order of operations is followed exactly (a product then one division), which is what
makes the output byte-identical to its exporter. An all-zero tensor or fused group has gamax 0;
like ModelOpt's export_amax it is treated as amax = 6 (E2M1's max), so weight_scale_2 = 1/448
and every block scale is 1.0: no NaN, no Inf, and all-zero payload.

torch is imported inside the numeric functions only (planning imports no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..algorithms import E2M1_MAX, E4M3_MAX, NVFP4_GROUP, NVFP4_SCALE_MIN
from .base import Scheme, Spec, k_group_problem

if TYPE_CHECKING:
    import torch


def global_scale(gamax: torch.Tensor) -> torch.Tensor:
    """0-d fp32 ``weight_scale_2 = gamax / 2688`` (gamax 0 counts as 6, see the module doc)."""
    import torch

    from .numerics import div_exact

    gamax = gamax.float()
    gamax = torch.where(gamax == 0, torch.full_like(gamax, E2M1_MAX), gamax)
    return div_exact(gamax, E2M1_MAX * E4M3_MAX)


def block_scales(w: torch.Tensor, wsf2: torch.Tensor) -> torch.Tensor:
    """e4m3 ``[N, K/16]`` group scales of `w` ``[N, K]`` against the global scale `wsf2`."""
    import torch

    from .numerics import block_amax

    bs = block_amax(w, (1, NVFP4_GROUP)) / (E2M1_MAX * wsf2)
    bs = torch.where(bs == 0, torch.ones_like(bs), bs)
    return bs.clamp(NVFP4_SCALE_MIN, E4M3_MAX).to(torch.float8_e4m3fn)


@dataclass(frozen=True)
class Nvfp4(Scheme):
    """``NVFP4`` (static 0-d ``input_scale``) and ``W4A16_NVFP4`` (none): same weight tensors."""

    global_scale_key = "weight_scale_2"
    bits = 4
    modelopt_single_group = True

    def modelopt_group(self, group_size):
        w = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": group_size or NVFP4_GROUP}
        # W4A16_NVFP4 (no static input scale): weights only
        return {"weights": w} if self.static_input_scale is None else {"input_activations": dict(w), "weights": dict(w)}

    def shape_problem(self, shape):
        return super().shape_problem(shape) or k_group_problem(shape, NVFP4_GROUP, "NVFP4 groups")

    def logical_shape(self, stored):
        return (stored[0], 2 * stored[1])  # two E2M1 codes per byte

    def outputs(self, shape):
        n, k = shape
        out: dict[str, Spec] = {
            "weight": ("U8", (n, k // 2)),
            "weight_scale": ("F8_E4M3", (n, k // NVFP4_GROUP)),
            "weight_scale_2": ("F32", ()),
        }
        if self.static_input_scale is not None:
            out["input_scale"] = ("F32", ())
        return out

    def quantize(self, w, global_amax=None):
        from .fp8 import _fp32
        from .numerics import e2m1_codes, pack_nibbles

        gamax = self.global_amax(w) if global_amax is None else global_amax
        wsf2 = global_scale(gamax.to(w.device))
        bs8 = block_scales(w, wsf2)
        n, k = w.shape
        denom = bs8.float() * wsf2  # [N, K/16]
        q = _fp32(w).reshape(n, k // NVFP4_GROUP, NVFP4_GROUP).div_(denom[:, :, None]).reshape(n, k)
        out = {"weight": pack_nibbles(e2m1_codes(q)), "weight_scale": bs8, "weight_scale_2": wsf2}
        if self.static_input_scale is not None:
            out["input_scale"] = self.input_scale_tensor
        return out

    def dequantize(self, q):
        from .numerics import e2m1_values, unpack_nibbles

        vals = e2m1_values(unpack_nibbles(q["weight"]))
        n, k = vals.shape
        s = q["weight_scale"].float() * q["weight_scale_2"].to(vals.device)
        return (vals.reshape(n, k // NVFP4_GROUP, NVFP4_GROUP) * s[:, :, None]).reshape(n, k)
