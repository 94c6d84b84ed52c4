"""`quantize verify`: good outputs pass; every planted defect in a corrupted copy is caught."""

import json
import os
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from quantize_cli.formats import MODELOPT
from quantize_cli.algorithms import ALGOS
from tests.conftest import convert
from quantize_cli.cli import main
from quantize_cli.schemes import SCHEMES
from quantize_cli.verify import verify_checkpoint
from tests.conftest import golden_checkpoint


@pytest.fixture
def converted(tiny_llama, tmp_path):
    def make(algo, **kw):
        dst = tmp_path / f"out-{algo}"
        if not dst.exists():
            convert(tiny_llama, str(dst), algo=algo, quiet=True, **kw)
        copy = tmp_path / f"copy-{algo}-{len(os.listdir(tmp_path))}"
        shutil.copytree(dst, copy)
        return str(copy)

    return make


def edit_tensors(folder, fn):
    path = os.path.join(folder, "model.safetensors")
    t = load_file(path)
    fn(t)
    save_file(t, path, metadata={"format": "pt"})


def edit_json(folder, name, fn):
    path = os.path.join(folder, name)
    doc = json.load(open(path))
    fn(doc)
    json.dump(doc, open(path, "w"))


def codes(res):
    return {f.code for f in res.errors}


@pytest.mark.parametrize("algo", [a for a in ALGOS if not MODELOPT.refusal(a)])  # INT4_ASYM: compressed-tensors only
def test_our_outputs_pass_with_source_errors(converted, tiny_llama, algo):
    res = verify_checkpoint(converted(algo), tiny_llama)
    assert not res.errors, [f.message for f in res.errors]
    assert len(res.quantized) == 14 and len(res.errors_by_tensor) == 14
    assert all(e["sqnr_db"] > 15 for e in res.errors_by_tensor.values())


@pytest.mark.parametrize("algo", ["FP8", "FP8_PB_WO", "FP8_PER_CHANNEL_PER_TOKEN", "NVFP4", "W4A16_NVFP4", "MXFP8", "INT4"])
def test_modelopt_exports_pass(algo):
    res = verify_checkpoint(golden_checkpoint(f"tiny-llama-{algo}"), golden_checkpoint("tiny-llama"))
    assert not res.errors, [f.message for f in res.errors]
    fused = [f for f in res.warnings if f.code == "fused-scales"]
    assert bool(fused) == (algo == "FP8")  # ModelOpt's FP8 keeps one scale per fused member


def test_missing_scale(converted):
    d = converted("NVFP4")
    edit_tensors(d, lambda t: t.pop("model.layers.0.mlp.down_proj.weight_scale_2"))
    assert any("weight_scale_2: missing" in f.message for f in verify_checkpoint(d).errors)


def test_unequal_nvfp4_fused_scales_are_an_error_fp8_a_warning(converted):
    d = converted("NVFP4")
    edit_tensors(d, lambda t: t.__setitem__("model.layers.1.self_attn.k_proj.weight_scale_2", torch.tensor(0.5)))
    assert "fused-scales" in codes(verify_checkpoint(d))
    d = converted("FP8")
    edit_tensors(d, lambda t: t.__setitem__("model.layers.1.mlp.up_proj.weight_scale", torch.tensor(0.5)))
    res = verify_checkpoint(d)
    assert "fused-scales" not in codes(res) and any(f.code == "fused-scales" for f in res.warnings)


def test_wrong_dtype(converted):
    d = converted("FP8_PB_WO")
    edit_tensors(d, lambda t: t.__setitem__("model.layers.0.mlp.up_proj.weight_scale", t["model.layers.0.mlp.up_proj.weight_scale"].bfloat16()))
    assert any("BF16" in f.message and "needs F32" in f.message for f in verify_checkpoint(d).errors)


def test_kept_linear_missing_from_exclusions(converted):
    d = converted("FP8_PB_WO")
    for name, key in (("hf_quant_config.json", None), ("config.json", None)):
        if name == "hf_quant_config.json":
            edit_json(d, name, lambda doc: doc["quantization"]["exclude_modules"].remove("lm_head"))
        else:
            edit_json(d, name, lambda doc: doc["quantization_config"]["ignore"].remove("lm_head"))
    res = verify_checkpoint(d)
    assert any(f.code == "exclusions" and f.subject == "lm_head" for f in res.errors)


def test_quantized_linear_listed_as_excluded(converted):
    d = converted("FP8_PB_WO")
    edit_json(d, "hf_quant_config.json", lambda doc: doc["quantization"]["exclude_modules"].append("model.layers.0.mlp.down_proj"))
    edit_json(d, "config.json", lambda doc: doc["quantization_config"]["ignore"].append("model.layers.0.mlp.down_proj"))
    assert "exclusions" in codes(verify_checkpoint(d))


