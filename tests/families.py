"""Synthetic checkpoints for every recipe family, from name -> shape tables (bf16, random).

Each family function returns ``(config, {tensor name: shape})``; :func:`build` makes the tensors.
Shapes are small but keep every dimension a multiple of 128 where the real model's is, so the
same checkpoint converts with every algorithm.
"""

from __future__ import annotations

import torch

H, I, V, E, MI = 256, 512, 512, 4, 128


def _attn(p, q=H, kv=128, bias=False, qk_norm=False):
    t = {f"{p}.self_attn.q_proj.weight": (q, H), f"{p}.self_attn.k_proj.weight": (kv, H),
         f"{p}.self_attn.v_proj.weight": (kv, H), f"{p}.self_attn.o_proj.weight": (H, q)}
    if bias:
        t.update({f"{p}.self_attn.q_proj.bias": (q,), f"{p}.self_attn.k_proj.bias": (kv,), f"{p}.self_attn.v_proj.bias": (kv,)})
    if qk_norm:
        t.update({f"{p}.self_attn.q_norm.weight": (128,), f"{p}.self_attn.k_norm.weight": (128,)})
    return t


def _mlp(p, name="mlp", i=I):
    return {f"{p}.{name}.gate_proj.weight": (i, H), f"{p}.{name}.up_proj.weight": (i, H), f"{p}.{name}.down_proj.weight": (H, i)}


def _norms(p):
    return {f"{p}.input_layernorm.weight": (H,), f"{p}.post_attention_layernorm.weight": (H,)}


def _ends(prefix="model"):
    return {f"{prefix}.embed_tokens.weight": (V, H), f"{prefix}.norm.weight": (H,)}


def _cfg(model_type, layers=2, **kw):
    return {"model_type": model_type, "hidden_size": H, "num_hidden_layers": layers, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 128, "vocab_size": V, **kw}


def dense(model_type, bias=False, qk_norm=False):
    t = _ends()
    for n in range(2):
        p = f"model.layers.{n}"
        t.update(_norms(p) | _attn(p, bias=bias, qk_norm=qk_norm) | _mlp(p))
    t["lm_head.weight"] = (V, H)
    return _cfg(model_type), t


def mixtral():
    t = _ends()
    for n in range(2):
        p = f"model.layers.{n}"
        t.update(_norms(p) | _attn(p))
        t[f"{p}.block_sparse_moe.gate.weight"] = (E, H)
        for e in range(E):
            q = f"{p}.block_sparse_moe.experts.{e}"
            t.update({f"{q}.w1.weight": (MI, H), f"{q}.w3.weight": (MI, H), f"{q}.w2.weight": (H, MI)})
    t["lm_head.weight"] = (V, H)
    return _cfg("mixtral"), t


def qwen_moe(model_type, shared=False):
    t = _ends()
    for n in range(2):
        p = f"model.layers.{n}"
        t.update(_norms(p) | _attn(p, bias=model_type == "qwen2_moe", qk_norm=model_type == "qwen3_moe"))
        t[f"{p}.mlp.gate.weight"] = (E, H)
        for e in range(E):
            t.update(_mlp(p, f"mlp.experts.{e}", MI))
        if shared:
            t.update(_mlp(p, "mlp.shared_expert", I))
            t[f"{p}.mlp.shared_expert_gate.weight"] = (1, H)
    t["lm_head.weight"] = (V, H)
    return _cfg(model_type), t


def deepseek_v3():
    from quantize_cli.checkpoint.example_weights import deepseek_config, deepseek_tensors

    cfg = deepseek_config()
    return cfg, {k: tuple(v.shape) for k, v in deepseek_tensors(cfg).items()}


def gemma3():
    """Gemma 3 multimodal: language_model under a prefix, a vision tower and a projector."""
    t = {"language_model.model.embed_tokens.weight": (V, H), "language_model.model.norm.weight": (H,)}
    for n in range(2):
        p = f"language_model.model.layers.{n}"
        t.update(_norms(p) | _attn(p, qk_norm=True) | _mlp(p))
        t[f"{p}.pre_feedforward_layernorm.weight"] = (H,)
    for n in range(2):
        p = f"vision_tower.vision_model.encoder.layers.{n}"
        t.update({f"{p}.self_attn.q_proj.weight": (128, 128), f"{p}.self_attn.out_proj.weight": (128, 128),
                  f"{p}.mlp.fc1.weight": (256, 128), f"{p}.mlp.fc2.weight": (128, 256), f"{p}.layer_norm1.weight": (128,)})
    t["multi_modal_projector.mm_input_projection_weight"] = (128, H)
    return _cfg("gemma3", text_config={"num_hidden_layers": 2}), t


def phi3():
    t = _ends()
    for n in range(2):
        p = f"model.layers.{n}"
        t.update(_norms(p))
        t.update({f"{p}.self_attn.qkv_proj.weight": (H + 256, H), f"{p}.self_attn.o_proj.weight": (H, H),
                  f"{p}.mlp.gate_up_proj.weight": (2 * I, H), f"{p}.mlp.down_proj.weight": (H, I)})
    t["lm_head.weight"] = (V, H)
    return _cfg("phi3"), t


FAMILIES = {
    "llama": lambda: dense("llama"),
    "mistral": lambda: dense("mistral"),
    "qwen2": lambda: dense("qwen2", bias=True),
    "qwen3": lambda: dense("qwen3", qk_norm=True),
    "gemma2": lambda: dense("gemma2"),
    "mixtral": mixtral,
    "qwen2_moe": lambda: qwen_moe("qwen2_moe", shared=True),
    "qwen3_moe": lambda: qwen_moe("qwen3_moe"),
    "deepseek_v3": deepseek_v3,
    "gemma3": gemma3,
    "phi3": phi3,
}


def build(shapes: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight") or "layernorm" in name:
            out[name] = torch.ones(shape, dtype=torch.bfloat16)
        elif name.endswith("e_score_correction_bias"):
            out[name] = torch.zeros(shape, dtype=torch.float32)
        else:
            out[name] = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
    return out
