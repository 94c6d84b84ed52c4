"""What vLLM 0.33's compressed-tensors path does with each algorithm (the support matrix).

Learned from ``CompressedTensorsConfig._get_scheme_from_parts`` (Linears) and
``CompressedTensorsMoEMethod.get_moe_method`` (MoE layers), and checked by parsing our configs
with vLLM itself (bench/ct_vllm_decisions.py; its output is tests/golden/compressed_tensors/
vllm_decisions.json, and bench/ct_vllm_mixed_decisions.py for mixed precision). Every algorithm
we write in this format has a Linear and a MoE path, so every mix of them is served per layer.
Each compressed-tensors scheme names its own (``CtScheme.vllm_linear``, ``vllm_static``, ``vllm_moe``).
"""

from __future__ import annotations

from ..algorithms import is_expert_linear, is_experts_prefix
from ..modules.classify import LINEAR, ROUTER
from .ct_exclusions import ct_is_ignored

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
        s = plan.scheme_of(m.name)  # mixed precision: the module's own group
        linear, static, moe = s.vllm_linear, s.vllm_static, s.vllm_moe  # CtScheme's (compressed_tensors.CT_SCHEMES)
        name = m.name if is_experts_prefix(prefix) else prefix
        ignored = ct_is_ignored(name, plan.exclude_modules, packed)
        if is_expert_linear(m.name, prefix):
            out[prefix] = "UnquantizedFusedMoEMethod" if ignored else moe
        else:
            out[prefix] = "unquantized" if ignored else linear if static is None else f"{linear}(static_input={static})"
    return out
