"""Embedded example checkpoints (``SRC = example:NAME``), generated on first use, deterministic.

They let a newcomer run a real conversion with no download, and give the tests synthetic
checkpoints of the shapes people quantize: ``tiny-llama`` (dense, 2 shards). Generated with a fixed
seed into ``$XDG_CACHE_HOME/quantize/examples/`` (or ``~/.cache/...``) and reused afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import torch
from safetensors.torch import save_file

from .errors import SourceError

EXAMPLE_VERSION = 1


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
    g = torch.Generator().manual_seed(seed)
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    hd = config.get("head_dim", h // config["num_attention_heads"])
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(dtype)

    out = {"model.embed_tokens.weight": rnd(v, h)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}"
        out[f"{p}.input_layernorm.weight"] = torch.ones(h, dtype=dtype)
        out[f"{p}.self_attn.q_proj.weight"] = rnd(q, h)
        out[f"{p}.self_attn.k_proj.weight"] = rnd(kv, h)
        out[f"{p}.self_attn.v_proj.weight"] = rnd(kv, h)
        out[f"{p}.self_attn.o_proj.weight"] = rnd(h, q)
        out[f"{p}.post_attention_layernorm.weight"] = torch.ones(h, dtype=dtype)
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


EXAMPLES = {
    "tiny-llama": lambda root: write_checkpoint(root, llama_tensors(llama_config()), llama_config(), shards=2),
}


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "quantize", "examples")


def example_path(name: str) -> str:
    """The folder of example `name`, generated on first use (atomically, so races are harmless)."""
    if name not in EXAMPLES:
        raise SourceError(f"example:{name}: no such example; available: {', '.join('example:' + n for n in EXAMPLES)}")
    final = os.path.join(_cache_dir(), f"{name}-v{EXAMPLE_VERSION}")
    if os.path.isdir(final):
        return final
    os.makedirs(_cache_dir(), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=_cache_dir())
    try:
        EXAMPLES[name](tmp)
        os.rename(tmp, final)
    except OSError:
        if not os.path.isdir(final):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
