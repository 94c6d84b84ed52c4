"""`quantize check`: verdicts per recipe family and per tricky pattern, exit codes, JSON."""

import json

import pytest
from click.testing import CliRunner

from quantize_cli.api import check
from quantize_cli.cli import main
from quantize_cli.errors import CheckFailed
from tests.families import FAMILIES, build

# family -> (recipe chosen, modules that must stay unquantized, exclude_modules written for NVFP4)
EXPECTED = {
    "llama": ("llama", {"lm_head"}, ["lm_head", "model.embed_tokens"]),
    "mistral": ("mistral", {"lm_head"}, ["lm_head", "model.embed_tokens"]),
    "qwen2": ("qwen2", {"lm_head"}, ["lm_head", "model.embed_tokens"]),
    "qwen3": ("qwen3", {"lm_head"}, ["lm_head", "model.embed_tokens"]),
    "gemma2": ("gemma", {"lm_head"}, ["lm_head", "model.embed_tokens"]),
    "mixtral": ("mixtral", {"lm_head", "model.layers.0.block_sparse_moe.gate"},
                ["lm_head", "model.embed_tokens", "model.layers.0.block_sparse_moe.gate", "model.layers.1.block_sparse_moe.gate"]),
    "qwen2_moe": ("qwen2_moe", {"model.layers.1.mlp.gate", "model.layers.1.mlp.shared_expert_gate"},
                  ["lm_head", "model.embed_tokens", "model.layers.0.mlp.gate", "model.layers.0.mlp.shared_expert_gate",
                   "model.layers.1.mlp.gate", "model.layers.1.mlp.shared_expert_gate"]),
    "qwen3_moe": ("qwen3_moe", {"model.layers.0.mlp.gate"},
                  ["lm_head", "model.embed_tokens", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]),
    "deepseek_v3": ("deepseek_v3", {"model.layers.2.eh_proj", "model.layers.1.mlp.gate"},
                    ["lm_head", "model.embed_tokens", "model.layers.1.mlp.gate", "model.layers.2*"]),
    "gemma3": ("gemma", {"vision_tower.vision_model.encoder.layers.0.mlp.fc1"},
               ["language_model.model.embed_tokens", "vision_tower*"]),
    "phi3": ("phi3", {"lm_head"}, ["lm_head", "model.embed_tokens"]),
}


@pytest.fixture
def family(make_checkpoint):
    def make(name):
        cfg, shapes = FAMILIES[name]()
        return make_checkpoint(build(shapes), cfg, shards=2, name=name)

    return make


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_gets_the_right_verdicts(family, name, capsys):
    recipe, kept, excludes = EXPECTED[name]
    result = check(family(name), "NVFP4")
    plan = result.plan
    assert plan.recipe.name == recipe
    for m in kept:
        assert not plan.modules[m].quantize, m
    assert plan.exclude_modules == excludes
    assert not result.errors
    quantized = [m for m in plan.modules.values() if m.quantize]
    assert quantized and all(m.kind == "linear" for m in quantized)
    # every fused group's members are quantized together
    for members in plan.groups.values():
        assert len({plan.modules[m].quantize for m in members}) == 1


def test_phi3_fused_checkpoint_tensors_are_single_modules(family):
    plan = check(family("phi3"), "FP8").plan
    assert plan.groups == {}
    assert plan.modules["model.layers.0.self_attn.qkv_proj"].quantize


# pattern -> {module: expected excluded?}, the verdicts vLLM's rules give (llama family)
PATTERNS = [
    ("model.layers.1", {"model.layers.1.mlp.down_proj": True, "model.layers.0.mlp.down_proj": False}),
    ("*down_proj", {"model.layers.0.mlp.down_proj": True, "model.layers.1.mlp.down_proj": True, "model.layers.0.mlp.up_proj": False}),
    ("model.layers.0.mlp.*", {"model.layers.0.mlp.gate_proj": True, "model.layers.0.mlp.up_proj": True, "model.layers.1.mlp.up_proj": False}),
    ("*qkv_proj", {"model.layers.0.self_attn.q_proj": True, "model.layers.1.self_attn.v_proj": True, "model.layers.0.self_attn.o_proj": False}),
    ("model.layers.0.self_attn*", {"model.layers.0.self_attn.o_proj": True, "model.layers.1.self_attn.o_proj": False}),
    ("*.mlp.gate_up_proj", {"model.layers.1.mlp.gate_proj": True, "model.layers.1.mlp.up_proj": True}),
]


