"""Mixed precision (--algo-for): ModelOpt 0.47's MIXED_PRECISION files, per-layer bytes equal to
converting each part alone, and the refusals (split fused groups / MoE layers, unserved combos)."""

import json
import os

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from quantize_cli.api import check
from tests.conftest import convert
from quantize_cli.cli import main
from quantize_cli.errors import PlanError, QuantizeError, UsageError
from quantize_cli.checkpoint.example_weights import qwen3_moe_config, qwen3_moe_tensors
from quantize_cli.modules.classify import definition_order
from quantize_cli.verify import verify_checkpoint
from tests.conftest import assert_same_bytes, golden_checkpoint, load_all

GOLDEN = "tiny-llama-NVFP4-attn-FP8_PB_WO"


def run(src, dst, algo, **kw):
    kw.setdefault("quiet", True)
    return convert(str(src), str(dst), algo=algo, **kw)


def configs(folder):
    hq = json.load(open(os.path.join(folder, "hf_quant_config.json")))
    qc = json.load(open(os.path.join(folder, "config.json")))["quantization_config"]
    return hq, qc


def test_modelopt_mixed_export_byte_for_byte(tmp_path):
    """ModelOpt 0.47's own NVFP4-MLP + fp8_pb_wo-attention export of the golden tiny-llama:
    every tensor (NVFP4 input_scale: calibrated there, constant here) and both config files."""
    run(golden_checkpoint("tiny-llama"), tmp_path / "out", "NVFP4", algo_for=["self_attn*=FP8_PB_WO"])
    ref = load_file(os.path.join(golden_checkpoint(GOLDEN), "model.safetensors"))
    out = load_all(tmp_path / "out")
    assert set(ref) == set(out)
    for name in ref:
        if name.endswith("input_scale"):
            assert out[name].dtype == torch.float32 and out[name].shape == ()
            continue
        assert_same_bytes(out[name], ref[name], name)
    ref_hq, ref_qc = configs(golden_checkpoint(GOLDEN))
    got_hq, got_qc = configs(tmp_path / "out")
    assert got_hq.pop("converter")["name"] == "quantize"
    assert got_hq == ref_hq and got_qc == ref_qc
    # same key order too (quantized_layers and the config group numbering follow the model's module order)
    assert list(got_hq["quantization"]["quantized_layers"]) == list(ref_hq["quantization"]["quantized_layers"])
    assert list(got_qc) == list(ref_qc)


def test_each_part_equals_converting_it_alone(tiny_llama, tmp_path):
    run(tiny_llama, tmp_path / "mix", "NVFP4", algo_for=["self_attn*=FP8_PB_WO"])
    run(tiny_llama, tmp_path / "nv", "NVFP4")
    run(tiny_llama, tmp_path / "fp", "FP8_PB_WO")
    mix, nv, fp = load_all(tmp_path / "mix"), load_all(tmp_path / "nv"), load_all(tmp_path / "fp")
    for name, t in mix.items():
        ref = fp if ".self_attn." in name else nv
        assert_same_bytes(t, ref[name], name)
    assert set(mix) == {n for n in fp if ".self_attn." in n} | {n for n in nv if ".self_attn." not in n}


def test_moe_fp8_pb_wo_dense_with_nvfp4_experts(make_checkpoint, tmp_path):
    """The trade the single-format file cannot express: block-FP8 dense layers, NVFP4 experts."""
    cfg = qwen3_moe_config()
    src = make_checkpoint(qwen3_moe_tensors(cfg, seed=3), cfg, shards=2, name="moe")
    with pytest.raises(PlanError):  # alone, FP8_PB_WO experts are refused (vLLM's ModelOpt MoE path)
        run(src, tmp_path / "x", "FP8_PB_WO")
    run(src, tmp_path / "mix", "FP8_PB_WO", algo_for=["*experts*=NVFP4"])
    run(src, tmp_path / "nv", "NVFP4")
    run(src, tmp_path / "fp", "FP8_PB_WO", exclude=["*experts*"])
    mix, nv, fp = load_all(tmp_path / "mix"), load_all(tmp_path / "nv"), load_all(tmp_path / "fp")
    for name, t in mix.items():
        assert_same_bytes(t, (nv if ".experts." in name else fp)[name], name)
    hq, qc = configs(tmp_path / "mix")
    layers = hq["quantization"]["quantized_layers"]
    assert layers["model.layers.0.mlp.experts.3.down_proj"] == {"quant_algo": "NVFP4", "group_size": 16}
    assert layers["model.layers.0.self_attn.q_proj"] == {"quant_algo": "fp8_pb_wo"}
    assert not any(".mlp.gate" == k[-9:] for k in layers)  # routers stay bf16: absent from the map
    assert qc["ignore"] == [] and qc["quantized_layers"] == layers and qc["quant_algo"] == "MIXED_PRECISION"
    assert list(layers) == sorted(layers, key=definition_order)
    res = verify_checkpoint(str(tmp_path / "mix"), src)
    assert not res.errors, [f.message for f in res.errors]
    assert not [f for f in res.warnings if f.code == "accuracy-outlier"]  # NVFP4 vs FP8: medians per algorithm
    assert {e["sqnr_db"] > 15 for e in res.errors_by_tensor.values()} == {True}


