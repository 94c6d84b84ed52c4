"""Embedded example checkpoints (``SRC = example:NAME``), generated on first use, deterministic.

They let a newcomer run a real conversion with no download, and give the tests synthetic
checkpoints of the shapes people quantize: ``tiny-llama`` (dense), ``tiny-qwen3-moe`` (per-expert
MoE), ``tiny-qwen3-moe-fused`` (the same weights as transformers-5 fused 3-D experts) and
``tiny-deepseek`` (MLA + MoE + shared experts + an MTP layer). Generated with a fixed
seed into ``$XDG_CACHE_HOME/quantize/examples/`` (or ``~/.cache/...``) and reused afterwards;
where they live (and resolving ``example:NAME``) is :mod:`.examples`, which needs no torch.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file



def llama_config(hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2, vocab=512) -> dict:
    """A Llama ``config.json`` dict with the given sizes."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "vocab_size": vocab,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def llama_tensors(config: dict, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Random Llama weights for `config` (normal, std 0.02; norms 1.0), in module order."""
    rnd = _rnd(torch.Generator().manual_seed(seed), dtype)
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    hd = config.get("head_dim", h // config["num_attention_heads"])
    out = {"model.embed_tokens.weight": rnd(v, h)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}"
        _attention(out, p, {**config, "head_dim": hd}, rnd, dtype)
        out[f"{p}.mlp.gate_proj.weight"] = rnd(i, h)
        out[f"{p}.mlp.up_proj.weight"] = rnd(i, h)
        out[f"{p}.mlp.down_proj.weight"] = rnd(h, i)
    out["model.norm.weight"] = torch.ones(h, dtype=dtype)
    out["lm_head.weight"] = rnd(v, h)
    return out


def write_checkpoint(root: str, tensors: dict[str, torch.Tensor], config: dict, shards: int = 1, sidecars: bool = True) -> str:
    """Write `tensors` as a Hugging Face checkpoint in `root`, split into `shards` files in order.

    With more than one shard an index is written, as ``save_pretrained`` does. Returns `root`.
    """
    os.makedirs(root, exist_ok=True)
    names = list(tensors)
    shards = max(1, min(shards, len(names)))
    per = -(-len(names) // shards)
    groups = [names[k : k + per] for k in range(0, len(names), per)]
    weight_map = {}
    for n, group in enumerate(groups, 1):
        fname = "model.safetensors" if len(groups) == 1 else f"model-{n:05d}-of-{len(groups):05d}.safetensors"
        save_file({k: tensors[k].contiguous() for k in group}, os.path.join(root, fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in group})
    if len(groups) > 1:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        with open(os.path.join(root, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if sidecars:
        with open(os.path.join(root, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, f, indent=2)
        with open(os.path.join(root, "tokenizer_config.json"), "w") as f:
            json.dump({"model_max_length": 2048, "bos_token": "<s>", "eos_token": "</s>"}, f, indent=2)
    return root


def _rnd(g: torch.Generator, dtype: torch.dtype):
    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(dtype)

    return rnd


def _attention(out: dict, p: str, cfg: dict, rnd, dtype) -> None:
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out[f"{p}.input_layernorm.weight"] = torch.ones(h, dtype=dtype)
    out[f"{p}.self_attn.q_proj.weight"] = rnd(q, h)
    out[f"{p}.self_attn.k_proj.weight"] = rnd(kv, h)
    out[f"{p}.self_attn.v_proj.weight"] = rnd(kv, h)
    out[f"{p}.self_attn.o_proj.weight"] = rnd(h, q)
    out[f"{p}.post_attention_layernorm.weight"] = torch.ones(h, dtype=dtype)


def qwen3_moe_config(hidden=256, moe_intermediate=128, experts=4, layers=2, vocab=512) -> dict:
    """A Qwen3-MoE ``config.json`` dict (every layer sparse)."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": hidden,
        "intermediate_size": 2 * hidden, "moe_intermediate_size": moe_intermediate, "num_experts": experts,
        "num_experts_per_tok": 2, "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": hidden // 4, "vocab_size": vocab, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def qwen3_moe_tensors(cfg: dict, seed: int = 0, fused_experts: bool = False, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """Qwen3-MoE weights: per-expert ``mlp.experts.{e}.*_proj`` or, with `fused_experts`, the
    transformers-5 3-D ``mlp.experts.gate_up_proj [E, 2I, H]`` / ``down_proj [E, H, I]`` (same values)."""
    g = torch.Generator().manual_seed(seed)
    rnd = _rnd(g, dtype)
    h, i, n_e, v = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts"], cfg["vocab_size"]
    out = {"model.embed_tokens.weight": rnd(v, h)}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}"
        _attention(out, p, cfg, rnd, dtype)
        out[f"{p}.self_attn.q_norm.weight"] = torch.ones(cfg["head_dim"], dtype=dtype)
        out[f"{p}.self_attn.k_norm.weight"] = torch.ones(cfg["head_dim"], dtype=dtype)
        out[f"{p}.mlp.gate.weight"] = rnd(n_e, h)
        gate = [rnd(i, h) * (1 + e) for e in range(n_e)]  # experts of clearly different magnitude
        up = [rnd(i, h) * (2 + e) for e in range(n_e)]
        down = [rnd(h, i) for _ in range(n_e)]
        if fused_experts:
            out[f"{p}.mlp.experts.gate_up_proj"] = torch.stack([torch.cat([a, b]) for a, b in zip(gate, up)])
            out[f"{p}.mlp.experts.down_proj"] = torch.stack(down)
        else:
            for e in range(n_e):
                out[f"{p}.mlp.experts.{e}.gate_proj.weight"] = gate[e]
                out[f"{p}.mlp.experts.{e}.up_proj.weight"] = up[e]
                out[f"{p}.mlp.experts.{e}.down_proj.weight"] = down[e]
    out["model.norm.weight"] = torch.ones(h, dtype=dtype)
    out["lm_head.weight"] = rnd(v, h)
    return out


def deepseek_config(hidden=256, layers=2, experts=4, vocab=512) -> dict:
    """A DeepSeek-V3 ``config.json`` dict: MLA attention, layer 0 dense, the rest MoE, one MTP layer."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": hidden,
        "intermediate_size": 2 * hidden, "moe_intermediate_size": 128, "n_routed_experts": experts,
        "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "num_hidden_layers": layers,
        # transformers' DeepseekV3 router groups experts by n_group / topk_group (defaults 8 / 4 reshape 4
        # experts into 8 groups of 0 and crash every forward): one group, as a model without grouping
        "n_group": 1, "topk_group": 1,
        "num_nextn_predict_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 128,
        "kv_lora_rank": 128, "qk_rope_head_dim": 64, "qk_nope_head_dim": 64, "v_head_dim": 64,
        "vocab_size": vocab, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }


def deepseek_tensors(cfg: dict, seed: int = 0, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """DeepSeek-V3-style weights, including the MTP layer at index ``num_hidden_layers``."""
    g = torch.Generator().manual_seed(seed)
    rnd = _rnd(g, dtype)
    h, v, n_e = cfg["hidden_size"], cfg["vocab_size"], cfg["n_routed_experts"]
    heads, ql, kl = cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    rope, nope, vd, mi = cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["moe_intermediate_size"]
    out = {"model.embed_tokens.weight": rnd(v, h)}
    for n in range(cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]):
        p = f"model.layers.{n}"
        out[f"{p}.input_layernorm.weight"] = torch.ones(h, dtype=dtype)
        a = f"{p}.self_attn"
        out[f"{a}.q_a_proj.weight"] = rnd(ql, h)
        out[f"{a}.q_a_layernorm.weight"] = torch.ones(ql, dtype=dtype)
        out[f"{a}.q_b_proj.weight"] = rnd(heads * (nope + rope), ql)
        out[f"{a}.kv_a_proj_with_mqa.weight"] = rnd(kl + rope, h) * 3
        out[f"{a}.kv_a_layernorm.weight"] = torch.ones(kl, dtype=dtype)
        out[f"{a}.kv_b_proj.weight"] = rnd(heads * (nope + vd), kl)
        out[f"{a}.o_proj.weight"] = rnd(h, heads * vd)
        out[f"{p}.post_attention_layernorm.weight"] = torch.ones(h, dtype=dtype)
        if n < cfg["first_k_dense_replace"]:
            out[f"{p}.mlp.gate_proj.weight"] = rnd(cfg["intermediate_size"], h)
            out[f"{p}.mlp.up_proj.weight"] = rnd(cfg["intermediate_size"], h)
            out[f"{p}.mlp.down_proj.weight"] = rnd(h, cfg["intermediate_size"])
        else:
            out[f"{p}.mlp.gate.weight"] = rnd(n_e, h)
            out[f"{p}.mlp.gate.e_score_correction_bias"] = torch.linspace(-1, 1, n_e, dtype=torch.float32)
            for e in range(n_e):
                out[f"{p}.mlp.experts.{e}.gate_proj.weight"] = rnd(mi, h)
                out[f"{p}.mlp.experts.{e}.up_proj.weight"] = rnd(mi, h) * 2
                out[f"{p}.mlp.experts.{e}.down_proj.weight"] = rnd(h, mi)
            for proj, shape in (("gate_proj", (mi, h)), ("up_proj", (mi, h)), ("down_proj", (h, mi))):
                out[f"{p}.mlp.shared_experts.{proj}.weight"] = rnd(*shape)
        if n >= cfg["num_hidden_layers"]:  # the MTP block's own extras
            out[f"{p}.enorm.weight"] = torch.ones(h, dtype=dtype)
            out[f"{p}.hnorm.weight"] = torch.ones(h, dtype=dtype)
            out[f"{p}.eh_proj.weight"] = rnd(h, 2 * h)
            out[f"{p}.shared_head.norm.weight"] = torch.ones(h, dtype=dtype)
            out[f"{p}.shared_head.head.weight"] = rnd(v, h)
    out["model.norm.weight"] = torch.ones(h, dtype=dtype)
    out["lm_head.weight"] = rnd(v, h)
    return out


def _with_tokenizer(write):
    """An example generator that also ships the examples' tokenizer (example_tokenizer.py): the
    advice `calibrate with --calib-data default` works on the examples too."""
    from .example_tokenizer import copy_into

    def make(root: str) -> str:
        write(root)
        copy_into(root)
        return root

    return make


EXAMPLES = {
    "tiny-llama": _with_tokenizer(lambda root: write_checkpoint(root, llama_tensors(llama_config()), llama_config(), shards=2)),
    "tiny-qwen3-moe": _with_tokenizer(
        lambda root: write_checkpoint(root, qwen3_moe_tensors(qwen3_moe_config()), qwen3_moe_config(), shards=2)),
    "tiny-qwen3-moe-fused": _with_tokenizer(lambda root: write_checkpoint(
        root, qwen3_moe_tensors(qwen3_moe_config(), fused_experts=True), qwen3_moe_config(), shards=2)),
    "tiny-deepseek": _with_tokenizer(
        lambda root: write_checkpoint(root, deepseek_tensors(deepseek_config()), deepseek_config(), shards=3)),
}
