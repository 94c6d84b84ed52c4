"""Activation and KV-cache quantization as vLLM 0.33 performs it at serve time (torch references).

Every rule maps a Linear input ``x [..., K]`` (any float dtype) to the fp32 values the quantized
GEMM multiplies, ``dequant(quant(x))``: the GEMM itself (exact products, fp32 accumulation, scales
applied after) is then ``F.linear(act(x), W_served)`` in fp32, W_served from ``weights.py``.
Each rule names the vLLM source it follows; where vLLM's CUDA kernel and its torch reference
differ (a reciprocal multiply vs a division), the CUDA kernel is followed, since it is what serves.

    rule          algorithms (format)                      scale
    fp8_tensor    FP8 (ModelOpt, compressed-tensors)        static input_scale, max over a fused layer
    fp8_token     FP8_PER_CHANNEL_PER_TOKEN / FP8_DYNAMIC   per token, amax / 448
    fp8_group     FP8_PB_WO / FP8_BLOCK                     per 1 x 128 group, amax / 448
    nvfp4         NVFP4 (W4A4)                              16-groups, e4m3 scales under 1 / input_scale
    mxfp8         MXFP8                                     32-groups, e8m0 (power-of-two) scales
    int8_token    INT8 as compressed-tensors W8A8           per token, amax / 127
    none          W4A16_NVFP4, INT8 (ModelOpt W8A16)        activations stay in the model dtype

KV cache (FP8): keys and values are stored as ``e4m3(k / k_scale)`` and read back times
``k_scale``; FlashAttention 3 (vLLM's default on Hopper) also takes the query in FP8, quantized
statically with ``q_scale`` (1.0 when the checkpoint has none): :func:`kv_fp8`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..algorithms import E2M1_MAX, E4M3_MAX, MX_BLOCK, NVFP4_GROUP

if TYPE_CHECKING:
    import torch

FP8_GROUP = 128  # FP8_PB_WO / FP8_BLOCK activations: one scale per 1 x 128 group
# csrc/quantization/w8a8/fp8/common.cu (min_scaling_factor<e4m3>): dynamic per-token scales are
# at least 1 / (448 * 512), so an all-zero token divides by a finite number.
FP8_MIN_SCALING_FACTOR = 1.0 / (E4M3_MAX * 512.0)
GROUP_EPS = 1e-10  # fp8_utils.per_token_group_quant_fp8(eps=1e-10): the smallest group amax
INT8_MAX = 127.0
KINDS = ("none", "fp8_tensor", "fp8_token", "fp8_group", "nvfp4", "mxfp8", "int8_token")


@dataclass(frozen=True)
class ActRule:
    """How one Linear's input is quantized at serve time.

    Attributes:
        kind: one of :data:`KINDS`.
        scale: the static scale the rule needs: ``fp8_tensor`` the input scale (max over the fused
            layer), ``nvfp4`` the activation global scale (ModelOpt: ``1 / max(input_scale)``,
            compressed-tensors: ``max(input_global_scale)``); None otherwise.
    """

    kind: str = "none"
    scale: float | None = None

    def describe(self) -> str:
        return self.kind if self.scale is None else f"{self.kind} (scale {self.scale:.6g})"


NONE = ActRule()


def quantize_activation(rule: ActRule, x: torch.Tensor) -> torch.Tensor:
    """``x [..., K]`` as the quantized GEMM sees it (fp32); ``none`` returns ``x`` in fp32."""
    if rule.kind == "none":
        return x.float()
    fn = _RULES[rule.kind]
    shape = x.shape
    out = fn(x.reshape(-1, shape[-1]).float(), rule.scale)
    return out.reshape(shape)


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    """Saturating round-to-nearest-even e4m3 (``__nv_cvt_float_to_fp8(..., __NV_SATFINITE)``), as fp32."""
    import torch

    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


def fp8_tensor(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Static per-tensor FP8: csrc/quantization/w8a8/fp8/common.cu ``static_scaled_fp8_quant``
    (``x * (1.0f / scale)``, then the saturating cast), the GEMM scaling by ``scale`` after."""
    import torch

    s = torch.tensor(scale, dtype=torch.float32, device=x.device)
    return _e4m3(x * (1.0 / s)) * s


def fp8_token(x: torch.Tensor, _scale=None) -> torch.Tensor:
    """Dynamic per-token FP8: csrc/.../fp8/common.cu ``dynamic_per_token_scaled_fp8_quant_kernel``:
    ``s = max(amax / 448, 1 / (448 * 512))``, ``q = e4m3(x / s)`` (a division here)."""
    s = (x.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).clamp(min=FP8_MIN_SCALING_FACTOR)
    return _e4m3(x / s) * s


