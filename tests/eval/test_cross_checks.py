"""quantize eval against independent implementations.

* compressed-tensors outputs loaded by transformers itself (its compressed-tensors integration
  decompresses the weights and, per module, fake-quantizes the inputs): with our activation
  quantization off and theirs disabled the logits agree to fp32 rounding; with both on they agree
  exactly for the FP8 family and MXFP8, where compressed-tensors' QDQ is vLLM's arithmetic.
  Not for INT8 W8A8 (compressed-tensors' own QDQ scales tokens by amax / 127.5, vLLM's kernel by
  amax / 127) and NVFP4 activations (its QDQ rounds otherwise); NVFP4 weights it decompresses in
  bf16, which equal ours rounded to bf16 bit for bit.
* ModelOpt 0.47's fake-quant forward of its own golden exports (tests/golden/eval, made by
  generate.py there): equal to fp32 rounding where the two define the same math (NVFP4,
  W4A16_NVFP4, MXFP8); FP8_PB_WO weight-only differs only where ModelOpt's fake quantizer
  multiplies by 448 / amax and its exporter divides (a tie flips a code: 0.11% of the weights);
  elsewhere it differs by design, as modelopt_fakequant.json counts (see docs/accuracy.md).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import convert
from quantize_cli import api
from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors, write_checkpoint
from quantize_cli.eval import run_eval
from quantize_cli.eval.weights import open_served

# transformers warns that our dequantize=True overrides the checkpoint's loading attributes: that is the point
pytestmark = pytest.mark.filterwarnings("ignore:You passed `quantization_config`:UserWarning")
GOLDEN = os.path.join(os.path.dirname(__file__), "..", "golden")
VOCAB = 256


@pytest.fixture(scope="module")
def fp32_llama(tmp_path_factory) -> str:
    """fp32 source (compressed-tensors then stores fp32 scales, and transformers dequantizes in fp32)
    whose values are bf16 values, so a bf16 load of the unquantized tensors loses nothing."""
    cfg = llama_config(hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2, vocab=VOCAB)
    cfg["torch_dtype"] = "float32"
    tensors = {k: v.float() for k, v in llama_tensors(cfg, seed=3, dtype=torch.bfloat16).items()}
    return write_checkpoint(str(tmp_path_factory.mktemp("f32") / "src"), tensors, cfg)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (3, 40), generator=torch.Generator().manual_seed(1))
    path = tmp_path_factory.mktemp("data") / "d.jsonl"
    path.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in ids.tolist()))
    return str(path), ids


def ours(dst: str, path: str, weights_only: bool) -> torch.Tensor:
    caught = []
    run_eval(dst, data=path, device="cpu", weights_only=weights_only, observe=lambda d, s: caught.append(d))
    return torch.cat(caught)


def transformers_ct(dst: str, ids: torch.Tensor, act: bool, bf16_weights: bool = False) -> torch.Tensor:
    """transformers' logits for compressed-tensors checkpoint `dst`: dequantized at load (`act`
    False), or compressed-tensors' own input fake-quantization on (`act`), in fp32."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    if not act:
        model = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True))
    else:
        model = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.bfloat16 if bf16_weights else torch.float32)
    with torch.no_grad():
        if act and bf16_weights:  # compressed-tensors decompresses MX weights in bf16 on the first forward
            model(ids[:1, :2])
            torch.nn.Module.float(model)  # transformers refuses .float() on a quantized model
        return model.eval()(ids).logits[:, :-1].reshape(-1, VOCAB)


@pytest.mark.parametrize("algo, act_equal", [("FP8", True), ("FP8_PER_CHANNEL_PER_TOKEN", True), ("FP8_PB_WO", True),
                                             ("MXFP8", True), ("INT8", False)])
