"""--layout end to end: packed outputs, stock-loader safety, config record, exact unpack round trip."""

import json
import os

import pytest

from tests.conftest import output_files
import torch
from safetensors.torch import load_file

from quantize_cli import layouts
from quantize_cli.api import unpack
from tests.conftest import convert
from quantize_cli.errors import PlanError
from quantize_cli.checkpoint.example_weights import qwen3_moe_config, qwen3_moe_tensors
from quantize_cli.schemes import SCHEMES
from quantize_cli.verify import verify_checkpoint

DENSE = [("marlin", "NVFP4"), ("marlin", "W4A16_NVFP4"), ("marlin", "FP8"), ("marlin", "FP8_PER_CHANNEL_PER_TOKEN"),
         ("marlin", "FP8_PB_WO"), ("marlin", "INT8"), ("cutlass", "NVFP4"), ("flashinfer", "NVFP4"), ("marlin", "MXFP8")]


def files(folder):
    return output_files(folder)


def tensors(folder):
    out = {}
    for f in os.listdir(folder):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(folder, f)))
    return out


@pytest.mark.parametrize("layout,algo", DENSE)
def test_dense_round_trip_is_byte_identical_to_a_plain_conversion(tiny_llama, tmp_path, layout, algo):
    convert(tiny_llama, str(tmp_path / "packed"), algo=algo, layout=layout, quiet=True)
    convert(tiny_llama, str(tmp_path / "plain"), algo=algo, quiet=True)
    unpack(str(tmp_path / "packed"), str(tmp_path / "unpacked"), quiet=True)
    assert files(tmp_path / "unpacked") == files(tmp_path / "plain")


@pytest.mark.parametrize("layout,algo", [("cutlass", "NVFP4"), ("flashinfer", "NVFP4"), ("flashinfer", "FP8"), ("cutlass", "FP8"),
                                         ("marlin", "MXFP8")])
def test_moe_stacks_round_trip(make_checkpoint, tmp_path, layout, algo):
    cfg = qwen3_moe_config()
    src = make_checkpoint(qwen3_moe_tensors(cfg, seed=3, fused_experts=True), cfg, shards=2)
    convert(src, str(tmp_path / "packed"), algo=algo, layout=layout, quiet=True)
    convert(src, str(tmp_path / "plain"), algo=algo, quiet=True)
    unpack(str(tmp_path / "packed"), str(tmp_path / "unpacked"), quiet=True)
    assert files(tmp_path / "unpacked") == files(tmp_path / "plain")
    packed = tensors(tmp_path / "packed")
    sfx = layouts.suffix(layout)
    assert f"model.layers.0.mlp.experts.w13_weight{sfx}" in packed
    assert not any(k.endswith(".weight") and ".experts." in k for k in packed)  # expert weights only in the stacks