@pytest.mark.parametrize("pattern,verdicts", PATTERNS)
def test_pattern_table(family, pattern, verdicts):
    plan = check(family("llama"), "NVFP4", exclude=[pattern]).plan
    for module, excluded in verdicts.items():
        assert plan.modules[module].quantize is not excluded, (pattern, module)


def test_substring_trap_is_warned(make_checkpoint):
    from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors

    cfg = llama_config(layers=11)
    result = check(make_checkpoint(llama_tensors(cfg), cfg), "FP8", exclude=["model.layers.1"])
    warn = [f for f in result.warnings if f.code == "pattern-substring"]
    assert len(warn) == 1 and "model.layers.10" in warn[0].message and "also matches 7 module(s)" in warn[0].message
    anchored = check(make_checkpoint(llama_tensors(cfg), cfg, name="b"), "FP8", exclude=["model.layers.1.mlp"])
    assert not [f for f in anchored.warnings if f.code == "pattern-substring"]
    assert not result.plan.modules["model.layers.10.mlp.down_proj"].quantize  # what vLLM would do, too


def test_partial_group_pattern_is_an_error(family):
    with pytest.raises(CheckFailed):
        check(family("llama"), "NVFP4", exclude=["*.q_proj"])


def test_unmatched_pattern_warns_and_strict_fails(family):
    result = check(family("llama"), "FP8", exclude=["model.layers.0.mlp.down_proj.weight"])
    assert any(f.code == "pattern-unmatched" for f in result.warnings)
    with pytest.raises(CheckFailed):
        check(family("llama"), "FP8", exclude=["nothing"], strict=True)


def test_tp_splits_are_checked(family):
    # o_proj/down_proj are row-parallel: K/tp must stay a multiple of 128 for FP8_PB_WO
    assert not check(family("llama"), "FP8_PB_WO", tp=2).errors
    with pytest.raises(CheckFailed):
        check(family("llama"), "FP8_PB_WO", tp=4)
    with pytest.raises(CheckFailed):
        check(family("llama"), "NVFP4", tp=32)  # down_proj K=512/32=16 ok, o_proj K=256/32=8 not


def test_kv_heads_fewer_than_ranks_are_replicated(family):
    """One KV head of 128 rows and tp=2: vLLM replicates it (128 rows per rank), it does not split it."""
    result = check(family("llama"), "FP8_PB_WO", tp=2)
    assert not [f for f in result.errors if "k_proj" in f.message or "v_proj" in f.message]


def test_moe_block_fp8_and_int8_and_uncalibrated_findings(family):
    with pytest.raises(CheckFailed):
        check(family("qwen3_moe"), "FP8_PB_WO")
    codes = {f.code for f in check(family("llama"), "INT8").warnings}
    assert "int8-vllm" in codes
    codes = {f.code for f in check(family("llama"), "FP8").warnings}
    assert "uncalibrated" in codes


def test_cli_exit_codes_and_json(family, tmp_path):
    src = family("llama")
    r = CliRunner().invoke(main, ["check", src, "--algo", "NVFP4", "--json", str(tmp_path / "c.json")])
    assert r.exit_code == 0, r.output
    doc = json.load(open(tmp_path / "c.json"))
    assert doc["ok"] and doc["summary"]["quantized"] == 14 and doc["tp"] == 1
    assert {"module", "vllm_prefix", "kind", "quantized", "rule", "shape", "fused_group", "algo", "algo_rule"} == set(doc["modules"][0])
    r = CliRunner().invoke(main, ["check", src, "--algo", "NVFP4", "--exclude", "*.k_proj", "--json", str(tmp_path / "d.json")])
    assert r.exit_code == 1 and "check failed" in r.output
    doc = json.load(open(tmp_path / "d.json"))
    assert not doc["ok"] and any(f["code"] == "pattern-partial-group" for f in doc["findings"])
    assert doc["patterns"][0]["pattern"] == "*.k_proj" and len(doc["patterns"][0]["modules"]) == 2