def test_compressed_tensors_loaded_by_transformers(tmp_path, fp32_llama, data, algo, act_equal):
    path, ids = data
    dst = convert(fp32_llama, str(tmp_path / "ct"), algo=algo, device="cpu", quiet=True, format="compressed-tensors").dst
    mine, theirs = ours(dst, path, True), transformers_ct(dst, ids, act=False)
    assert torch.allclose(mine, theirs, rtol=0, atol=1e-5), (mine - theirs).abs().max()
    mine, theirs = ours(dst, path, False), transformers_ct(dst, ids, act=True, bf16_weights=algo == "MXFP8")
    if act_equal:
        assert torch.allclose(mine, theirs, rtol=0, atol=1e-5), (mine - theirs).abs().max()
    else:  # W8A8: compressed-tensors' QDQ divides by amax / 127.5, vLLM's kernel by amax / 127
        assert 0 < (mine - theirs).abs().max() < 0.2


def test_compressed_tensors_nvfp4_weights_equal_theirs_in_bf16(tmp_path, fp32_llama, data):
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    path, ids = data
    dst = convert(fp32_llama, str(tmp_path / "ct"), algo="NVFP4", device="cpu", quiet=True, format="compressed-tensors").dst
    model = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True))
    served = open_served(dst)
    for name in served.linears:  # compressed-tensors dequantizes FP4 through bf16: ours rounded once to bf16, bit for bit
        assert torch.equal(served.weight(name).to(torch.bfloat16).float(), model.get_submodule(name).weight), name
    with torch.no_grad():
        theirs = model.eval()(ids).logits[:, :-1].reshape(-1, VOCAB)
    assert (ours(dst, path, True) - theirs).abs().max() < 2e-2  # their bf16 weights: about 2^-9 relative each


def golden_logits(algo: str) -> torch.Tensor:
    return load_file(os.path.join(GOLDEN, "eval", "modelopt_fakequant.safetensors"))[algo][:, :-1].reshape(-1, 512)


def eval_golden(algo: str, weights_only: bool) -> torch.Tensor:
    return ours(os.path.join(GOLDEN, "checkpoints", f"tiny-llama-{algo}"), os.path.join(GOLDEN, "eval", "eval_ids.jsonl"), weights_only)


@pytest.mark.parametrize("algo, weights_only", [("NVFP4", False), ("W4A16_NVFP4", False), ("MXFP8", False)])
def test_modelopt_fake_quant_equals_ours_where_the_math_is_the_same(algo, weights_only):
    facts = json.load(open(os.path.join(GOLDEN, "eval", "modelopt_fakequant.json")))[algo]
    assert facts["weight_elements_differing"] == 0  # ModelOpt's in-memory weights are the ones vLLM serves
    mine, theirs = eval_golden(algo, weights_only), golden_logits(algo)
    assert torch.allclose(mine, theirs, rtol=0, atol=1e-5), (mine - theirs).abs().max()


def test_modelopt_fp8_pb_wo_differs_only_by_its_fake_quantizer_ties():
    facts = json.load(open(os.path.join(GOLDEN, "eval", "modelopt_fakequant.json")))["FP8_PB_WO"]
    assert not facts["modelopt_quantizes_inputs"]  # weight-only in ModelOpt; vLLM quantizes 1x128 groups
    assert 0 < facts["weight_elements_differing"] < 0.002 * facts["weight_elements"]
    mine, theirs = eval_golden("FP8_PB_WO", True), golden_logits("FP8_PB_WO")
    assert torch.equal(mine.argmax(-1), theirs.argmax(-1)) and (mine - theirs).abs().max() < 1e-2
    served = eval_golden("FP8_PB_WO", False)
    assert (served - theirs).abs().max() > (mine - theirs).abs().max()  # the activation groups vLLM adds


@pytest.mark.parametrize("algo", ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "NVFP4-attn-FP8_PB_WO"])
def test_modelopt_where_the_math_differs_the_difference_is_the_documented_one(algo):
    facts = json.load(open(os.path.join(GOLDEN, "eval", "modelopt_fakequant.json")))[algo]
    assert facts["weight_elements_differing"] > 0  # FP8: vLLM requantizes q/k/v, gate/up to the max scale
    mine, theirs = eval_golden(algo, False), golden_logits(algo)
    kl = torch.nn.functional.kl_div(torch.log_softmax(mine, -1), torch.log_softmax(theirs, -1), log_target=True,
                                    reduction="batchmean")
    assert 0 < kl < 5e-3  # the same model within quantization noise, not the same numbers
