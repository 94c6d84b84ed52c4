"""What vLLM 0.33's compressed-tensors path does with each algorithm (the support matrix).

Learned from ``CompressedTensorsConfig._get_scheme_from_parts`` (Linears) and
``CompressedTensorsMoEMethod.get_moe_method`` (MoE layers), and checked by parsing our configs
with vLLM itself (bench/ct_vllm_decisions.py; its output is tests/golden/compressed_tensors/
vllm_decisions.json, and bench/ct_vllm_mixed_decisions.py for mixed precision). Every algorithm
we write in this format has a Linear and a MoE path, so every mix of them is served per layer.
"""

from __future__ import annotations

from ..algorithms import is_expert_linear, is_experts_prefix
from ..modules.classify import LINEAR, ROUTER
from .ct_exclusions import ct_is_ignored

# algo -> (Linear scheme, static input scale? (None: the scheme has no such flag), MoE method)
VLLM_CT = {
    "FP8": ("CompressedTensorsW8A8Fp8", True, "CompressedTensorsW8A8Fp8MoEMethod"),
    "FP8_PER_CHANNEL_PER_TOKEN": ("CompressedTensorsW8A8Fp8", False, "CompressedTensorsW8A8Fp8MoEMethod"),
    "FP8_PB_WO": ("CompressedTensorsW8A8Fp8", False, "CompressedTensorsW8A8Fp8MoEMethod"),
    "NVFP4": ("CompressedTensorsW4A4Fp4", True, "CompressedTensorsW4A4Nvfp4MoEMethod"),
    "W4A16_NVFP4": ("CompressedTensorsW4A4Fp4", False, "CompressedTensorsW4A4Nvfp4MoEMethod"),
    "INT8": ("CompressedTensorsW8A8Int8", False, "CompressedTensorsW8A8Int8MoEMethod"),
    "MXFP8": ("CompressedTensorsW8A8Mxfp8", None, "CompressedTensorsW8A8Mxfp8MoEMethod"),  # no static-input flag
    "INT4": ("CompressedTensorsWNA16", None, "CompressedTensorsWNA16MoEMethod"),  # Marlin / Machete / CUTLASS W4A16
    "INT4_ASYM": ("CompressedTensorsWNA16", None, "CompressedTensorsWNA16MoEMethod"),  # uint4 with zero points
}


def vllm_schemes(plan) -> dict[str, str]:
    """vLLM module prefix -> the compressed-tensors method vLLM picks for a compressed-tensors plan.

    Example: ``{"model.layers.0.self_attn.qkv_proj": "CompressedTensorsW8A8Int8(static_input=False)",
    "lm_head": "unquantized"}``.
    """
    packed = dict(plan.recipe.fused)
    out: dict[str, str] = {}
    for m in plan.modules.values():
        if m.kind not in (LINEAR, ROUTER):
            continue
        prefix = m.vllm_prefix
        if prefix in out:
            continue
        linear, static, moe = VLLM_CT[plan.scheme_of(m.name).algo]  # mixed precision: the module's own group
        name = m.name if is_experts_prefix(prefix) else prefix
        ignored = ct_is_ignored(name, plan.exclude_modules, packed)
        if is_expert_linear(m.name, prefix):
            out[prefix] = "UnquantizedFusedMoEMethod" if ignored else moe
        else:
            out[prefix] = "unquantized" if ignored else linear if static is None else f"{linear}(static_input={static})"
    return out
