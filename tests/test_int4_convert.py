"""--algo INT4 / INT4_ASYM end to end: ModelOpt W4A16_AWQ == ModelOpt 0.47's export, compressed-tensors
pack-quantized == llm-compressor 0.14's model_free_ptq (W4A16 / W4A16_ASYM), byte for byte."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import convert
from quantize_cli.errors import UsageError
from quantize_cli.formats.ct_int4 import unpack_int32
from tests.conftest import GOLDEN, assert_same_bytes, golden_checkpoint, load_all

CT = os.path.join(GOLDEN, "compressed_tensors")
SOURCES = {"tiny-llama": golden_checkpoint("tiny-llama"), "int4-edge": os.path.join(CT, "int4-edge")}
PRESETS = {"W4A16": "INT4", "W4A16_ASYM": "INT4_ASYM"}


def run(src, dst, algo, **kw):
    convert(str(src), str(dst), algo=algo, device="cpu", quiet=True, **kw)


def test_modelopt_tiny_llama_byte_for_byte(tmp_path):
    run(golden_checkpoint("tiny-llama"), tmp_path / "out", "INT4")
    ref = load_file(os.path.join(golden_checkpoint("tiny-llama-INT4"), "model.safetensors"))
    out = load_all(tmp_path / "out")
    assert set(ref) == set(out)
    for name in ref:
        assert_same_bytes(out[name], ref[name], name)
    ref_hq = json.load(open(os.path.join(golden_checkpoint("tiny-llama-INT4"), "hf_quant_config.json")))
    got_hq = json.load(open(tmp_path / "out" / "hf_quant_config.json"))
    assert got_hq.pop("converter")["name"] == "quantize"
    assert got_hq == ref_hq and ref_hq["quantization"]["quant_algo"] == "W4A16_AWQ"
    ref_qc = json.load(open(os.path.join(golden_checkpoint("tiny-llama-INT4"), "config.json")))["quantization_config"]
    assert json.load(open(tmp_path / "out" / "config.json"))["quantization_config"] == ref_qc


@pytest.mark.parametrize("model", list(SOURCES))
@pytest.mark.parametrize("preset", list(PRESETS))
def test_compressed_tensors_equal_to_llm_compressor(tmp_path, preset, model):
    golden_dir = os.path.join(CT, f"{model}-{preset}")
    run(SOURCES[model], tmp_path / "out", PRESETS[preset], format="compressed-tensors")
    ours, theirs = load_all(tmp_path / "out"), load_all(golden_dir)
    compared = 0
    for name, t in theirs.items():
        if name.startswith("model.embed_tokens."):  # llm-compressor quantizes the embedding; we keep it
            continue
        assert_same_bytes(ours[name], t, name)
        compared += 1
    quantized = [n for n in ours if n.endswith(("weight_packed", "weight_scale", "weight_shape", "weight_zero_point"))]
    assert quantized and set(quantized) <= set(theirs) and compared >= len(quantized)
    assert any(n.endswith("weight_zero_point") for n in quantized) == (preset == "W4A16_ASYM")
    want = json.load(open(os.path.join(golden_dir, "config.json")))
    assert json.load(open(tmp_path / "out" / "config.json")) == want


def test_row_chunks_give_the_same_bytes(tmp_path):
    """Small chunks (memory bound): weight_shape is written once, zero points at 8-row offsets."""
    run(SOURCES["int4-edge"], tmp_path / "a", "INT4_ASYM", format="compressed-tensors")
    # a 1 MB budget quantizes in 64 kB chunks: the bf16 [256, 384] down_proj in 80-row pieces
    from quantize_cli.run.context import executor_sizes

    assert executor_sizes(1 << 20)["chunk_bytes"] < 256 * 384 * 2 // 2
    run(SOURCES["int4-edge"], tmp_path / "b", "INT4_ASYM", format="compressed-tensors", memory_budget="1MB")
    a, b = load_all(tmp_path / "a"), load_all(tmp_path / "b")
    assert set(a) == set(b)
    for name in a:
        assert_same_bytes(b[name], a[name], name)
    assert b["model.layers.0.mlp.down_proj.weight_shape"].tolist() == [256, 384]


def test_asymmetric_zero_points_cover_their_groups(tmp_path):
    run(SOURCES["int4-edge"], tmp_path / "out", "INT4_ASYM", format="compressed-tensors")
    out = load_all(tmp_path / "out")
    z = unpack_int32(out["model.layers.0.mlp.down_proj.weight_zero_point"], 256, dim=0)
    assert z[11].tolist() == [-8, 7, -8]  # all positive: lo = 0; all negative: hi = 0; constant 0.25: lo = 0


def test_asymmetric_is_refused_in_the_modelopt_format(tmp_path):
    with pytest.raises(UsageError, match="INT4_ASYM --format modelopt: ModelOpt's W4A16_AWQ"):
        run(SOURCES["tiny-llama"], tmp_path / "out", "INT4_ASYM")
    assert not os.path.exists(tmp_path / "out")


def test_llm_compressor_preset_names_are_aliases(tmp_path):
    run(SOURCES["tiny-llama"], tmp_path / "out", "w4a16_asym", format="compressed-tensors")
    qc = json.load(open(tmp_path / "out" / "config.json"))["quantization_config"]
    assert list(qc["config_groups"]) == ["W4A16_ASYM"] and qc["format"] == "pack-quantized"
    assert torch.equal(load_all(tmp_path / "out")["model.layers.0.mlp.up_proj.weight_shape"], torch.tensor([512, 256]))


def test_vllm_loads_our_int4_as_we_dequantize_it():
    """vllm_int4_load.json (bench/ct_vllm_int4_load.py in the vLLM 0.33 scratch venv): vLLM's own
    QKV / merged / row-parallel Linears, loaded through its weight loaders from our tiny-llama
    outputs, dequantize to exactly our values, with the scheme and code type check predicts."""
    from quantize_cli.formats import CT_SCHEMES

    with open(os.path.join(CT, "vllm_int4_load.json")) as f:
        res = json.load(f)
    assert set(res) == {"INT4", "INT4_ASYM"}
    for algo, layers in res.items():
        assert len(layers) == 8 and all(v["equal"] for v in layers.values()), algo
        assert {v["scheme"] for v in layers.values()} == {CT_SCHEMES[algo].vllm_linear}
        assert {v["quant_type"] for v in layers.values()} == {"uint4b8" if algo == "INT4" else "uint4"}
