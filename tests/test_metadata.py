"""Metadata builders are pure functions: compared as dicts with the spec's literal examples (§1.3)."""

import pytest

from quantize_cli import __version__
from quantize_cli.formats.modelopt_documents import flat_quantization_config, hf_quant_config, output_config
from quantize_cli.schemes import SCHEMES

PRODUCER = {"name": "modelopt", "version": "0.47.0"}
CONVERTER = {"name": "quantize", "version": __version__}


def test_fp8_with_kv_cache():
    nested = hf_quant_config(SCHEMES["FP8"], ["lm_head"], "fp8")
    assert nested == {"producer": PRODUCER, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}, "converter": CONVERTER}
    assert list(nested) == ["producer", "quantization", "converter"]
    flat = flat_quantization_config(nested)
    assert flat == {
        "config_groups": {"group_0": {"input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
                                      "weights": {"dynamic": False, "num_bits": 8, "type": "float"}, "targets": ["Linear"]}},
        "ignore": ["lm_head"], "quant_algo": "FP8", "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
        "producer": PRODUCER, "quant_method": "modelopt",
    }
    assert list(flat) == ["config_groups", "ignore", "quant_algo", "kv_cache_scheme", "producer", "quant_method"]


def test_nvfp4_keys_and_order():
    ex = ["lm_head", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
    nested = hf_quant_config(SCHEMES["NVFP4"], list(reversed(ex)))
    assert nested["quantization"] == {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": ex}
    assert list(nested["quantization"]) == ["quant_algo", "kv_cache_quant_algo", "group_size", "exclude_modules"]
    g = flat_quantization_config(nested)["config_groups"]["group_0"]
    assert g["input_activations"] == {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    assert g["weights"] == {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}


def test_w4a16_has_weights_group_only():
    flat = flat_quantization_config(hf_quant_config(SCHEMES["W4A16_NVFP4"], []))
    assert set(flat["config_groups"]["group_0"]) == {"weights", "targets"}
    assert flat["ignore"] == [] and flat["quant_algo"] == "W4A16_NVFP4"


@pytest.mark.parametrize("algo,written", [("FP8_PER_CHANNEL_PER_TOKEN", "FP8_PER_CHANNEL_PER_TOKEN"), ("FP8_PB_WO", "fp8_pb_wo"), ("INT8", "W8A16")])
def test_algorithms_without_config_groups(algo, written):
    nested = hf_quant_config(SCHEMES[algo], ["lm_head"])
    assert nested["quantization"] == {"quant_algo": written, "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}
    flat = flat_quantization_config(nested)
    assert flat == {"ignore": ["lm_head"], "quant_algo": written, "producer": PRODUCER, "quant_method": "modelopt"}


def test_output_config_replaces_block_last_and_keeps_the_rest():
    cfg = output_config({"model_type": "llama", "hidden_size": 8}, hf_quant_config(SCHEMES["FP8_PB_WO"], []))
    assert list(cfg) == ["model_type", "hidden_size", "quantization_config"]