def fp8_group(x: torch.Tensor, _scale=None, group: int = FP8_GROUP) -> torch.Tensor:
    """Dynamic 1 x 128 FP8 groups: csrc/quantization/w8a8/fp8/per_token_group_quant.cu
    (``absmax = max(eps, max |x|)``, ``s = absmax / 448``, ``q = e4m3(x / s)``), the path of
    ``fp8_utils.per_token_group_quant_fp8`` on CUDA without UE8M0 scales (Hopper; DeepGEMM on
    Blackwell rounds ``s`` up to a power of two instead)."""
    t, k = x.shape
    g = x.reshape(t, k // group, group)
    s = g.abs().amax(dim=-1, keepdim=True).clamp(min=GROUP_EPS) / E4M3_MAX
    return (_e4m3(g / s) * s).reshape(t, k)


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """``nvfp4_emulation_utils.cast_to_fp4``: magnitudes to E2M1 with its interval ends (ties to
    the even code: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4)."""
    import torch

    a = x.abs()
    out = torch.zeros_like(a)
    for lo, hi, v, closed in ((0.25, 0.75, 0.5, False), (0.75, 1.25, 1.0, True), (1.25, 1.75, 1.5, False),
                              (1.75, 2.5, 2.0, True), (2.5, 3.5, 3.0, False), (3.5, 5.0, 4.0, True)):
        inside = (a >= lo) & (a <= hi) if closed else (a > lo) & (a < hi)
        out = torch.where(inside, torch.full_like(a, v), out)
    out = torch.where(a > 5.0, torch.full_like(a, E2M1_MAX), out)
    return out * torch.sign(x)


def _reciprocal(x: torch.Tensor) -> torch.Tensor:
    """``nvfp4_emulation_utils.get_reciprocal``: ``1 / x`` with 0 -> 1e-8's reciprocal territory."""
    return 1.0 / (x + (x == 0) * 1e8)


def nvfp4(x: torch.Tensor, global_scale: float) -> torch.Tensor:
    """NVFP4 activations: ``nvfp4_emulation_utils.ref_nvfp4_quant_dequant`` with the global scale
    vLLM passes (``input_global_scale_inv``): per 16-group ``s = e4m3(g * (amax * (1/6)))``,
    ``q = E2M1(clamp(x * 1/(s * 1/g), +-6))``, dequantized as ``q * (s / g)``."""
    import torch

    t, k = x.shape
    gs = torch.tensor(global_scale, dtype=torch.float32, device=x.device)
    g = x.reshape(t, k // NVFP4_GROUP, NVFP4_GROUP)
    vec_max = g.abs().amax(dim=-1, keepdim=True)
    s = (gs * (vec_max * (1.0 / E2M1_MAX))).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()
    q = e2m1_round((g * _reciprocal(s * _reciprocal(gs))).clamp(-E2M1_MAX, E2M1_MAX))
    return (q * (s / gs)).reshape(t, k)


def mxfp8(x: torch.Tensor, _scale=None) -> torch.Tensor:
    """MXFP8 activations: ``mxfp8_utils._mxfp8_e4m3_quantize_torch`` (FlashInfer's kernel on
    Blackwell computes the same exponent): per 32-group ``e = clamp(ceil(log2(amax / 448)) + 127,
    0, 254)``, ``q = e4m3(x / 2^(e - 127))`` (clamped first: the cast would give NaN past 464)."""
    import torch

    t, k = x.shape
    g = x.reshape(t, k // MX_BLOCK, MX_BLOCK)
    amax = g.abs().amax(dim=-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)
    e = (torch.ceil(torch.log2(amax / E4M3_MAX)) + 127.0).clamp(0, 254)
    descale = torch.exp2(e - 127.0)
    return (_e4m3(g / descale) * descale).reshape(t, k)


def int8_token(x: torch.Tensor, _scale=None) -> torch.Tensor:
    """Dynamic per-token int8 (compressed-tensors W8A8): csrc/quantization/w8a8/int8/scaled_quant.cu
    ``dynamic_scaled_int8_quant_kernel``: ``s = amax / 127``, ``q = rint_sat(x * (127 / amax))``
    (an all-zero token gives 0)."""
    import torch

    amax = x.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(amax == 0, torch.zeros_like(amax), INT8_MAX / amax)
    q = torch.round(x * inv).clamp(-128, 127)
    return q * (amax / INT8_MAX)


def kv_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """FP8 KV cache: csrc/quantization/w8a8/fp8/nvidia/quant_utils.cuh ``scaled_vec_conversion``
    (``__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, E4M3)``), read back as ``q * scale``."""
    import torch

    s = torch.tensor(scale, dtype=torch.float32, device=x.device)
    return (_e4m3(x.float() / s) * s).to(x.dtype)


_RULES = {"fp8_tensor": fp8_tensor, "fp8_token": fp8_token, "fp8_group": fp8_group, "nvfp4": nvfp4,
          "mxfp8": mxfp8, "int8_token": int8_token}
