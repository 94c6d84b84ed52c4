"""The plan: decisions per module, fused groups, outputs, problems, from headers alone."""

import pytest
import torch

from quantize_cli.api import prepare
from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors
from quantize_cli.plan.build import natural_key, parse_size


def test_llama_decisions_and_groups(tiny_llama):
    plan = prepare(tiny_llama, "NVFP4")
    d = {m.name: (m.kind, m.quantize) for m in plan.modules.values()}
    assert d["lm_head"] == ("linear", False)
    assert d["model.embed_tokens"] == ("embedding", False)
    assert d["model.norm"] == ("norm", False)
    assert d["model.layers.0.self_attn.q_proj"] == ("linear", True)
    assert plan.groups["model.layers.1.self_attn.qkv_proj"] == [f"model.layers.1.self_attn.{p}_proj" for p in "qkv"]
    assert plan.groups["model.layers.0.mlp.gate_up_proj"] == ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"]
    assert plan.exclude_modules == ["lm_head", "model.embed_tokens"]
    assert not plan.problems
    # members of a fused group are one task (one shared global amax), even across shards
    tasks = [t for t in plan.tasks if t.kind == "quantize" and t.group == "model.layers.0.self_attn.qkv_proj"]
    assert len(tasks) == 1 and len(tasks[0].members) == 3


@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
def test_a_tied_lm_head_is_listed_as_kept(make_checkpoint, fmt):
    """A decoder tying its head to the embeddings has no lm_head tensor, but the loaded model has the
    Linear: both formats list it (ModelOpt 0.47 and llm-compressor 0.14 do, for Gemma 3)."""
    cfg = llama_config(layers=1)
    cfg["tie_word_embeddings"] = True
    tied = {k: v for k, v in llama_tensors(cfg).items() if k != "lm_head.weight"}
    plan = prepare(make_checkpoint(tied, cfg), "FP8_PB_WO", format=fmt)
    assert "lm_head" in plan.exclude_modules and "lm_head" not in plan.modules
    assert not plan.problems
    # an encoder (no LM head class) gets no such entry
    enc = make_checkpoint(tied, {**cfg, "architectures": ["LlamaModel"]}, name="enc")
    assert "lm_head" not in prepare(enc, "FP8_PB_WO", format=fmt).exclude_modules


def test_outputs_have_the_spec_names_dtypes_shapes(tiny_llama):
    o = prepare(tiny_llama, "FP8_PB_WO").outputs
    assert (o["model.layers.0.mlp.down_proj.weight"].dtype, o["model.layers.0.mlp.down_proj.weight"].shape) == ("F8_E4M3", (256, 512))
    assert o["model.layers.0.mlp.down_proj.weight_scale"].shape == (2, 1, 4, 1)
    assert "model.layers.0.mlp.down_proj.input_scale" not in o
    o = prepare(tiny_llama, "FP8").outputs
    assert o["model.layers.0.mlp.down_proj.input_scale"].shape == ()
    o = prepare(tiny_llama, "NVFP4").outputs
    assert o["model.layers.0.mlp.down_proj.weight"].shape == (256, 256) and o["model.layers.0.mlp.down_proj.weight"].dtype == "U8"
    assert o["model.layers.0.mlp.down_proj.weight_scale"].shape == (256, 32)
    assert o["lm_head.weight"].dtype == "BF16"


def test_untakeable_shapes_are_all_reported_with_the_fix(make_checkpoint):
    cfg = llama_config(hidden=192, intermediate=320)  # not multiples of 128
    plan = prepare(make_checkpoint(llama_tensors(cfg), cfg), "FP8_PB_WO")
    assert len(plan.problems) == 14  # every quantized Linear of both layers, at once
    assert all("--exclude" in p and "divisible by 128" in p for p in plan.problems)


def test_partial_fused_exclusion_is_a_problem(tiny_llama):
    plan = prepare(tiny_llama, "NVFP4", exclude=["model.layers.0.self_attn.q_proj"])
    assert any("qkv_proj" in p and "exclude all members" in p for p in plan.problems)