def test_packed_checkpoint_makes_stock_loaders_fail_loudly(tiny_llama, tmp_path):
    """A loader that does not know the layout looks for <module>.weight and finds none."""
    convert(tiny_llama, str(tmp_path / "p"), algo="NVFP4", layout="marlin", quiet=True)
    t = tensors(tmp_path / "p")
    cfg = json.load(open(tmp_path / "p" / "config.json"))["quantization_config"]
    quantized = [m for m in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj")]
    for m in quantized:
        assert f"{m}.weight" not in t and f"{m}.weight_marlin" in t
        with pytest.raises(KeyError):
            t[f"{m}.weight"]  # what vLLM's ModelOpt loader would ask for
        assert f"{m}.weight_scale" in t and f"{m}.weight_scale_2" in t  # plain scales kept beside
    rec = cfg["layout"]
    assert rec["name"] == "marlin" and rec["activation_dtype"] == "bfloat16" and "vllm 0.33.0" in rec["target"]
    assert json.load(open(tmp_path / "p" / "hf_quant_config.json"))["converter"]["layout"]["name"] == "marlin"
    assert any(f.code == "packed" for f in verify_checkpoint(str(tmp_path / "p")).errors)


@pytest.mark.parametrize("layout,algo", [("marlin", "NVFP4"), ("marlin", "FP8_PB_WO"), ("marlin", "INT8"), ("cutlass", "NVFP4"), ("flashinfer", "NVFP4"),
                                         ("marlin", "MXFP8")])
def test_semantics_packed_operands_compute_the_plain_weight(tiny_llama, tmp_path, layout, algo):
    """A matmul reading the packed operands (through unpack + dequantization) equals the plain one
    exactly; the kernel's own view of the operands (layouts.dequantize: its order of products)
    agrees to fp32 rounding."""
    convert(tiny_llama, str(tmp_path / "packed"), algo=algo, layout=layout, quiet=True)
    convert(tiny_llama, str(tmp_path / "plain"), algo=algo, quiet=True)
    packed, plain = tensors(tmp_path / "packed"), tensors(tmp_path / "plain")
    for m in ("model.layers.0.self_attn.k_proj", "model.layers.1.mlp.gate_proj"):
        mine = {k[len(m) + 1 :]: v for k, v in packed.items() if k.startswith(m + ".")}
        ref = SCHEMES[algo].dequantize({k[len(m) + 1 :]: v for k, v in plain.items() if k.startswith(m + ".")})
        via_unpack = SCHEMES[algo].dequantize(layouts.unpack(layout, algo, mine, torch.bfloat16))
        n, k = ref.shape
        x = torch.randn(3, k, generator=torch.Generator().manual_seed(0))
        assert torch.equal(via_unpack, ref) and torch.equal(x @ via_unpack.T, x @ ref.T), m
        kernel_view = layouts.dequantize(layout, algo, mine, torch.bfloat16)[:n, :k]
        # Marlin keeps FP8/INT8 scales in the activation dtype (bf16): a lossy copy, hence the plain scales kept beside.
        rtol = 2**-8 if layout == "marlin" and "NVFP4" not in algo else 1e-6
        assert torch.allclose(kernel_view, ref, rtol=rtol, atol=0), m


# Every (layout, algo) whose dense kernel reads the plain bytes: one rule for all of them (issue 26;
# CUTLASS INT8 and FP8_PER_CHANNEL_PER_TOKEN used to be refused while FP8 / FP8_PB_WO warned).
NO_BYTES_MOVE = [("cutlass", "FP8"), ("cutlass", "FP8_PER_CHANNEL_PER_TOKEN"), ("cutlass", "INT8"),
                 ("flashinfer", "FP8")]


@pytest.mark.parametrize("layout,algo", NO_BYTES_MOVE)
def test_no_byte_movement_is_said_and_written_plain(tiny_llama, tmp_path, layout, algo):
    assert layouts.support(layout, algo).rule == "layout-no-bytes-move"
    res = convert(tiny_llama, str(tmp_path / "c"), algo=algo, layout=layout, quiet=True)
    assert any("no bytes move" in w and "writing the plain layout" in w for w in res.plan.warnings)
    convert(tiny_llama, str(tmp_path / "p"), algo=algo, quiet=True)
    assert files(tmp_path / "c") == files(tmp_path / "p")
    with pytest.raises(PlanError, match="--strict") as exc:  # the warning refuses under --strict, before any byte
        convert(tiny_llama, str(tmp_path / "s"), algo=algo, layout=layout, quiet=True, strict=True)
    assert any("writing the plain layout" in d for d in exc.value.details)
    assert not os.path.exists(tmp_path / "s")


def test_no_byte_movement_packs_moe_stacks_where_a_kernel_has_them_and_refuses_them_where_none(make_checkpoint, tmp_path):
    """The same rule on an MoE model: CUTLASS FP8 packs the expert stacks (dense written plain);
    CUTLASS INT8 has no MoE kernel, so its experts are refused by name, as any layout refuses them."""
    cfg = qwen3_moe_config()
    src = make_checkpoint(qwen3_moe_tensors(cfg), cfg, name="moe")
    res = convert(src, str(tmp_path / "fp8"), algo="FP8", layout="cutlass", quiet=True)
    assert any(k.endswith("w13_weight_cutlass") for k in tensors(tmp_path / "fp8"))
    assert not any("writing the plain layout" in w for w in res.plan.warnings)
    with pytest.raises(PlanError) as exc:
        convert(src, str(tmp_path / "int8"), algo="INT8", layout="cutlass", quiet=True)
    assert exc.value.details and all("mlp.experts" in d and "no cutlass MoE kernel for INT8" in d for d in exc.value.details)


def test_unsupported_combinations_are_refused_with_the_reason(tiny_llama, tmp_path):
    with pytest.raises(PlanError) as exc:
        convert(tiny_llama, str(tmp_path / "o"), algo="W4A16_NVFP4", layout="flashinfer", quiet=True)
    assert "weight-only" in exc.value.details[0]
    assert not os.path.exists(tmp_path / "o")


def test_mxfp8_marlin_refusals(make_checkpoint, tiny_llama, tmp_path):
    """MXFP8: Marlin needs bf16 activations (vLLM serves MXFP8 with bf16 only); the Blackwell
    layouts and Marlin MoE stacks that vLLM would pad are refused with the reason, before anything
    is written."""
    with pytest.raises(PlanError) as exc:
        convert(tiny_llama, str(tmp_path / "o"), algo="MXFP8", layout="cutlass", quiet=True)
    assert "FlashInfer's MXFP8" in exc.value.details[0]
    cfg = dict(qwen3_moe_config(), moe_intermediate_size=96)
    moe = make_checkpoint(qwen3_moe_tensors(cfg, seed=1), cfg, shards=1, name="moe")
    with pytest.raises(PlanError) as exc:
        convert(moe, str(tmp_path / "o"), algo="MXFP8", layout="marlin", quiet=True)
    assert any("Marlin MXFP8 MoE needs intermediate % 64 == 0" in d for d in exc.value.details)
    cfg16 = dict(json.load(open(os.path.join(tiny_llama, "config.json"))), torch_dtype="float16")
    fp16 = make_checkpoint(tensors(tiny_llama), cfg16, shards=1, name="fp16")
    with pytest.raises(PlanError) as exc:
        convert(fp16, str(tmp_path / "o"), algo="MXFP8", layout="marlin", quiet=True)
    assert any("bfloat16 activations only" in d for d in exc.value.details)
    assert not os.path.exists(tmp_path / "o")


def test_unpack_refuses_a_plain_checkpoint(tiny_llama, tmp_path):
    from quantize_cli.errors import SourceError

    convert(tiny_llama, str(tmp_path / "plain"), algo="FP8", quiet=True)
    with pytest.raises(SourceError, match="already a plain checkpoint"):
        unpack(str(tmp_path / "plain"), str(tmp_path / "u"), quiet=True)