def test_verify_checks_each_layer_against_its_own_algorithm(tiny_llama, tmp_path):
    import json as _json

    run(tiny_llama, tmp_path / "mix", "NVFP4", algo_for=["self_attn*=FP8_PB_WO"])
    assert not verify_checkpoint(str(tmp_path / "mix"), tiny_llama).errors
    path = tmp_path / "mix" / "hf_quant_config.json"
    doc = _json.load(open(path))
    layers = doc["quantization"]["quantized_layers"]
    layers["model.layers.0.self_attn.o_proj"] = {"quant_algo": "NVFP4", "group_size": 16}  # wrong algorithm for its tensors
    del layers["model.layers.1.mlp.down_proj"]  # quantized tensors, unlisted
    layers["model.layers.0.extra_proj"] = {"quant_algo": "NVFP4", "group_size": 16}  # listed, absent
    _json.dump(doc, open(path, "w"))
    errors = verify_checkpoint(str(tmp_path / "mix")).errors
    assert {"contradiction", "mixed-unlisted", "mixed-listed"} <= {f.code for f in errors}
    (wrong,) = [f for f in errors if f.code == "contradiction"]  # its tensors are FP8_PB_WO's, as written
    assert wrong.subject.startswith("model.layers.0.self_attn.o_proj.") and "FP8_PB_WO's layout" in wrong.message


def test_split_fused_group_and_moe_layer_are_refused_naming_the_pattern(make_checkpoint, tiny_llama, tmp_path):
    with pytest.raises(PlanError) as exc:
        run(tiny_llama, tmp_path / "o", "NVFP4", algo_for=["*q_proj=FP8_PB_WO"])
    msg = "\n".join(exc.value.details)
    assert "qkv_proj" in msg and "--algo-for '*q_proj=FP8_PB_WO'" in msg
    cfg = qwen3_moe_config()
    src = make_checkpoint(qwen3_moe_tensors(cfg, seed=3), cfg, shards=1, name="moe")
    with pytest.raises(PlanError) as exc:
        run(src, tmp_path / "o", "NVFP4", algo_for=["*experts.0.*=MXFP8"])
    assert any("MoE layer would mix" in d for d in exc.value.details)
    assert not os.path.exists(tmp_path / "o")


def test_unserved_combinations_are_refused_with_the_reason(make_checkpoint, tiny_llama, tmp_path):
    with pytest.raises(PlanError) as exc:
        run(tiny_llama, tmp_path / "o", "NVFP4", algo_for=["self_attn*=INT8"])
    assert any("vLLM 0.33 serves only" in d for d in exc.value.details)
    cfg = qwen3_moe_config()
    src = make_checkpoint(qwen3_moe_tensors(cfg, seed=3), cfg, shards=1, name="moe")
    with pytest.raises(PlanError) as exc:
        run(src, tmp_path / "o", "NVFP4", algo_for=["*experts*=FP8_PER_CHANNEL_PER_TOKEN"])
    assert any("serves MoE layers only as" in d for d in exc.value.details)
    with pytest.raises(PlanError) as exc:
        run(tiny_llama, tmp_path / "o", "NVFP4", algo_for=["self_attn*=FP8_PB_WO"], layout="marlin")
    assert any("--layout marlin with --algo-for" in d for d in exc.value.details)


