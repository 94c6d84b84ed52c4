"""Tiny transformers models saved in tmp_path (random weights, several shards) and an offline tokenizer."""

from __future__ import annotations

import os
from importlib import resources

import torch

VOCAB = 320


def tokenizer(folder: str) -> None:
    """A byte-level BPE tokenizer trained here on the shipped default text (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
    from transformers import PreTrainedTokenizerFast

    text = resources.files("quantize_cli.calibration").joinpath("default_calibration.txt").read_text(encoding="utf-8")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>").save_pretrained(folder)


def save(model, folder: str, shard: str = "40KB", with_tokenizer: bool = True) -> str:
    model.to(torch.bfloat16).save_pretrained(folder, max_shard_size=shard)
    if with_tokenizer:
        tokenizer(folder)
    assert sum(f.endswith(".safetensors") for f in os.listdir(folder)) > 1
    return folder


def llama(folder: str, seed: int = 0) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, tie_word_embeddings=False)
    return save(LlamaForCausalLM(cfg), folder)


def wide_llama(layers: int, seed: int):
    """An unsaved Llama whose Linears have K = 128 or 256 (whole INT4 groups of 128), with two
    outlier channels in every input norm, as real LLMs have."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.input_layernorm.weight[[3, 17]] *= 30
    return model


def qwen3_moe(folder: str, seed: int = 0) -> str:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, num_experts=8,
                         num_experts_per_tok=2, tie_word_embeddings=False)
    return save(Qwen3MoeForCausalLM(cfg), folder)


def bert(folder: str, seed: int = 0) -> str:
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB,
                     max_position_embeddings=128)
    return save(BertModel(cfg), folder, shard="30KB")


def deepseek_v3(folder: str, seed: int = 0) -> str:
    """MLA attention (q/kv LoRA projections), one dense layer then a routed-MoE layer with a shared expert."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    cfg = DeepseekV3Config(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                           first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                           num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1, q_lora_rank=32,
                           kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, vocab_size=VOCAB,
                           tie_word_embeddings=False)
    return save(DeepseekV3ForCausalLM(cfg), folder, with_tokenizer=False)


def gemma3_model(seed: int = 0, hidden: int = 64, intermediate: int = 128, window: int = 4):
    """An unsaved Gemma 3 text model: head_dim 32 != hidden / heads, q/k norms, a sliding layer whose
    window is shorter than the test samples then a full-attention one, query_pre_attn_scalar apart
    from head_dim, tied embeddings; its (1 + w) norms randomised (transformers inits them to 0),
    with outlier channels in the input and pre-MLP norms, as real LLMs have."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=32, vocab_size=VOCAB, sliding_window=window,
                           layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=24,
                           max_position_embeddings=256, tie_word_embeddings=True)
    model = Gemma3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape) * 0.3)
        for layer in model.model.layers:
            layer.input_layernorm.weight[[3, 17]] = 30.0
            layer.pre_feedforward_layernorm.weight[[5]] = 30.0
    return model


def gemma3(folder: str, seed: int = 0, **kw) -> str:
    return save(gemma3_model(seed, **kw), folder)


def fold_random_scales_keeps_logits(model, ids: list[int], check_maps=lambda maps, folded: None) -> dict:
    """Fold random positive scales (0.2..3.2) into every decoder block of the fp32 `model` along
    ``smooth.mappings(block, "awq")`` and assert the logits of `ids` unchanged (and the first norm
    changed). `check_maps(maps, folded_tensors)` sees each block's mappings and the tensors the fold
    wrote. Returns the state dict before the fold."""
    from quantize_cli.calibration import smooth

    tokens = torch.tensor([ids])
    with torch.no_grad():
        before = model(input_ids=tokens).logits
    g = torch.Generator().manual_seed(0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for i, block in enumerate(model.model.layers):
        maps = smooth.mappings(block, "awq", model.config.num_attention_heads)
        fold = smooth.Fold(block, f"model.layers.{i}", lambda name: state[name].clone())
        for m in maps:
            mod = smooth._get(block, m.prev)
            n = mod.out_features if isinstance(mod, torch.nn.Linear) else mod.weight.numel()
            fold.add(m, torch.rand(n, generator=g) * 3 + 0.2)
        folded = fold.tensors()
        check_maps(maps, folded)
        model.load_state_dict({**model.state_dict(), **folded})
    with torch.no_grad():
        after = model(input_ids=tokens).logits
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
    assert not torch.equal(model.model.layers[0].input_layernorm.weight, state["model.layers.0.input_layernorm.weight"])
    return state
