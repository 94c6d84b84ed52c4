"""A Llama-70B-shaped bf16 checkpoint for bench/devices_host.sh: hidden 8192, intermediate 28672,
8 KV heads, vocab 128256, `layers` of the 80 (141 GB at 80), in shards of three layers (~5 GB), made
by one process per GPU (random normal x 0.02 on the GPU, then ``safetensors`` to `folder`).

    python bench/devices_host_input.py /dev/shm/qin 80
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys

H, I, KV, VOCAB, PER_SHARD = 8192, 28672, 1024, 128256, 3
SHAPES = {"self_attn.q_proj.weight": (H, H), "self_attn.k_proj.weight": (KV, H), "self_attn.v_proj.weight": (KV, H),
          "self_attn.o_proj.weight": (H, H), "mlp.gate_proj.weight": (I, H), "mlp.up_proj.weight": (I, H),
          "mlp.down_proj.weight": (H, I), "input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,)}


def shard_tensors(s: int, shards: int, layers: int) -> list[tuple[str, tuple]]:
    names = [("model.embed_tokens.weight", (VOCAB, H))] if s == 0 else []
    for layer in range(s * PER_SHARD, min(layers, (s + 1) * PER_SHARD)):
        names += [(f"model.layers.{layer}.{k}", shp) for k, shp in SHAPES.items()]
    if s == shards - 1:
        names += [("model.norm.weight", (H,)), ("lm_head.weight", (VOCAB, H))]
    return names


def make_shard(args) -> dict:
    import torch
    from safetensors.torch import save_file

    folder, s, shards, layers = args
    dev = torch.device(f"cuda:{s % torch.cuda.device_count()}") if torch.cuda.is_available() else torch.device("cpu")
    gen = torch.Generator(device=dev).manual_seed(s)
    ts = {}
    for name, shape in shard_tensors(s, shards, layers):
        if len(shape) == 1:
            ts[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            ts[name] = (torch.randn(*shape, device=dev, generator=gen) * 0.02).to(torch.bfloat16).cpu()
    fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
    save_file(ts, os.path.join(folder, fn), metadata={"format": "pt"})
    return {k: fn for k in ts}


def main() -> None:
    folder, layers = sys.argv[1], int(sys.argv[2])
    if os.path.exists(os.path.join(folder, "config.json")):
        return
    os.makedirs(folder, exist_ok=True)
    shards = -(-layers // PER_SHARD)
    with mp.get_context("spawn").Pool(min(8, shards)) as pool:
        maps = pool.map(make_shard, [(folder, s, shards, layers) for s in range(shards)])
    wmap = {k: v for m in maps for k, v in m.items()}
    total = sum(os.path.getsize(os.path.join(folder, f)) for f in set(wmap.values()))
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": I,
           "num_hidden_layers": layers, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
           "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)


if __name__ == "__main__":
    main()