def test_excluding_a_whole_fused_group_by_its_vllm_name(tiny_llama):
    plan = prepare(tiny_llama, "NVFP4", exclude=["model.layers.0.self_attn.qkv_proj"])
    assert not plan.problems
    assert {f"model.layers.0.self_attn.{p}_proj" for p in "qkv"} <= set(plan.exclude_modules)


def test_user_patterns_use_vllm_semantics_and_unmatched_warns(tiny_llama):
    plan = prepare(tiny_llama, "FP8_PB_WO", exclude=["*down_proj", "nothing.matches.this"])
    assert not plan.modules["model.layers.1.mlp.down_proj"].quantize
    assert "model.layers.1.mlp.down_proj" in plan.exclude_modules
    assert any("nothing.matches.this" in w for w in plan.warnings)


def test_substring_trap_in_written_exclusions_is_refused(make_checkpoint):
    """A kept module whose exact name is a substring of a quantized one: vLLM would skip both."""
    cfg = llama_config()
    t = llama_tensors(cfg)
    t["model.layers.0.mlp.gate.weight"] = torch.zeros(8, 256, dtype=torch.bfloat16)  # a router beside gate_up
    plan = prepare(make_checkpoint(t, cfg), "FP8_PB_WO")
    assert any("model.layers.0.mlp.gate_up_proj" in p and "substring" in p for p in plan.problems)


def test_mtp_layer_and_vision_tower_are_kept_subtrees(make_checkpoint):
    cfg = llama_config(layers=1)
    t = llama_tensors(llama_config(layers=2))  # layer 1 is beyond num_hidden_layers: an MTP layer
    t["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(384, 128, dtype=torch.bfloat16)
    plan = prepare(make_checkpoint(t, cfg), "FP8_PB_WO")
    assert not plan.modules["model.layers.1.mlp.down_proj"].quantize
    assert "model.layers.1*" in plan.exclude_modules and "model.visual*" in plan.exclude_modules
    assert plan.modules["model.layers.0.mlp.down_proj"].quantize


def test_sharding_independent_plan(make_checkpoint):
    cfg = llama_config()
    t = llama_tensors(cfg)
    a = prepare(make_checkpoint(t, cfg, shards=1, name="a"), "FP8").to_json()
    b = prepare(make_checkpoint(t, cfg, shards=3, name="b"), "FP8").to_json()
    assert a == b


def test_parse_size_and_natural_key():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2MiB") == 2 << 20 and parse_size(7) == 7
    with pytest.raises(ValueError):
        parse_size("lots")
    assert sorted(["l.10.w", "l.2.w"], key=natural_key) == ["l.2.w", "l.10.w"]


def test_dry_run_text_lists_every_module(tiny_llama):
    plan = prepare(tiny_llama, "FP8_PB_WO")
    text = plan.to_text()
    for name in plan.modules:
        assert name in text
    assert "exclude_modules (2): lm_head, model.embed_tokens" in text
    assert "bytes in" in text


@pytest.mark.parametrize("kw", [dict(algo="FP8", kv_cache_dtype="fp8", calibrated=True), dict(algo="NVFP4", layout="marlin"),
                                dict(algo="NVFP4", algo_for=["self_attn*=FP8_PB_WO"]),
                                dict(algo="FP8", format="compressed-tensors", kv_cache_dtype="fp8", calibrated=True)])
def test_every_output_is_written_by_exactly_one_task(kw, tmp_path):
    """The journal and the seal digest each task's outputs: an output named by two tasks (the calibrated
    KV scales under k_proj / v_proj once were) makes a finished output fail its own --resume check."""
    from collections import Counter

    from quantize_cli.calibration import load
    from tests.matrix.support import calibrate_example

    kw = dict(kw)
    if kw.pop("calibrated", False):
        kw["act_scales"] = load(calibrate_example(str(tmp_path / "s.json"))[0])
    plan = prepare("example:tiny-llama", kw.pop("algo"), max_shard_size="100KB", **kw)
    written = Counter(n for t in plan.tasks for n in t.outputs)
    assert set(written) == set(plan.outputs) and max(written.values()) == 1, [n for n, c in written.items() if c > 1]
