"""Activation quantization as the serving engines apply it, for the smoothing search's loss.

The search (:mod:`.smooth`) scores a candidate by the output error of the layer *as served*:
quantized weights and, for formats that quantize activations, quantized inputs. Each rule below
is the engine's arithmetic in fp32 (vLLM's: static per-tensor FP8 ``x / input_scale``; NVFP4's
``scaled_fp4_quant`` with the global scale ``1 / input_scale`` and e4m3 scales per 16; dynamic
per-token FP8 / INT8; FP8 1x128 groups; MX e8m0 per 32). ``x [..., K]``; `amax` is the static
input amax the written scale will be made from (calibration: max |x| over the data).

| algorithm | ModelOpt | compressed-tensors |
|---|---|---|
| FP8 | static per-tensor FP8 | same |
| NVFP4 | static global, dynamic 16-groups | same |
| FP8_PER_CHANNEL_PER_TOKEN | dynamic per token FP8 | same |
| FP8_PB_WO | dynamic 1x128 FP8 groups | same |
| MXFP8 | dynamic MX 32-groups | same |
| INT8 | none (W8A16) | dynamic per token INT8 (W8A8) |
| W4A16_NVFP4 | none | none |
"""

from __future__ import annotations

from typing import Callable

import torch

from ..algorithms import E2M1_MAX, E4M3_MAX, INT8_MAX, MX_BLOCK, NVFP4_GROUP
from ..schemes.fp8 import fp8_cast

ActQuant = Callable[[torch.Tensor, float], torch.Tensor]


def _groups(x: torch.Tensor, g: int) -> torch.Tensor:
    return x.reshape(*x.shape[:-1], x.shape[-1] // g, g)


def fp8_static(x: torch.Tensor, amax: float) -> torch.Tensor:
    s = max(amax, 1e-12) / E4M3_MAX
    return fp8_cast(x / s).float() * s


def e2m1_round(q: torch.Tensor) -> torch.Tensor:
    """fp32 `q` rounded to the nearest E2M1 value, ties to the even code, saturating at 6: the values
    of ``e2m1_values(e2m1_codes(q))`` (tested equal) in a few float operations. Below 2 the step is
    0.5 and ``round`` (half to even) of 2|q| picks the even code; from 2 to 4 the step is 1; above,
    4 up to the tie at 5 (even code), then 6."""
    a = q.abs()
    v = torch.where(a < 2, torch.round(a * 2) * 0.5, torch.where(a < 4, torch.round(a), torch.where(a <= 5, 4.0, 6.0)))
    return torch.copysign(v, q)


def nvfp4(x: torch.Tensor, amax: float) -> torch.Tensor:
    gs = E4M3_MAX * E2M1_MAX / max(amax, 1e-12)  # 1 / input_scale
    g = _groups(x, NVFP4_GROUP)
    bs = (g.abs().amax(-1, keepdim=True) * gs / E2M1_MAX).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).float()
    q = torch.where(bs > 0, g * gs / bs.clamp(min=1e-30), torch.zeros_like(g))
    return (e2m1_round(q) * bs / gs).reshape(x.shape)


def _dynamic_fp8(x: torch.Tensor, group: int | None) -> torch.Tensor:
    g = _groups(x, group) if group else x.unsqueeze(-2)
    s = (g.abs().amax(-1, keepdim=True) / E4M3_MAX).clamp(min=1e-12)
    return (fp8_cast(g / s).float() * s).reshape(x.shape)


def fp8_per_token(x: torch.Tensor, amax: float) -> torch.Tensor:
    return _dynamic_fp8(x, None)


def fp8_groups(x: torch.Tensor, amax: float) -> torch.Tensor:
    return _dynamic_fp8(x, 128)


def int8_per_token(x: torch.Tensor, amax: float) -> torch.Tensor:
    s = (x.abs().amax(-1, keepdim=True) / INT8_MAX).clamp(min=1e-12)
    return (x / s).round().clamp(-128, 127) * s


def mx(x: torch.Tensor, amax: float) -> torch.Tensor:
    from ..schemes.mxfp8 import e8m0_exponent, pow2

    g = _groups(x, MX_BLOCK)
    e = e8m0_exponent((g.abs().amax(-1, keepdim=True) / E4M3_MAX).float())
    s = pow2(e)
    return (fp8_cast(g / s).float() * s).reshape(x.shape)


# eval/activations.KINDS -> the rule here (the scheme says which kind it serves with: Scheme.act_kind)
_BY_KIND: dict[str, ActQuant] = {"fp8_tensor": fp8_static, "nvfp4": nvfp4, "fp8_token": fp8_per_token,
                                 "fp8_group": fp8_groups, "mxfp8": mx, "int8_token": int8_per_token}


def activation_quant(scheme) -> ActQuant | None:
    """The serve-time activation quantization of `scheme` (None: activations stay bf16)."""
    kind = scheme.act_kind
    return None if kind is None else _BY_KIND[kind]


__all__ = ["activation_quant", "e2m1_round", "fp8_static", "nvfp4", "fp8_per_token", "fp8_groups", "int8_per_token", "mx"]
