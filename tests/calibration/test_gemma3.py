"""Gemma 3 (issue 37's second decoder) against transformers' own Gemma3ForCausalLM: a sliding-window
layer then a full one (window 4 < the samples' 12 tokens), head_dim 32 != hidden / heads,
query_pre_attn_scalar, q/k norms, (1 + w) norms (randomised), the sqrt(hidden) embedding scale and
the tied lm_head. Eval's streamed logits, the smoothing fold and the quantized outputs are checked
against a whole-model forward; calibration's amax is in tests/calibration/test_streamed.py."""

from __future__ import annotations

import json

import pytest
import torch

from quantize_cli.calibration import smooth
from quantize_cli.eval import run_eval
from quantize_cli.schemes import SCHEMES
from tests.calibration import builders
from tests.conftest import convert, load_all

SAMPLES = [[5, 17, 99, 3, 250, 7, 8, 9, 310, 1, 44, 45], [42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53],
           [1, 2, 3, 200, 100, 50, 25, 12, 6, 3, 1, 0]]


def jsonl(path, samples=SAMPLES) -> str:
    path.write_text("".join(json.dumps({"input_ids": s}) + "\n" for s in samples))
    return str(path)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> str:
    """hidden 128, intermediate 256, q 128: whole INT4 groups of 128 in every Linear."""
    return builders.gemma3(str(tmp_path_factory.mktemp("gemma3") / "src"), hidden=128, intermediate=256)


def whole_model(folder, swap=None) -> torch.Tensor:
    """transformers' own fp32 forward of each sample, scored positions only; `swap(model)` may replace weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.config.sliding_window < len(SAMPLES[0])
    if swap:
        swap(model)
    with torch.no_grad():
        return torch.cat([model(torch.tensor([s])).logits[0, :-1] for s in SAMPLES])


def logits_of(dst, tmp_path, **kw) -> tuple[torch.Tensor, object]:
    caught = []
    res = run_eval(dst, device="cpu", data=jsonl(tmp_path / "d.jsonl"), observe=lambda d, s: caught.append(d), **kw)
    return torch.cat(caught), res


def test_eval_streamed_logits_equal_transformers(gemma, tmp_path):
    ours, res = logits_of(gemma, tmp_path, source=gemma)
    ref = whole_model(gemma)
    assert torch.allclose(ours, ref, rtol=0, atol=1e-5), (ours - ref).abs().max()
    assert res.metrics["kl_mean"] == 0 and len(res.layers) == 2


@pytest.mark.parametrize("algo", ["INT4", "W4A16_NVFP4"])
def test_quantized_eval_equals_transformers_with_dequantized_weights(gemma, tmp_path, algo):
    dst = convert(gemma, str(tmp_path / "dst"), algo=algo, device="cpu", quiet=True).dst
    written = load_all(dst)
    assert not any(k.startswith("lm_head") for k in written)  # tied to the embeddings, which stay as they are

    def swap(model):
        n = 0
        for name, mod in model.named_modules():
            if f"{name}.weight_scale" in written:
                leaves = {k.rsplit(".", 1)[1]: v for k, v in written.items() if k.rsplit(".", 1)[0] == name}
                mod.weight.data = SCHEMES[algo].dequantize(leaves).float()
                n += 1
        assert n == 14  # q k v o gate up down, two layers

    ours, _ = logits_of(dst, tmp_path, weights_only=True)
    ref = whole_model(gemma, swap)
    assert torch.allclose(ours, ref, rtol=0, atol=2e-5), (ours - ref).abs().max()
    # against its source: ModelOpt's INT4 weight [N/2, K] (two rows a byte) is SRC's [N, K], not another model
    m = run_eval(dst, source=gemma, data=jsonl(tmp_path / "d.jsonl"), device="cpu").metrics
    assert 0 < m["kl_mean"] < 1 and m["source_perplexity"] != m["perplexity"]


def test_smoothing_fold_preserves_gemmas_function(gemma):
    """The (1 + w) norms take the scales as 1 + w' = (1 + w) / s; pre_feedforward_layernorm (not
    post_attention_layernorm, which normalises the attention's output) feeds the MLP."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(gemma, dtype=torch.float32).eval()

    def check(maps, folded):
        assert [(m.prev, m.offset) for m in maps] == [("input_layernorm", 1.0), ("self_attn.v_proj", 0.0),
                                                      ("pre_feedforward_layernorm", 1.0), ("mlp.up_proj", 0.0)]

    builders.fold_random_scales_keeps_logits(model, SAMPLES[0], check)


def test_norm_offset_reads_the_module():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    assert smooth.norm_offset(Gemma3RMSNorm(16)) == 1.0
    assert smooth.norm_offset(LlamaRMSNorm(16)) == 0.0
    assert smooth.norm_offset(torch.nn.LayerNorm(16)) == 0.0
    assert smooth.norm_offset(torch.nn.Linear(16, 16)) is None  # a 2-D weight: not a norm


@pytest.mark.parametrize("method", ["awq", "smoothquant"])
def test_smooth_and_gptq_convert_smooth_the_gemma_norms(gemma, tmp_path, method):
    data = jsonl(tmp_path / "c.jsonl")
    res = convert(gemma, str(tmp_path / "out"), algo="W4A16_NVFP4", calib_data=data, smooth=method, rounding="gptq",
                  device="cpu", quiet=True, verify=True)
    out, source = load_all(res.dst), load_all(gemma)
    for norm in ("input_layernorm", "pre_feedforward_layernorm"):
        name = f"model.layers.1.{norm}.weight"
        assert not torch.equal(out[name], source[name]), name
    for norm in ("post_attention_layernorm", "post_feedforward_layernorm"):  # outputs of sublayers: never folded
        name = f"model.layers.1.{norm}.weight"
        assert torch.equal(out[name], source[name]), name
    conv = json.load(open(tmp_path / "out" / "hf_quant_config.json"))["converter"]["weights"]
    assert conv["smoothed_mappings"] == (8 if method == "awq" else 4)
    m = run_eval(res.dst, source=gemma, data=data, device="cpu").metrics
    assert 0 < m["kl_mean"] < 1