def test_hub_id_reads_headers_only(monkeypatch, family):
    """A repo id goes through get_safetensors_metadata (remote headers), never a weight download."""
    import os
    from types import SimpleNamespace

    import huggingface_hub

    from quantize_cli.checkpoint.safetensors_io import read_header

    local = family("llama")
    files = {}
    for f in sorted(os.listdir(local)):
        if f.endswith(".safetensors"):
            h = read_header(os.path.join(local, f))
            files[f] = SimpleNamespace(tensors={n: SimpleNamespace(dtype=t.dtype, shape=list(t.shape), data_offsets=[t.offset - h.data_start, t.offset - h.data_start + t.nbytes]) for n, t in h.tensors.items()})
    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", lambda repo, revision=None: SimpleNamespace(files_metadata=files))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, fname, revision=None: os.path.join(local, fname))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: (_ for _ in ()).throw(AssertionError("downloaded weights")))
    result = check("someone/llama-test", "NVFP4")
    assert result.plan.exclude_modules == ["lm_head", "model.embed_tokens"] and len(result.plan.quantized) == 14


def test_check_knows_calibration_will_come_and_strict_allows_named_warnings(tmp_path):
    """Issue 36 item 1: `check --strict` could not be told that convert calibrates, nor accept one known finding."""
    from click.testing import CliRunner

    from quantize_cli.cli import main

    def run(*args):
        return CliRunner().invoke(main, ["check", "example:tiny-llama", *args])

    assert run("--algo", "NVFP4", "--strict").exit_code == 1
    assert run("--algo", "NVFP4", "--strict", "--calib-data", "default").exit_code == 0
    r = run("--algo", "NVFP4", "--strict", "--act-scales", str(tmp_path / "none.json"))
    assert r.exit_code == 2 and "no such file" in r.output
    assert run("--algo", "INT8", "--strict").exit_code == 1
    r = run("--algo", "INT8", "--strict", "--allow", "int8-vllm", "--allow", "bogus")
    assert r.exit_code == 0 and "--allow bogus: no such warning here" in r.output, r.output
    r = run("--algo", "INT8", "--strict", "--allow", "uncalibrated")
    assert r.exit_code == 1  # another code does not allow this one


def test_bert_intermediate_dense_is_column_parallel_and_its_output_denses_row_parallel():
    """Issue 36 item 7: `check --tp 4` flagged BERT's intermediate.dense as row-parallel."""
    from types import SimpleNamespace

    from quantize_cli.modules.parallel import parallel_style
    from quantize_cli.modules.recipe import load_recipe

    rec = load_recipe(None, "bert")
    style = {n: parallel_style(SimpleNamespace(name=f"encoder.layer.0.{n}"), rec)
             for n in ("intermediate.dense", "output.dense", "attention.output.dense", "attention.self.query")}
    assert style == {"intermediate.dense": "column", "output.dense": "row", "attention.output.dense": "row",
                     "attention.self.query": "column"}, style


def test_convert_strict_allows_named_warnings_as_check_does(tmp_path):
    """A CI author's `convert --strict` took no `--allow CODE` (check's does): a warning said while
    planning (calibration's [calib-ignored]) and a plan's own ([int8-vllm]) are accepted by code."""
    from click.testing import CliRunner

    from quantize_cli.cli import main

    data = tmp_path / "ids.jsonl"
    data.write_text('{"input_ids": [1, 2, 3, 4]}\n')

    def run(algo, *args):
        return CliRunner().invoke(main, ["convert", "example:tiny-llama", "--algo", algo, "--dry-run", "--strict", *args])

    calib = ("--format", "compressed-tensors", "--calib-data", str(data))
    r = run("INT4", *calib)
    assert r.exit_code == 1 and "[calib-ignored]" in r.output and "--allow CODE" in r.output, r.output
    r = run("INT4", *calib, "--allow", "calib-ignored", "--allow", "bogus")
    assert r.exit_code == 0 and "--allow bogus: no such warning here" in r.output, r.output
    r = run("INT8")
    assert r.exit_code == 1 and "[int8-vllm]" in r.output, r.output
    assert run("INT8", "--allow", "[int8-vllm]").exit_code == 0
    assert run("INT8", "--allow", "calib-ignored").exit_code == 1  # another code does not allow this one


def test_allow_without_strict_is_a_usage_error():
    """`--allow CODE` without `--strict` was accepted silently by convert and check (no warning refuses
    without --strict): a CI line that lost its --strict looked lenient on purpose. Exit 2 naming both."""
    from click.testing import CliRunner

    from quantize_cli.cli import main

    for cmd in (["convert", "example:tiny-llama", "--algo", "INT8", "--dry-run"], ["check", "example:tiny-llama", "--algo", "INT8"]):
        r = CliRunner().invoke(main, [*cmd, "--allow", "int8-vllm"])
        assert r.exit_code == 2 and "--allow int8-vllm" in r.output and "add --strict" in r.output, (cmd, r.output)
        assert CliRunner().invoke(main, [*cmd, "--allow", "int8-vllm", "--strict"]).exit_code == 0