def test_config_files_disagree(converted):
    d = converted("NVFP4")
    edit_json(d, "config.json", lambda doc: doc["quantization_config"].__setitem__("quant_algo", "W4A16_NVFP4"))
    assert "config-mismatch" in codes(verify_checkpoint(d))
    d = converted("FP8")
    edit_json(d, "config.json", lambda doc: doc.pop("quantization_config"))
    assert "config" in codes(verify_checkpoint(d))


def test_nan_scale_and_nan_fp8_payload(converted):
    d = converted("FP8_PER_CHANNEL_PER_TOKEN")
    def plant(t):
        s = t["model.layers.1.self_attn.o_proj.weight_scale"].clone()
        s[3] = float("nan")
        t["model.layers.1.self_attn.o_proj.weight_scale"] = s
        w = t["model.layers.0.mlp.up_proj.weight"].view(torch.uint8).clone()
        w[0, 0] = 0x7F  # e4m3fn NaN
        t["model.layers.0.mlp.up_proj.weight"] = w.view(torch.float8_e4m3fn)
    edit_tensors(d, plant)
    bad = {f.subject for f in verify_checkpoint(d).errors if f.code == "non-finite"}
    assert bad == {"model.layers.1.self_attn.o_proj.weight_scale", "model.layers.0.mlp.up_proj.weight"}


def test_index_that_misses_a_tensor(tiny_llama, tmp_path):
    d = tmp_path / "sharded"
    convert(tiny_llama, str(d), algo="FP8", quiet=True, max_shard_size="500KB")
    edit_json(str(d), "model.safetensors.index.json", lambda doc: doc["weight_map"].pop("model.norm.weight"))
    assert any(f.code == "index" and f.subject == "model.norm.weight" for f in verify_checkpoint(str(d)).errors)


def test_corrupted_payload_is_under_the_floor(converted, tiny_llama):
    d = converted("INT8")
    edit_tensors(d, lambda t: t["model.layers.0.self_attn.o_proj.weight"].zero_())
    res = verify_checkpoint(d, tiny_llama)
    assert any(f.code == "accuracy-floor" and "o_proj" in f.subject for f in res.errors)


def test_cli_exit_codes_and_json(converted, tmp_path):
    d = converted("FP8_PB_WO")
    r = CliRunner().invoke(main, ["verify", d, "--json", str(tmp_path / "v.json")])
    assert r.exit_code == 0, r.output
    assert json.load(open(tmp_path / "v.json"))["ok"] is True
    edit_tensors(d, lambda t: t.pop("model.layers.0.mlp.up_proj.weight_scale"))
    r = CliRunner().invoke(main, ["verify", d])
    assert r.exit_code == 1 and "verify failed" in r.output
    r = CliRunner().invoke(main, ["verify", str(tmp_path / "nope")])
    assert r.exit_code == 1


@pytest.mark.parametrize("written,claimed", [("FP8_PB_WO", "FP8"), ("FP8", "FP8_PB_WO"), ("FP8_PER_CHANNEL_PER_TOKEN", "FP8")])
def test_configs_that_contradict_the_tensors_are_named_not_a_crash(converted, tiny_llama, tmp_path, written, claimed):
    """Hostile round 3: both config files say FP8 while the tensors carry FP8_PB_WO's block scales.
    verify crashed (`internal error (RuntimeError: a Tensor with 12 elements cannot be converted to
    Scalar)`); it names the tensor and the contradiction, with --source too, and the CLI exits 1."""
    from quantize_cli.formats.modelopt_documents import flat_quantization_config
    from quantize_cli.schemes import SCHEMES

    folder = converted(written)

    def claim(doc):
        doc["quantization"]["quant_algo"] = SCHEMES[claimed].quant_algo

    edit_json(folder, "hf_quant_config.json", claim)
    nested = json.load(open(os.path.join(folder, "hf_quant_config.json")))
    edit_json(folder, "config.json", lambda doc: doc.update(quantization_config=flat_quantization_config(nested)))
    res = verify_checkpoint(folder, tiny_llama)
    found = [f for f in res.errors if f.code == "contradiction"]
    assert found and codes(res) <= {"contradiction", "exclusions"}, [f.message for f in res.errors]
    first = found[0].message
    assert first.startswith("model.layers.0.") and f"is {written}'s layout" in first and f"quant_algo {SCHEMES[claimed].quant_algo!r}" in first
    assert not res.errors_by_tensor  # nothing read as the configs say
    r = CliRunner().invoke(main, ["verify", folder, "--source", tiny_llama])
    assert r.exit_code == 1 and "internal error" not in r.output and "[contradiction]" in r.output
