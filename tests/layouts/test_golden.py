"""Every golden layout case (marlin_*, cutlass_*, flashinfer_*, moe_*) reproduced byte for byte.

The expected tensors were made by vLLM 0.33.0 / FlashInfer 0.7.2 (golden/README.md); inputs are
checkpoint-format tensors. Each case is also unpacked back to its inputs."""

from __future__ import annotations

import os

import pytest
import torch

from quantize_cli import layouts as L
from quantize_cli.layouts import flashinfer as FI
from quantize_cli.schemes import SCHEMES
from tests.conftest import GOLDEN, assert_same_bytes, golden_case

from .helpers import inputs

BF16, FP16 = torch.bfloat16, torch.float16

# case -> (layout, algo, activation dtype, {expected name: our tensor name})
MARLIN_W = {"marlin_qweight": "weight_marlin", "marlin_scales": "weight_scale_marlin"}
MARLIN_NVFP4 = {**MARLIN_W, "marlin_global_scale": "weight_global_scale_marlin"}
DENSE = {
    "marlin_fp8_per_tensor_256x256": ("marlin", "FP8", BF16, MARLIN_W),
    "marlin_fp8_per_channel_256x384": ("marlin", "FP8_PER_CHANNEL_PER_TOKEN", BF16, MARLIN_W),
    "marlin_fp8_per_channel_fp16_256x256": ("marlin", "FP8_PER_CHANNEL_PER_TOKEN", FP16, MARLIN_W),
    "marlin_fp8_block128_256x384": ("marlin", "FP8_PB_WO", BF16, MARLIN_W),
    "marlin_fp8_block128_fp16_256x256": ("marlin", "FP8_PB_WO", FP16, MARLIN_W),
    "marlin_nvfp4_256x384": ("marlin", "NVFP4", BF16, MARLIN_NVFP4),
    "marlin_nvfp4_fused_qkv_k_proj": ("marlin", "NVFP4", BF16, MARLIN_NVFP4),
    "marlin_nvfp4_fp16_256x256": ("marlin", "NVFP4", FP16, MARLIN_NVFP4),
    "marlin_int8_w8a16_256x384": ("marlin", "INT8", BF16, MARLIN_W),
    "marlin_int8_w8a16_fp16_256x256": ("marlin", "INT8", FP16, MARLIN_W),
    "cutlass_nvfp4_swizzle_256x384": (
        "cutlass", "NVFP4", BF16, {"weight_padded": "weight_cutlass", "swizzled_weight_scale": "weight_scale_cutlass"}),
    "cutlass_nvfp4_swizzle_200x176": (
        "cutlass", "NVFP4", BF16, {"weight_padded": "weight_cutlass", "swizzled_weight_scale": "weight_scale_cutlass"}),
    "flashinfer_trtllm_nvfp4_shuffle_256x384": (
        "flashinfer", "NVFP4", BF16,
        {"weight_shuffled": "weight_flashinfer", "weight_scale_shuffled": "weight_scale_flashinfer"}),
}
# case -> (layout, algo); expected.<side>.<name> is compared with <side>.<name>_<layout>
MOE = {
    "moe_fp8_per_tensor_fi_trtllm_e4_i64_h128": ("flashinfer", "FP8"),
    "moe_nvfp4_fi_cutlass_e4_i64_h256": ("cutlass", "NVFP4"),
    "moe_nvfp4_fi_trtllm_e4_i64_h256": ("flashinfer", "NVFP4"),
    "moe_fp8_block128_fi_w31_e4_i128_h128": ("cutlass", "FP8_PB_WO"),
}
PREFIXES = ("marlin_", "cutlass_", "flashinfer_", "moe_")


def test_every_layout_case_is_covered():
    names = {f[: -len(".safetensors")] for f in os.listdir(os.path.join(GOLDEN, "tensors"))}
    layout_cases = {n for n in names if n.startswith(PREFIXES)}
    assert layout_cases == set(DENSE) | set(MOE)


def _plain(case: dict, layout: str) -> dict[str, torch.Tensor]:
    plain = inputs(case)
    if layout == "cutlass" and "weight_scale_2" not in plain:  # the swizzle cases carry no global
        plain["weight_scale_2"] = torch.tensor(1.0 / 2688)
    return plain


@pytest.mark.parametrize("name", sorted(DENSE))
def test_dense_case(name):
    layout, algo, act, names = DENSE[name]
    case = golden_case(name)
    plain = _plain(case, layout)
    packed = L.pack(layout, algo, plain, act)
    for exp, ours in names.items():
        assert_same_bytes(packed[ours], case[f"expected.{exp}"], f"{name}: {ours}")
    n, k = plain["weight"].shape
    specs = L.packed_specs(layout, algo, (n, 2 * k if "NVFP4" in algo else k), act)
    sfx = L.suffix(layout)
    assert {k: tuple(v.shape) for k, v in packed.items() if k.endswith(sfx)} == {
        k: s for k, (_, s) in specs.items() if k.endswith(sfx)}
    back = L.unpack(layout, algo, packed, act)
    assert set(back) == set(plain)
    for k in plain:
        assert_same_bytes(back[k], plain[k], f"{name}: unpack {k}")


