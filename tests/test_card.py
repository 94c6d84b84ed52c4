"""The model card: Hub front matter, how the output was made, the source card kept below ours."""

import json
import os

import pytest
from click.testing import CliRunner
from huggingface_hub import ModelCard

from quantize_cli.api import check, unpack, verify
from tests.conftest import convert
from quantize_cli.output.card import render_card, serve_lines, sqnr_by_algo
from quantize_cli.cli import main

SOURCE_CARD = """---
license: llama3.1
pipeline_tag: text-generation
tags:
- facebook
---
# Tiny Llama

The original model card text.
"""


def facts(**over):
    """A complete facts dict, as card_facts or another producer (calibration, formats) hands it over."""
    base = {
        "tool": {"name": "quantize", "version": "0.1.0"}, "command": "quantize convert a/b -o out --algo NVFP4",
        "source": "a/b", "base_model": "a/b", "format": "modelopt", "engines": ["vLLM", "TensorRT-LLM", "SGLang"],
        "transformers_loads": False, "layout": "plain", "algos": {"NVFP4": 14},
        "quant_algo": "NVFP4", "kv_cache_dtype": None, "excluded": [{"module": "lm_head", "reason": "kept: output head"}],
        "exclude_modules": ["lm_head"], "calibration": None, "verify": None, "sizes": {"in": 4_000_000, "out": 1_000_000},
    }
    base.update(over)
    return base


def test_front_matter_follows_the_hub_conventions_and_keeps_the_source_license():
    text = render_card(facts(), SOURCE_CARD, "me/b-NVFP4")
    card = ModelCard(text)
    assert card.data.to_dict() == {  # no library_name: transformers would load a ModelOpt output as garbage
        "base_model": "a/b", "base_model_relation": "quantized", "license": "llama3.1", "pipeline_tag": "text-generation",
        "tags": ["quantized", "modelopt", "nvfp4", "nvidia-modelopt", "vllm", "tensorrt-llm", "sglang"]}
    body = card.text
    assert body.index("## How it was made") < body.index("## Original model card") < body.index("The original model card text.")
    assert "quantize convert a/b -o out --algo NVFP4" in body and "written by quantize 0.1.0" in body
    assert "4.00 MB before, 1.00 MB after (4.00x smaller)" in body
    assert "| `lm_head` | kept: output head |" in body
    assert "vllm serve me/b-NVFP4" in body and "trtllm-serve me/b-NVFP4" in body
    assert "Not verified at conversion time" in body
    assert "transformers does not load this format" in body and "--format compressed-tensors" in body


def test_a_compressed_tensors_card_names_transformers():
    card = ModelCard(render_card(facts(format="compressed-tensors", transformers_loads=True, engines=["vLLM", "transformers"])))
    assert card.data.library_name == "transformers" and "transformers does not load" not in card.text
    assert "It is served by vLLM, transformers." in card.text


def test_a_card_rendered_over_our_own_card_does_not_nest():
    once = render_card(facts(), SOURCE_CARD)
    twice = render_card(facts(), once)
    assert twice == once and twice.count("## Original model card") == 1


def test_no_source_card_no_base_model_no_license():
    card = ModelCard(render_card(facts(base_model=None, source="./my-model"), None))
    assert "base_model" not in card.data.to_dict() and "license" not in card.data.to_dict()
    assert "Original model card" not in card.text and "`./my-model`" in card.text


def test_calibration_verify_and_several_algorithms_are_reported():
    ver = {"errors": 0, "warnings": 1, "compared_with_source": True,
           "sqnr_db": sqnr_by_algo({"a.weight": {"sqnr_db": 30.0}, "b.weight": {"sqnr_db": 20.0}, "c.weight": {"sqnr_db": 12.5}},
                                   lambda m: "NVFP4" if m == "c" else "FP8")}
    assert ver["sqnr_db"] == {"FP8": {"tensors": 2, "median": 25.0, "min": 20.0, "worst": "b.weight"},
                              "NVFP4": {"tensors": 1, "median": 12.5, "min": 12.5, "worst": "c.weight"}}
    cal = {"calibrated": True, "dataset": "cnn_dailymail", "samples": 512, "seq_len": 2048, "tokens": 1048576, "modules": 14,
           "kv_scales": 0}
    body = render_card(facts(algos={"FP8": 10, "NVFP4": 4}, verify=ver, calibration=cal, format="compressed-tensors"))
    assert ("Calibrated on `cnn_dailymail`: 14 input scale(s) from 512 sample(s) of at most 2048 token(s) (1048576 tokens)."
            in body)
    assert "| `FP8` | 2 | 25.0 dB | 20.0 dB | `b.weight` |" in body and "| `NVFP4` | 1 | 12.5 dB | 12.5 dB | `c.weight` |" in body
    assert "- compressed-tensors" in body and "nvidia-modelopt" not in body
    assert "trtllm-serve" not in body  # no loader line claims a mix it was not checked for


@pytest.mark.parametrize("algo,loaders", [("FP8", {"vllm", "trtllm-serve", "python"}), ("FP8_PB_WO", {"vllm"}),
                                           ("NVFP4", {"vllm", "trtllm-serve", "python"}), ("W4A16_NVFP4", {"vllm"}),
                                           ("INT8", {"trtllm-serve"})])
def test_serve_lines_fit_the_algorithm(algo, loaders):
    """From the ModelOpt format's one table of what serves what (formats/modelopt.py SERVED)."""
    assert {line.split()[0] for line in serve_lines(facts(algos={algo: 1}), "r/m")} == loaders


