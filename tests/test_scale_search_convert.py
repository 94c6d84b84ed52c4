"""--scale-search end to end: same files and names, searched scales, the report and verify --source
show the error reduction, usage errors, resume refuses a different search."""

import json
import os

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from tests.conftest import convert
from quantize_cli import api
from quantize_cli.cli import main
from quantize_cli.schemes import SCHEMES
from quantize_cli.schemes.searched import with_scale_search
from tests.conftest import load_all


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("algo", ["W4A16_NVFP4", "FP8_PER_CHANNEL_PER_TOKEN"])
def test_mse_lowers_every_tensor_error_same_format(algo, tiny_llama, tmp_path):
    plain, mse = tmp_path / "plain", tmp_path / "mse"
    assert invoke("convert", tiny_llama, "-o", plain, "--algo", algo, "--device", "cpu", "-q").exit_code == 0
    r = invoke("convert", tiny_llama, "-o", mse, "--algo", algo, "--device", "cpu", "-q", "--scale-search", "mse",
               "--report", tmp_path / "r.json")
    assert r.exit_code == 0, r.output
    a, b = load_all(plain), load_all(mse)
    assert {k: (v.dtype, v.shape) for k, v in a.items()} == {k: (v.dtype, v.shape) for k, v in b.items()}
    cfg_a, cfg_b = (json.load(open(p / "config.json")) for p in (plain, mse))
    assert cfg_a["quantization_config"] == cfg_b["quantization_config"]
    nested = json.load(open(mse / "hf_quant_config.json"))
    assert nested["converter"]["scale_search"] == "mse"
    assert nested["quantization"] == json.load(open(plain / "hf_quant_config.json"))["quantization"]
    # the written tensors are exactly the searched reference's
    w = load_all(tiny_llama)["model.layers.0.mlp.down_proj.weight"]
    ref = with_scale_search(SCHEMES[algo], "mse").quantize(w)
    assert torch.equal(b["model.layers.0.mlp.down_proj.weight_scale"].view(torch.uint8) if algo.endswith("NVFP4") else
                       b["model.layers.0.mlp.down_proj.weight_scale"], ref["weight_scale"].view(torch.uint8) if algo.endswith("NVFP4") else ref["weight_scale"])
    doc = json.load(open(tmp_path / "r.json"))
    assert doc["options"]["scale_search"] == "mse"
    quantized = [t for t in doc["tensors"] if t["action"] == "quantize"]
    assert quantized and all(t["mse_reduction"] > 0 and t["sqnr_db"] > t["rtn_sqnr_db"] for t in quantized)
    assert doc["error_summary"]["min_mse_reduction"] > 0
    v = invoke("verify", mse, "--source", tiny_llama, "--json", tmp_path / "v.json")
    assert v.exit_code == 0, v.output
    assert "vs round-to-nearest +" in v.output
    errs = json.load(open(tmp_path / "v.json"))["tensor_errors"]
    for name, e in errs.items():
        rep = next(t for t in quantized if t["name"] == name)
        assert e["sqnr_gain_db"] == pytest.approx(rep["sqnr_gain_db"], abs=1e-6)


def test_none_is_the_default_and_writes_modelopt_bytes(tiny_llama, tmp_path):
    assert invoke("convert", tiny_llama, "-o", tmp_path / "a", "--algo", "NVFP4", "-q", "--device", "cpu").exit_code == 0
    assert invoke("convert", tiny_llama, "-o", tmp_path / "b", "--algo", "NVFP4", "-q", "--device", "cpu", "--scale-search", "none").exit_code == 0
    for name in ("model.safetensors", "config.json", "hf_quant_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert "scale_search" not in json.load(open(tmp_path / "a" / "hf_quant_config.json"))["converter"]
    v = invoke("verify", tmp_path / "a", "--source", tiny_llama)
    assert v.exit_code == 0 and "round-to-nearest" not in v.output


def test_usage_errors(tiny_llama, tmp_path):
    r = invoke("convert", tiny_llama, "-o", tmp_path / "o", "--algo", "FP8", "--scale-search", "mse")
    assert r.exit_code == 2 and "--scale-search mse --algo FP8" in r.output and len(r.output.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "o")
    r = invoke("convert", tiny_llama, "-o", tmp_path / "o", "--algo", "INT8", "--scale-search", "gptq")
    assert r.exit_code == 2 and "--scale-search" in r.output


def test_library_keyword_and_run_identity(tiny_llama, tmp_path):
    from quantize_cli.output.identity import RunIdentity
    from quantize_cli.plan.options import ConvertOptions

    res = convert(tiny_llama, str(tmp_path / "o"), algo="INT8", device="cpu", quiet=True, scale_search="mse")
    assert res.report["options"]["scale_search"] == "mse"
    searched = RunIdentity.of(ConvertOptions(tiny_llama, "o", algo="INT8", scale_search="mse"), res.plan)
    plain = RunIdentity.of(ConvertOptions(tiny_llama, "o", algo="INT8"), res.plan)
    assert searched.fingerprint() != plain.fingerprint()
    assert searched.differences(plain.record()) == ["--scale-search none, this run asks for mse"]
