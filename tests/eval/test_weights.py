"""What vLLM multiplies, read from written tensors (eval/weights.py): hand-made checkpoints whose
scales disagree where vLLM merges them, so every merge rule is visible in the numbers."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import convert
from quantize_cli import api
from quantize_cli.eval.weights import open_served
from quantize_cli.schemes import SCHEMES

E4M3 = torch.float8_e4m3fn


def write(folder, tensors: dict, quant: dict | None = None, ct: dict | None = None) -> str:
    """A checkpoint folder: ModelOpt (`quant`: hf_quant_config's "quantization") or compressed-tensors (`ct`)."""
    os.makedirs(folder, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(folder, "model.safetensors"))
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1}
    if quant is not None:
        config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": quant["quant_algo"]}
        with open(os.path.join(folder, "hf_quant_config.json"), "w") as f:
            json.dump({"producer": {"name": "modelopt", "version": "0.47.0"}, "quantization": quant}, f)
    if ct is not None:
        config["quantization_config"] = ct
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return str(folder)


def s(v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32)


ATTN = "model.layers.0.self_attn"


def fp8_qkv(scales: dict, inputs: dict) -> dict:
    codes = torch.tensor([[1.125, -3.0], [448.0, 0.0]]).to(E4M3)
    out = {}
    for p, sc in scales.items():
        out.update({f"{ATTN}.{p}.weight": codes.clone(), f"{ATTN}.{p}.weight_scale": s(sc), f"{ATTN}.{p}.input_scale": s(inputs[p])})
    return out


def test_fp8_fused_layer_is_requantized_to_the_max_scale(tmp_path):
    folder = write(tmp_path / "c", fp8_qkv({"q_proj": 0.3, "k_proj": 1.0, "v_proj": 0.25}, {"q_proj": 0.1, "k_proj": 0.2, "v_proj": 0.05}),
                   {"quant_algo": "FP8", "exclude_modules": []})
    served = open_served(folder)
    # q: fp16(1.125 * 0.3) = 0.33740234375, requantized with the max scale 1.0 -> e4m3 0.34375 (a second rounding)
    assert served.weight(f"{ATTN}.q_proj")[0].tolist() == [0.34375, -0.875]  # -0.9 -> -0.875
    assert served.weight(f"{ATTN}.k_proj").tolist() == [[1.125, -3.0], [448.0, 0.0]]  # the max scale's member: as written
    rules = {p: served.linears[f"{ATTN}.{p}"].act for p in ("q_proj", "k_proj", "v_proj")}
    assert {r.kind for r in rules.values()} == {"fp8_tensor"} and {r.scale for r in rules.values()} == {float(s(0.2))}


def test_fp8_equal_scales_are_served_as_written(tmp_path):
    folder = write(tmp_path / "c", fp8_qkv({"q_proj": 0.3, "k_proj": 0.3, "v_proj": 0.3}, {"q_proj": 1.0, "k_proj": 1.0, "v_proj": 1.0}),
                   {"quant_algo": "FP8", "exclude_modules": []})
    w = open_served(folder).weight(f"{ATTN}.q_proj")
    assert torch.equal(w, torch.tensor([[1.125, -3.0], [448.0, 0.0]]) * s(0.3))


