"""vLLM's exclude_modules semantics (vLLM 0.33 ModelOptQuantConfigBase.is_layer_excluded), as a table."""

import pytest

from quantize_cli.modules.matching import MixedFusedShards, vllm_is_excluded, vllm_rewrite

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

CASES = [
    # (prefix, entries, excluded?)
    ("lm_head", ["lm_head"], True),
    ("model.layers.0.self_attn.o_proj", ["lm_head"], False),
    # fused layer: excluded iff every member is listed
    ("model.layers.0.self_attn.qkv_proj", ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj"], True),
    # ... or the fused name itself is listed
    ("model.layers.0.self_attn.qkv_proj", ["model.layers.0.self_attn.qkv_proj"], True),
    # legacy substring rule: layers.1 hits layers.10, mlp.gate hits mlp.gate_up_proj
    ("model.layers.10.mlp.down_proj", ["model.layers.1"], True),
    ("model.layers.0.mlp.gate_up_proj", ["model.layers.0.mlp.gate"], True),
    # fnmatch: * spans dots
    ("model.layers.3.mlp.down_proj", ["*down_proj"], True),
    ("model.layers.3.self_attn.qkv_proj", ["*q_proj"], False),
    ("model.visual.blocks.0.attn.qkv", ["model.visual*"], True),
    # one listed expert excludes the whole MoE layer
    ("model.layers.0.mlp.experts", ["model.layers.0.mlp.experts.3.gate_proj"], True),
    ("model.layers.1.mlp.experts", ["model.layers.0.mlp.experts.3.gate_proj"], False),
    ("model.layers.0.mlp.experts", ["model.layers.0.mlp.experts"], True),
]


@pytest.mark.parametrize("prefix,entries,expected", CASES)
def test_table(prefix, entries, expected):
    assert vllm_is_excluded(prefix, entries, PACKED) is expected


def test_partial_fused_group_raises_like_vllm():
    with pytest.raises(MixedFusedShards, match="some but not all shards"):
        vllm_is_excluded("model.layers.0.self_attn.qkv_proj", ["model.layers.0.self_attn.q_proj"], PACKED)


def test_rewrite_of_trailing_star():
    assert vllm_rewrite(["model.visual*", "mtp.*", "lm_head", "*"]) == ["model.visual", "model.visual.*", "mtp.*", "lm_head", "*"]


def test_empty_list_excludes_nothing():
    assert vllm_is_excluded("lm_head", [], PACKED) is False