def _bert(root, pooler: bool) -> str:
    """A BERT folder (hidden 384: at --tp 4 a row-parallel part has 96 in-features, which no INT4 group of 128 divides)."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=384, intermediate_size=1536, num_hidden_layers=3, num_attention_heads=12, vocab_size=64,
                     max_position_embeddings=32)
    BertModel(cfg, add_pooling_layer=pooler).save_pretrained(str(root))
    return str(root)


def _check_json(tmp_path, src, *args):
    from click.testing import CliRunner

    from quantize_cli.cli import main

    out = tmp_path / f"c{len(list(tmp_path.iterdir()))}.json"
    r = CliRunner().invoke(main, ["check", src, "--json", str(out), *args])
    return r, json.loads(out.read_text())


@pytest.mark.parametrize("pooler, pattern", [(False, "encoder.layer.*.attention.output.dense"),
                                             (True, r"re:(encoder\.layer\.\d+\.attention\.output\.|pooler\.dense$)")])
def test_many_shape_errors_get_one_exclude_that_keeps_exactly_their_modules(tmp_path, pooler, pattern):
    """Issue 36 item 7: every shape error said `--exclude <that module>`; one pattern now fixes them all,
    and it is checked with the planner's matcher: given back, it leaves no error and keeps nothing else."""
    src = _bert(tmp_path / "bert", pooler)
    r, doc = _check_json(tmp_path, src, "--algo", "INT4", "--format", "compressed-tensors", "--tp", "4")
    errors = [f for f in doc["findings"] if f["code"] == "shape"]
    assert r.exit_code == 1 and len(errors) == 3 + pooler
    assert doc["fix"] == {"exclude": [pattern], "modules": sorted(f["subject"] for f in errors), "errors": len(errors)}
    assert f"fix: one --exclude '{pattern}' keeps exactly the {len(errors)} module(s)" in r.output, r.output
    r, doc = _check_json(tmp_path, src, "--algo", "INT4", "--format", "compressed-tensors", "--tp", "4", "--exclude", pattern)
    assert r.exit_code == 0 and doc["fix"] is None, r.output
    assert sorted(m["module"] for m in doc["modules"] if not m["quantized"]) == sorted(f["subject"] for f in errors)


def test_one_shape_error_keeps_its_own_fix_line():
    from quantize_cli.plan.suggest import one_exclude
    from quantize_cli.problems import ERROR, Finding

    assert one_exclude({}, [Finding(ERROR, "shape", "a.b", "...")]) is None


def test_recipe_pattern_lines_list_what_the_rule_keeps_not_vllm_substrings(tmp_path):
    """Issue 36 item 7: on BERT the recipe's `output` rule was listed with 12 module(s) (vLLM's substring
    rule over `attention.output.dense`) though it keeps none (the planner matches recipe rules with fnmatch)."""
    src = _bert(tmp_path / "bert", True)
    r, doc = _check_json(tmp_path, src, "--algo", "FP8_PB_WO", "--format", "compressed-tensors")
    assert r.exit_code == 0 and doc["summary"]["quantized"] == doc["summary"]["linears"]
    assert doc["patterns"] == [] and "patterns:" not in r.output, r.output
    r, doc = _check_json(tmp_path, "example:tiny-llama", "--algo", "FP8_PB_WO")
    assert [(p["pattern"], p["modules"], p["origin"]) for p in doc["patterns"]] == [("lm_head", ["lm_head"], "recipe llama")]


def test_convert_says_the_one_exclude_too(tmp_path):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    BertModel(BertConfig(hidden_size=96, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, vocab_size=64,
                         max_position_embeddings=32), add_pooling_layer=False).save_pretrained(str(tmp_path / "b"))
    r = CliRunner().invoke(main, ["convert", str(tmp_path / "b"), "--algo", "INT4", "--dry-run"])
    # in-features 96: every attention Linear and intermediate.dense (10 errors), not output.dense (in 256)
    assert r.exit_code == 1 and "10 problem(s) found" in r.output, r.output
    assert "fix: one --exclude 're:encoder\\.layer\\.\\d+\\.(attention\\.|intermediate\\.)' keeps exactly the 10 module(s)" in r.output