def nvfp4_module(prefix: str, wsf2: float, input_scale: float | None, n: int = 2) -> dict:
    codes = torch.arange(16, dtype=torch.uint8).repeat(n, 1)  # every E2M1 code once per row
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    out = {f"{prefix}.weight": packed, f"{prefix}.weight_scale": torch.full((n, 1), 2.0).to(E4M3),
           f"{prefix}.weight_scale_2": s(wsf2)}
    if input_scale is not None:
        out[f"{prefix}.input_scale"] = s(input_scale)
    return out


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def test_nvfp4_fused_layer_takes_the_max_global_scale_without_rescaling(tmp_path):
    t = {**nvfp4_module(f"{ATTN}.q_proj", 0.01, 0.5), **nvfp4_module(f"{ATTN}.k_proj", 0.02, 0.25),
         **nvfp4_module(f"{ATTN}.v_proj", 0.005, 0.125)}
    served = open_served(write(tmp_path / "c", t, {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": []}))
    for p in ("q_proj", "k_proj", "v_proj"):  # block scale 2 * the layer's max weight_scale_2 0.02, for every member
        assert served.weight(f"{ATTN}.{p}")[0].tolist() == [v * 2.0 * float(s(0.02)) for v in E2M1]
        rule = served.linears[f"{ATTN}.{p}"].act
        assert rule.kind == "nvfp4" and rule.scale == 1.0 / float(s(0.5))  # 1 / max input_scale


def test_nvfp4_experts_use_the_gate_global_scale_and_one_input_scale_per_layer(tmp_path):
    e = "model.layers.0.mlp.experts"
    t = {}
    for i, (g, u, d) in enumerate(((0.01, 0.04, 0.02), (0.03, 0.03, 0.05))):
        t.update(nvfp4_module(f"{e}.{i}.gate_proj", g, 0.1 * (i + 1)))
        t.update(nvfp4_module(f"{e}.{i}.up_proj", u, 0.1 * (i + 1)))
        t.update(nvfp4_module(f"{e}.{i}.down_proj", d, 0.7 - 0.1 * i))
    served = open_served(write(tmp_path / "c", t, {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": []}))
    assert served.weight(f"{e}.0.up_proj")[0, 1] == 0.5 * 2.0 * float(s(0.01))  # w3 with w1's (gate's) scale, not 0.04
    assert served.weight(f"{e}.0.down_proj")[0, 1] == 0.5 * 2.0 * float(s(0.02))
    assert served.linears[f"{e}.0.gate_proj"].act.scale == 1.0 / float(s(0.2))  # max over the layer's experts (w13 side)
    assert served.linears[f"{e}.1.down_proj"].act.scale == 1.0 / float(s(0.7))  # w2 side


def test_compressed_tensors_nvfp4_divides_by_the_largest_global_scale(tmp_path):
    t = {}
    for p, g, gin in (("q_proj", 100.0, 10.0), ("k_proj", 200.0, 20.0), ("v_proj", 50.0, 5.0)):
        m = nvfp4_module(f"{ATTN}.{p}", 0.0, None)
        t.update({f"{ATTN}.{p}.weight_packed": m[f"{ATTN}.{p}.weight"], f"{ATTN}.{p}.weight_scale": m[f"{ATTN}.{p}.weight_scale"],
                  f"{ATTN}.{p}.weight_global_scale": s(g).reshape(1), f"{ATTN}.{p}.input_global_scale": s(gin).reshape(1)})
    from quantize_cli.formats.ct_config import quantization_config

    served = open_served(write(tmp_path / "c", t, ct=quantization_config("NVFP4", [])))
    assert served.fmt == "compressed-tensors" and served.format.name == "compressed-tensors"
    assert served.weight(f"{ATTN}.q_proj")[0, 1] == 0.5 * 2.0 / 200.0  # vLLM: 1 / max(weight_global_scale)
    assert served.linears[f"{ATTN}.k_proj"].act.scale == 20.0  # vLLM: max(input_global_scale)


def test_mixed_precision_reads_each_layer_algorithm(tmp_path):
    t = {**nvfp4_module(f"{ATTN}.q_proj", 0.01, 0.5), f"model.layers.0.mlp.down_proj.weight": torch.ones(2, 32).to(E4M3),
         f"model.layers.0.mlp.down_proj.weight_scale": torch.ones(2)}
    quant = {"quant_algo": "MIXED_PRECISION", "quantized_layers": {f"{ATTN}.q_proj": {"quant_algo": "NVFP4", "group_size": 16},
                                                                     "model.layers.0.mlp.down_proj": {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}}}
    served = open_served(write(tmp_path / "c", t, quant))
    assert served.linears[f"{ATTN}.q_proj"].algo == "NVFP4"
    assert served.linears["model.layers.0.mlp.down_proj"].act.kind == "fp8_token"
    assert open_served(str(tmp_path / "c"), weights_only=True).linears[f"{ATTN}.q_proj"].act.kind == "none"


def test_a_static_algorithm_without_input_scale_is_refused(tmp_path):
    t = fp8_qkv({"q_proj": 1.0, "k_proj": 1.0, "v_proj": 1.0}, {"q_proj": 1.0, "k_proj": 1.0, "v_proj": 1.0})
    t = {k: v for k, v in t.items() if not k.endswith("input_scale")}
    from quantize_cli.errors import SourceError

    with pytest.raises(SourceError, match="static input scale"):
        open_served(write(tmp_path / "c", t, {"quant_algo": "FP8", "exclude_modules": []}))


@pytest.mark.parametrize("algo, layout", [("NVFP4", "cutlass"), ("NVFP4", "flashinfer"), ("NVFP4", "marlin"), ("FP8", "marlin"),
                                          ("MXFP8", "marlin")])
def test_packed_layouts_serve_the_plain_weights(tmp_path, tiny_llama, algo, layout):
    plain = convert(tiny_llama, str(tmp_path / "plain"), algo=algo, device="cpu", quiet=True).dst
    packed = convert(tiny_llama, str(tmp_path / "packed"), algo=algo, device="cpu", quiet=True, layout=layout).dst
    a, b = open_served(plain), open_served(packed)
    assert b.layout == layout and set(a.linears) == set(b.linears) and a.linears
    for name in a.linears:
        assert torch.equal(a.weight(name), b.weight(name)), name
        assert a.linears[name].act == b.linears[name].act


def test_packed_moe_experts_serve_the_plain_weights(tmp_path):
    from quantize_cli.checkpoint.examples import example_path

    src = example_path("tiny-qwen3-moe")
    plain = convert(src, str(tmp_path / "plain"), algo="NVFP4", device="cpu", quiet=True).dst
    packed = convert(src, str(tmp_path / "packed"), algo="NVFP4", device="cpu", quiet=True, layout="flashinfer").dst
    a, b = open_served(plain), open_served(packed)
    experts = [n for n in a.linears if ".experts." in n]
    assert experts and set(a.linears) == set(b.linears)
    for name in experts:
        assert torch.equal(a.weight(name), b.weight(name)), name


def test_served_weight_is_the_scheme_dequantization_for_an_ordinary_conversion(tmp_path, tiny_llama):
    from tests.conftest import load_all

    for algo in ("FP8_PB_WO", "INT8", "W4A16_NVFP4", "INT4"):  # INT4: ModelOpt's quant_algo W4A16_AWQ
        dst = convert(tiny_llama, str(tmp_path / algo), algo=algo, device="cpu", quiet=True).dst
        served, tensors = open_served(dst), load_all(dst)
        assert served.linears["model.layers.1.mlp.down_proj"].algo == algo
        name = "model.layers.1.mlp.down_proj"
        leaves = {k.rsplit(".", 1)[1]: v for k, v in tensors.items() if k.rsplit(".", 1)[0] == name}
        assert torch.equal(served.weight(name), SCHEMES[algo].dequantize(leaves).float())
        assert served.linears[name].act.kind == "none" if algo != "FP8_PB_WO" else served.linears[name].act.kind == "fp8_group"