def test_packed_layouts_and_fp8_kv_cache_say_how_to_serve():
    assert serve_lines(facts(layout="marlin"), "r/m")[-2:] == ["hf download r/m --local-dir m", "quantize unpack m -o m-plain"]
    assert serve_lines(facts(layout="marlin"), "./out")[-1] == "quantize unpack ./out -o ./out-plain"
    assert serve_lines(facts(kv_cache_dtype="fp8"), "r/m")[0].startswith("vllm serve r/m --kv-cache-dtype fp8")


def test_convert_writes_the_card_and_keeps_the_source_card_below(tiny_llama, tmp_path):
    with open(os.path.join(tiny_llama, "README.md"), "w") as f:
        f.write(SOURCE_CARD)
    dst = str(tmp_path / "out")
    convert(tiny_llama, dst, algo="NVFP4", exclude=["model.layers.0.mlp.*"], quiet=True)
    card = ModelCard.load(os.path.join(dst, "README.md"))
    assert card.data.license == "llama3.1" and "base_model" not in card.data.to_dict()  # a local folder has no Hub id
    text = open(os.path.join(dst, "README.md")).read()
    name = os.path.basename(tiny_llama)
    assert f"quantize convert ./{name} -o out --algo NVFP4 --exclude 'model.layers.0.mlp.*'" in text
    assert str(tmp_path) not in text and os.path.dirname(tiny_llama) not in text  # never a local path: the card is for publishing
    assert f"# {name} NVFP4" in text and "vllm serve ./out" in text
    assert "| `model.layers.0.mlp.down_proj` | kept: --exclude 'model.layers.0.mlp.*' |" in text
    assert "Not calibrated: every `input_scale` is 0.166667, the calibration-free constant" in text  # NVFP4: static global scale
    assert text.rstrip().endswith("The original model card text.")


def test_unpack_keeps_the_card_and_says_plain(tiny_llama, tmp_path):
    packed, plain = str(tmp_path / "packed"), str(tmp_path / "plain")
    convert(tiny_llama, packed, algo="NVFP4", layout="marlin", quiet=True)
    assert "quantize unpack" in open(os.path.join(packed, "README.md")).read()
    unpack(packed, plain, quiet=True)
    text = open(os.path.join(plain, "README.md")).read()
    assert "| layout | plain (unpacked from `packed` with `quantize unpack`) |" in text
    assert "vllm serve path/to/this/checkpoint" in text and "quantize unpack" not in text.split("## Serve it")[1]


def test_every_json_has_a_schema_version(tiny_llama, tmp_path):
    convert(tiny_llama, str(tmp_path / "o"), algo="FP8", report=str(tmp_path / "r.json"), quiet=True)
    check(tiny_llama, "FP8", json=str(tmp_path / "c.json"), quiet=True)
    verify(str(tmp_path / "o"), json=str(tmp_path / "v.json"), quiet=True)
    for name in ("r.json", "c.json", "v.json"):
        assert json.load(open(tmp_path / name))["schema_version"] == 1, name


def test_version_flag():
    r = CliRunner().invoke(main, ["--version"])
    assert r.exit_code == 0 and r.output == "quantize, version 0.1.0\n"


def test_final_line_says_sizes_and_ratio(tiny_llama, tmp_path):
    r = CliRunner().invoke(main, ["convert", tiny_llama, "-o", str(tmp_path / "o"), "--algo", "FP8_PB_WO"])
    assert r.exit_code == 0, r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith(f"wrote {tmp_path / 'o'}: 2.89 MB in -> 1.71 MB out (1.69x smaller) in 1 shard(s), ")


def test_card_of_a_mixed_compressed_tensors_output_says_its_format_algorithms_and_flags(tiny_llama, tmp_path):
    dst = str(tmp_path / "out")
    convert(tiny_llama, dst, algo="NVFP4", algo_for=["*self_attn*=FP8_PB_WO"], format="compressed-tensors", quiet=True)
    text = ModelCard.load(os.path.join(dst, "README.md")).text
    assert "in the compressed-tensors format" in text and "NVIDIA ModelOpt" not in text
    assert "quantize convert ./src -o out --algo NVFP4 --algo-for '*self_attn*=FP8_PB_WO' --format compressed-tensors" in text
    assert "| algorithm | `NVFP4` on" in text and "| algorithm | `FP8_PB_WO` on" in text
    assert "| format | compressed-tensors (`quantization_config` in config.json) |" in text


def test_unpack_of_a_marlin_output_card_states_the_plain_facts(tiny_llama, tmp_path):
    """Issue 35 item 19: the marlin-layout tag and the packed size row go; the card equals the plain one's facts."""
    plain, packed, unpacked = (str(tmp_path / n) for n in ("plain", "packed", "unpacked"))
    convert(tiny_llama, plain, algo="NVFP4", quiet=True)
    convert(tiny_llama, packed, algo="NVFP4", layout="marlin", quiet=True)
    assert "marlin-layout" in open(os.path.join(packed, "README.md")).read()
    unpack(packed, unpacked, quiet=True)
    text, want = (open(os.path.join(d, "README.md")).read() for d in (unpacked, plain))
    assert "marlin-layout" not in text

    def row(t, name):
        return next(line for line in t.splitlines() if line.startswith(f"| {name} |"))

    assert row(text, "size") == row(want, "size")
    front = text.split("---")[1]
    assert front == want.split("---")[1]
