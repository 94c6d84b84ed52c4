"""--format compressed-tensors equals llm-compressor 0.14's model_free_ptq, byte for byte.

The golden outputs in tests/golden/compressed_tensors/ were made by its make_golden.py (README
there). Every tensor llm-compressor wrote must be in our output with the same dtype, shape and
bytes, except ``model.embed_tokens``: model_free_ptq quantizes every 2-D ``*.weight`` that is not
a norm, the embedding too, which vLLM cannot load (docs/formats.md); we keep it in bf16.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.conftest import convert
from quantize_cli.algorithms import canonical_algo
from quantize_cli.formats import format_named
from quantize_cli.formats.ct_config import BF16_DECOMPRESSED
from tests.conftest import GOLDEN, assert_same_bytes, load_all

CT = os.path.join(GOLDEN, "compressed_tensors")
# llm-compressor's presets with a golden output of both sources; --algo takes the preset names
# (algorithms.ALIASES), and the compressed-tensors scheme says which preset it writes (formats/ct_schemes.py)
PRESETS = ("FP8_BLOCK", "FP8_DYNAMIC", "W8A8", "NVFP4A16", "MXFP8")
SOURCES = {"tiny-llama": os.path.join(GOLDEN, "checkpoints", "tiny-llama"), "edge": os.path.join(CT, "edge")}


def _convert(src: str, dst: str, algo: str, exclude=()) -> None:
    convert(src, dst, algo=algo, format="compressed-tensors", device="cpu", quiet=True, exclude=exclude)


@pytest.mark.parametrize("model", list(SOURCES))
@pytest.mark.parametrize("preset", PRESETS)
def test_equal_to_llm_compressor(tmp_path, preset, model):
    golden_dir = os.path.join(CT, f"{model}-{preset}")
    # llm-compressor crashes on FP8_BLOCK of the [200, 96] edge weight: the generator ignored it
    exclude = ("model.layers.0.mlp.down_proj",) if (model, preset) == ("edge", "FP8_BLOCK") else ()
    assert format_named("compressed-tensors").scheme(canonical_algo(preset)).preset == preset
    _convert(SOURCES[model], str(tmp_path / "out"), preset, exclude)
    ours, theirs = load_all(tmp_path / "out"), load_all(golden_dir)
    compared = 0
    for name, t in theirs.items():
        if name.startswith("model.embed_tokens."):
            continue
        assert_same_bytes(ours[name], t, name)
        compared += 1
    if model == "tiny-llama":  # llm-compressor quantized the embedding; we copy it unchanged
        assert "model.embed_tokens.weight_scale" in theirs and "model.embed_tokens.weight_scale" not in ours
        assert ours["model.embed_tokens.weight"].dtype == torch.bfloat16
    quantized = [n for n in ours if n.endswith(("weight_scale", "weight_packed"))]
    assert quantized and all(n in theirs for n in quantized)  # nothing quantized that llm-compressor did not
    assert compared >= len(quantized)
    with open(os.path.join(golden_dir, "config.json")) as f:
        want = json.load(f)
    with open(tmp_path / "out" / "config.json") as f:
        got = json.load(f)
    if preset in BF16_DECOMPRESSED and not {"torch_dtype", "dtype"} & set(want):  # a source config without a dtype:
        want["torch_dtype"] = "bfloat16"  # we say bf16 so transformers' default load runs (docs/formats.md "Where we differ")
    assert got == want  # whole config.json: source keys and the quantization_config block
    assert not os.path.exists(tmp_path / "out" / "hf_quant_config.json")


def test_golden_sources_are_what_the_generator_describes():
    """The edge checkpoint holds the cases the generator documents (guards a silent regeneration)."""
    t = load_all(SOURCES["edge"])
    w = t["model.layers.0.mlp.down_proj.weight"]
    assert (w[3] == 0).all() and torch.signbit(w[5]).all() and (w[130:, 16:32] == 0).all()
    assert t["model.layers.0.mlp.fp16_proj.weight"].dtype == torch.float16
    assert t["model.layers.0.mlp.fp32_proj.weight"].dtype == torch.float32