def test_usage_errors_and_single_algorithm_results(tiny_llama, tmp_path):
    with pytest.raises(UsageError, match="PATTERN=ALGO"):
        run(tiny_llama, tmp_path / "o", "NVFP4", algo_for=["self_attn"])
    with pytest.raises(UsageError, match="unknown algorithm"):
        run(tiny_llama, tmp_path / "o", "NVFP4", algo_for=["self_attn*=FP9"])
    # a rule that leaves one algorithm in use writes the plain single-format checkpoint
    res = run(tiny_llama, tmp_path / "a", "NVFP4", algo_for=["*=FP8_PB_WO"])
    assert not res.plan.mixed and res.plan.scheme.algo == "FP8_PB_WO"
    run(tiny_llama, tmp_path / "b", "FP8_PB_WO")
    for f in ("model.safetensors", "hf_quant_config.json", "config.json"):
        assert open(tmp_path / "a" / f, "rb").read() == open(tmp_path / "b" / f, "rb").read(), f
    res = run(tiny_llama, tmp_path / "c", "NVFP4", algo_for=["nothing_here*=FP8_PB_WO"])
    assert any("--algo-for 'nothing_here*'" in w for w in res.plan.warnings)


def test_check_shows_the_algorithm_and_rule_per_module(tiny_llama, capsys, tmp_path):
    res = check(tiny_llama, "NVFP4", algo_for=["self_attn*=FP8_PB_WO"], json=str(tmp_path / "c.json"), quiet=True)
    text = capsys.readouterr().out
    assert "model.layers.0.self_attn.q_proj" in text and "FP8_PB_WO" in text and "--algo-for 'self_attn*=FP8_PB_WO'" in text
    doc = json.load(open(tmp_path / "c.json"))
    rows = {m["module"]: m for m in doc["modules"]}
    assert rows["model.layers.1.self_attn.o_proj"]["algo"] == "FP8_PB_WO"
    assert rows["model.layers.1.mlp.up_proj"]["algo_rule"] == "--algo NVFP4"
    assert doc["quant_algo"] == "MIXED_PRECISION" and not res.errors


def test_cli_algo_for(tiny_llama, tmp_path):
    out = tmp_path / "o"
    r = CliRunner().invoke(main, ["convert", str(tiny_llama), "-o", str(out), "--algo", "NVFP4", "--algo-for",
                                  "self_attn*=FP8_PB_WO", "-q"])
    assert r.exit_code == 0, r.output
    assert json.load(open(out / "hf_quant_config.json"))["quantization"]["quant_algo"] == "MIXED_PRECISION"
    r = CliRunner().invoke(main, ["convert", str(tiny_llama), "-o", str(tmp_path / "p"), "--algo", "NVFP4", "--algo-for", "bad"])
    assert r.exit_code == 2 and "PATTERN=ALGO" in r.output
    r = CliRunner().invoke(main, ["check", str(tiny_llama), "--algo", "NVFP4", "--algo-for", "self_attn*=FP8_PB_WO"])
    assert r.exit_code == 0 and "FP8_PB_WO" in r.output


def test_a_fully_shadowed_rule_warns_and_fails_under_strict(tiny_llama, tmp_path):
    """First match wins: a rule all of whose modules an earlier rule (or several together) takes is
    never used. It was dropped without a word (issue 26); now it warns, as an unmatched one does."""
    shadowed = ["self_attn*=FP8_PB_WO", "*q_proj=MXFP8"]
    res = check(tiny_llama, "NVFP4", algo_for=shadowed, quiet=True)
    (finding,) = [f for f in res.findings if f.code == "pattern-shadowed"]
    assert finding.level == "warning" and finding.subject == "*q_proj"
    assert "--algo-for '*q_proj=MXFP8' is shadowed" in finding.message and "--algo-for 'self_attn*=FP8_PB_WO'" in finding.message
    together = check(tiny_llama, "NVFP4", algo_for=["*layers.0.*=FP8_PB_WO", "*layers.1.*=FP8_PB_WO", "*o_proj=MXFP8"], quiet=True)
    assert [f.subject for f in together.findings if f.code == "pattern-shadowed"] == ["*o_proj"]
    partly = check(tiny_llama, "NVFP4", algo_for=["*layers.0.self_attn*=FP8_PB_WO", "*self_attn*=MXFP8"], quiet=True)
    assert not [f for f in partly.findings if f.code == "pattern-shadowed"]  # it still decides layer 1
    with pytest.raises(QuantizeError, match="--strict"):
        check(tiny_llama, "NVFP4", algo_for=shadowed, strict=True, quiet=True)
    with pytest.raises(PlanError, match="--strict") as exc:
        run(tiny_llama, tmp_path / "o", "NVFP4", algo_for=shadowed, strict=True)
    assert any("is shadowed" in d for d in exc.value.details) and not (tmp_path / "o").exists()
    res = run(tiny_llama, tmp_path / "w", "NVFP4", algo_for=shadowed)  # without --strict: converts, and says so
    assert any("is shadowed" in w for w in res.plan.warnings)
