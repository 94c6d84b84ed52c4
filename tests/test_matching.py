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


def test_regex_entries_follow_compressed_tensors_match_name():
    """Issue 36 item 9: ``re:`` + a Python regex, anchored at the start as compressed-tensors' match_name."""
    from quantize_cli.modules.matching import match_reason, regex_problem

    assert match_reason("model.layers.0.self_attn.q_proj", r"re:.*self_attn\.(q|k)_proj$") == "regex"
    assert match_reason("model.layers.0.self_attn.v_proj", r"re:.*self_attn\.(q|k)_proj$") is None
    assert match_reason("model.layers.0.mlp.up_proj", "re:mlp") is None  # anchored: not a substring search
    assert vllm_rewrite(["re:.*proj*"]) == ["re:.*proj*"]  # vLLM's x* rewrite is for fnmatch entries only
    assert regex_problem("re:(") and "not a Python regular expression" in regex_problem("re:(")
    assert regex_problem("*.q_proj") is None


def test_regex_exclude_keeps_exactly_the_matching_modules(tmp_path):
    from quantize_cli.api import ConvertOptions
    from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors, write_checkpoint
    from quantize_cli.errors import UsageError
    from quantize_cli.plan.steps import check_options
    from tests.conftest import convert

    cfg = llama_config()
    src = write_checkpoint(str(tmp_path / "src"), llama_tensors(cfg), cfg)
    res = convert(src, str(tmp_path / "o"), algo="FP8_PB_WO", quiet=True, exclude=[r"re:.*layers\.1\.mlp\.(gate|up)_proj"])
    kept = sorted(m.name for m in res.plan.modules.values() if m.kind == "linear" and not m.quantize)
    assert kept == ["lm_head", "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"], kept  # lm_head: the recipe
    with pytest.raises(UsageError, match="not a Python regular expression"):
        check_options(ConvertOptions(src, str(tmp_path / "o2"), algo="FP8", exclude=["re:("]))
