"""describe.py's readers can fail: each check, given an output with one planted fault, names it.

The matrix cells prove the checks pass on right outputs; these prove they would not pass on wrong ones
(a module's bytes, an exclusion list, a fused group's shared scale, a scale's shape, the card's table).
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.hostile.helpers import invoke

from .describe import (CT, Output, algo_in_bytes, algos_in_bytes, check_kept, check_weight_scales, expected_algos, leaves,
                       linear_modules)

EXCLUDE = "model.layers.0.self_attn*"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """W4A16_NVFP4 (ModelOpt) of the dense example and INT4_ASYM (compressed-tensors) of the MoE one, both with
    layer 0's attention excluded."""
    root, made = tmp_path_factory.mktemp("describe"), {}
    for name, model, algo, fmt in (("dense", "tiny-llama", "W4A16_NVFP4", "modelopt"), ("moe", "tiny-qwen3-moe", "INT4_ASYM", CT)):
        dst = str(root / name)
        r = invoke("convert", f"example:{model}", "-o", dst, "--algo", algo, "--format", fmt, "--exclude", EXCLUDE, "--device", "cpu", "-q")
        assert r.exit_code == 0, r.stderr
        made[name] = (Output.read(dst), model, algo, fmt)
    return made


def _problems(check, out, *args) -> list:
    problems: list = []
    check(out, *args, problems)
    return problems


def test_right_outputs_pass_and_every_linear_is_read(outputs):
    for out, model, algo, fmt in outputs.values():
        assert algos_in_bytes(out) == expected_algos(algo, None, model, EXCLUDE)
        assert not _problems(check_kept, out, fmt, model) and not _problems(check_weight_scales, out, fmt, model)
    moe = linear_modules("tiny-qwen3-moe")
    assert "model.layers.1.mlp.experts.3.down_proj" in moe and "model.layers.1.mlp.gate" not in moe and "lm_head" not in moe


def test_an_excluded_module_with_other_bytes_is_named(outputs):
    out, model, _, fmt = outputs["dense"]
    bad = copy.copy(out)
    bad.tensors = {**out.tensors, "model.layers.0.self_attn.v_proj.weight": out.tensors["model.layers.0.self_attn.v_proj.weight"] * 2}
    assert any("differ from the source" in p for p in _problems(check_kept, bad, fmt, model))


def test_an_exclusion_list_missing_a_kept_module_is_named(outputs):
    out, model, _, fmt = outputs["moe"]
    bad = copy.deepcopy(out)
    bad.config["quantization_config"]["ignore"].remove("model.layers.0.self_attn.k_proj")
    assert any("misses kept ['model.layers.0.self_attn.k_proj']" in p for p in _problems(check_kept, bad, fmt, model))
    bad = copy.deepcopy(out)
    bad.card = bad.card.replace("| `model.layers.0.self_attn.q_proj` |", "| `model.layers.0.mlp.gate` |")
    assert any(p.startswith("card: Kept unquantized") for p in _problems(check_kept, bad, fmt, model))


def test_a_split_fused_scale_and_a_wrong_shape_are_named(outputs):
    out, model, _, fmt = outputs["dense"]
    bad = copy.copy(out)
    bad.tensors = {**out.tensors, "model.layers.1.self_attn.k_proj.weight_scale_2": out.tensors["model.layers.1.self_attn.k_proj.weight_scale_2"] * 2}
    assert any("different per-tensor scales" in p for p in _problems(check_weight_scales, bad, fmt, model))
    out, model, _, fmt = outputs["moe"]
    name = "model.layers.1.mlp.experts.2.up_proj.weight_zero_point"
    bad = copy.copy(out)
    bad.tensors = {**out.tensors, name: out.tensors[name][:1]}
    assert any("experts.2.up_proj (INT4_ASYM" in p for p in _problems(check_weight_scales, bad, fmt, model))


def test_the_algorithm_is_read_from_the_tensors_alone():
    """Leaves, dtypes and shapes decide it (no config): the per-row FP8 scale against a 128x128 block grid."""
    fp8 = torch.zeros(256, 128, dtype=torch.float8_e4m3fn)
    assert algo_in_bytes({"weight": fp8, "weight_scale": torch.ones(256)}) == "FP8_PER_CHANNEL_PER_TOKEN"
    assert algo_in_bytes({"weight": fp8, "weight_scale": torch.ones(2, 1)}) == "FP8_PB_WO"  # K = 128: one block column
    assert algo_in_bytes({"weight": fp8, "weight_scale": torch.ones(())}) == "FP8"
    assert algo_in_bytes({"weight": fp8, "weight_scale": torch.ones(256, 4, dtype=torch.uint8)}) == "MXFP8"
    assert algo_in_bytes({"weight": torch.zeros(256, 128, dtype=torch.int8), "weight_scale": torch.ones(256)}) == "INT8"
    assert algo_in_bytes({"weight": torch.zeros(128, 128, dtype=torch.uint8), "weight_scale": torch.ones(256, 1)}) == "INT4"
    assert algo_in_bytes({"weight": torch.zeros(256, 64, dtype=torch.uint8), "weight_scale_2": torch.ones(())}) == "W4A16_NVFP4"
    assert algo_in_bytes({"weight_scale_2": torch.ones(()), "input_scale": torch.ones(())}) == "NVFP4"
    assert algo_in_bytes({"weight": torch.zeros(4, 4)}) is None
    assert set(leaves({"a.b.weight": 0, "a.b.weight_scale": 1})) == {"a.b"}