@pytest.mark.parametrize("name", [n for n in DENSE if "nvfp4" in n and n.startswith("marlin")])
def test_marlin_scale_factor(name):
    """The data-dependent NVFP4 scale_factor (4.0 for the small k_proj scales, 1 for fp16)."""
    _, _, act, _ = DENSE[name]
    case = golden_case(name)
    sf = L.marlin.nvfp4_scale_factor(case["input.weight_scale"], act)
    assert_same_bytes(torch.tensor(sf, dtype=torch.float32), case["expected.scale_factor"], "scale_factor")


def _moe_inputs(case: dict, algo: str) -> tuple[dict, dict]:
    w13, w2 = inputs(case, "input.w13."), inputs(case, "input.w2.")
    if "weight" not in w2:  # the block-FP8 case stores no w2 weight (unchanged by the layout)
        e, two_i, h = w13["weight"].shape
        g = torch.Generator().manual_seed(0)
        w2["weight"] = torch.randint(0, 0x7F, (e, h, two_i // 2), generator=g, dtype=torch.uint8).view(
            torch.float8_e4m3fn)
    return w13, w2


@pytest.mark.parametrize("name", sorted(MOE))
def test_moe_case(name):
    layout, algo = MOE[name]
    case = golden_case(name)
    w13, w2 = _moe_inputs(case, algo)
    packed = L.pack_moe(layout, algo, w13, w2)
    compared = 0
    for key, exp in case.items():
        if not key.startswith("expected.") or key.endswith("_w3w1_linear"):
            continue
        side, tname = key[len("expected."):].split(".", 1)
        assert_same_bytes(packed[side][f"{tname}_{layout}"], exp, f"{name}: {key}")
        compared += 1
    assert compared >= 2
    if not any(k.startswith("expected.w2.weight") and k.endswith("weight") for k in case):  # unchanged w2
        assert_same_bytes(packed["w2"][f"weight_{layout}"], w2["weight"], "w2 weight unchanged")
    back = L.unpack_moe(layout, algo, packed)
    for side, plain in (("w13", w13), ("w2", w2)):
        assert set(back[side]) == set(plain)
        for k in plain:
            assert_same_bytes(back[side][k], plain[k], f"{name}: unpack {side}.{k}")


def test_moe_w3w1_linear_intermediate():
    """expected.w13.weight_scale_w3w1_linear: the scales after the w1/w3 reorder, before the swizzle."""
    case = golden_case("moe_nvfp4_fi_cutlass_e4_i64_h256")
    s = case["input.w13.weight_scale"]
    got = FI.swap_w13(s.view(torch.uint8)).view(s.dtype)
    assert_same_bytes(got, case["expected.w13.weight_scale_w3w1_linear"], "w3w1 linear scales")


@pytest.mark.parametrize("name", ["marlin_mxfp8_256x384", "marlin_mxfp8_192x160"])
def test_marlin_mxfp8_case(name):
    """vLLM 0.33's prepare_mxfp8_layer_for_marlin on ModelOpt exports (golden/mxfp8/README.md);
    192x160 is zero-padded to [192, 256]."""
    from safetensors.torch import load_file

    case = load_file(os.path.join(GOLDEN, "mxfp8", f"{name}.safetensors"))
    plain = inputs(case)
    packed = L.pack("marlin", "MXFP8", plain, BF16)
    assert_same_bytes(packed["weight_marlin"], case["expected.marlin_qweight"], f"{name}: weight")
    assert_same_bytes(packed["weight_scale_marlin"], case["expected.marlin_scales"], f"{name}: scales")
    assert_same_bytes(packed["weight_scale"], plain["weight_scale"], "plain e8m0 scales kept beside")
    specs = L.packed_specs("marlin", "MXFP8", tuple(plain["weight"].shape), BF16)
    assert {k: tuple(v.shape) for k, v in packed.items()} == {k: s for k, (_, s) in specs.items()}
    back = L.unpack("marlin", "MXFP8", packed, BF16)
    assert_same_bytes(back["weight"], plain["weight"], "unpack")
    n, k = plain["weight"].shape
    deq = L.dequantize("marlin", "MXFP8", packed, BF16)[:n, :k]
    assert torch.equal(deq, SCHEMES["MXFP8"].dequantize(plain))


def test_marlin_mxfp8_moe_case():
    """vLLM 0.33's prepare_mxfp8_moe_layer_for_marlin on ModelOpt MXFP8 experts (golden/mxfp8/README.md)."""
    from safetensors.torch import load_file

    case = load_file(os.path.join(GOLDEN, "mxfp8", "marlin_mxfp8_moe_e3_i64_h128.safetensors"))
    w13, w2 = inputs(case, "input.w13."), inputs(case, "input.w2.")
    packed = L.pack_moe("marlin", "MXFP8", w13, w2)
    for side in ("w13", "w2"):
        assert_same_bytes(packed[side]["weight_marlin"], case[f"expected.{side}.marlin_qweight"], f"{side} weight")
        assert_same_bytes(packed[side]["weight_scale_marlin"], case[f"expected.{side}.marlin_scales"], f"{side} scales")
    e, two_i, h = w13["weight"].shape
    specs = L.moe_packed_specs("marlin", "MXFP8", e, two_i // 2, h)
    assert {s: {k: tuple(v.shape) for k, v in d.items() if k.endswith("_marlin")} for s, d in packed.items()} == {
        s: {k: shape for k, (_, shape) in d.items()} for s, d in specs.items()}
    back = L.unpack_moe("marlin", "MXFP8", packed)
    assert_same_bytes(back["w13"]["weight"], w13["weight"], "unpack w13")
    assert_same_bytes(back["w2"]["weight"], w2["weight"], "unpack w2")
