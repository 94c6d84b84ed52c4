"""run_eval end to end on small transformers models made in tmp_path: the streamed pass equals a
whole-model forward, quantized Linears equal transformers with dequantized weights, per-layer
error locates the loss, memory stays at two blocks, MoE and encoders, data and its overlap."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import convert
from quantize_cli import api
from quantize_cli.eval import run_eval
from quantize_cli.schemes import SCHEMES
from tests.calibration import builders
from tests.conftest import load_all

SAMPLES = [[5, 17, 99, 3, 250, 7, 8, 9, 310, 1, 44, 45], [42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53],
           [1, 2, 3, 200, 100, 50, 25, 12, 6, 3, 1, 0]]


def jsonl(path, samples=SAMPLES) -> str:
    with open(path, "w") as f:
        for ids in samples:
            f.write(json.dumps({"input_ids": ids}) + "\n")
    return str(path)


def logits_of(dst, **kw) -> tuple[torch.Tensor, object]:
    caught = []
    result = run_eval(dst, device="cpu", observe=lambda d, s: caught.append((d, s)), **kw)
    return torch.cat([d for d, _ in caught]), result


def whole_model(folder, samples, swap=None) -> torch.Tensor:
    """transformers' own fp32 forward of every sample (no streaming), scored positions only;
    `swap(model)` may replace weights first."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    if swap:
        swap(model)
    with torch.no_grad():
        return torch.cat([model(torch.tensor([s])).logits[0, :-1] for s in samples])


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    return builders.llama(str(tmp_path_factory.mktemp("llama") / "src"))


def test_streamed_pass_equals_a_whole_model_forward(tmp_path, llama):
    ours, res = logits_of(llama, source=llama, data=jsonl(tmp_path / "d.jsonl"))
    ref = whole_model(llama, SAMPLES)
    assert torch.allclose(ours, ref, rtol=0, atol=1e-5), (ours - ref).abs().max()
    m = res.metrics  # the source against itself: identical
    assert m["kl_mean"] == 0 and m["top1_agreement"] == 1 and m["perplexity"] == m["source_perplexity"]
    nll = torch.nn.functional.cross_entropy(ref, torch.tensor([t for s in SAMPLES for t in s[1:]]))
    assert abs(m["nll"] - nll.item()) < 1e-5 and m["positions"] == sum(len(s) - 1 for s in SAMPLES)
    assert all(r["hidden_rel_error"] == 0 and r["own_rel_error"] == 0 for r in res.layers) and len(res.layers) == 3


@pytest.mark.parametrize("algo", ["FP8_PB_WO", "NVFP4", "FP8", "MXFP8", "INT8"])
def test_weights_only_equals_transformers_with_dequantized_weights(tmp_path, algo):
    src = builders.llama(str(tmp_path / "src"))  # hidden 64: FP8_PB_WO needs 128
    if algo == "FP8_PB_WO":
        src = _llama128(tmp_path)
    dst = convert(src, str(tmp_path / "dst"), algo=algo, device="cpu", quiet=True).dst
    written = load_all(dst)  # safetensors' own reader, the scheme's dequantize: no code of eval/

    def swap(model):
        for name, mod in model.named_modules():
            if f"{name}.weight_scale" in written:
                leaves = {k.rsplit(".", 1)[1]: v for k, v in written.items() if k.rsplit(".", 1)[0] == name}
                mod.weight.data = SCHEMES[algo].dequantize(leaves).float()

    ours, res = logits_of(dst, data=jsonl(tmp_path / "d.jsonl"), weights_only=True)
    ref = whole_model(src, SAMPLES, swap)
    assert torch.allclose(ours, ref, rtol=0, atol=2e-5), (ours - ref).abs().max()
    served, _ = logits_of(dst, data=jsonl(tmp_path / "d.jsonl"))  # activation quantization changes the logits
    assert algo == "INT8" or not torch.equal(served, ours)  # (ModelOpt INT8 is W8A16: weight-only anyway)


def _llama128(tmp_path) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=128, vocab_size=builders.VOCAB, tie_word_embeddings=False)
    return builders.save(LlamaForCausalLM(cfg), str(tmp_path / "src128"), with_tokenizer=False)


def test_per_layer_error_points_at_the_quantized_layer_and_two_blocks_at_a_time(tmp_path, llama):
    dst = convert(llama, str(tmp_path / "dst"), algo="FP8_PER_CHANNEL_PER_TOKEN", device="cpu", quiet=True,
                      exclude=["model.layers.0.*", "model.layers.2.*"]).dst
    res = run_eval(dst, source=llama, data=jsonl(tmp_path / "d.jsonl"), device="cpu")
    l0, l1, l2 = res.layers
    assert l0["hidden_rel_error"] == 0 and l0["own_rel_error"] == 0  # unquantized, exact inputs
    assert l1["own_rel_error"] > 0 and l1["hidden_rel_error"] > 0
    assert l2["own_rel_error"] == 0 and l2["hidden_rel_error"] > 0  # exact itself, but fed layer 1's error
    assert res.run["peak_blocks_materialized"] == 2  # one block of each model, whatever the depth
    alone = run_eval(dst, data=jsonl(tmp_path / "d.jsonl"), device="cpu")
    assert alone.run["peak_blocks_materialized"] == 1 and alone.layers == [] and "source_perplexity" not in alone.metrics
    assert abs(alone.metrics["perplexity"] - res.metrics["perplexity"]) < 1e-4 * res.metrics["perplexity"]


def test_moe_experts_weights_only_equal_transformers(tmp_path):
    src = builders.qwen3_moe(str(tmp_path / "src"))
    dst = convert(src, str(tmp_path / "dst"), algo="NVFP4", device="cpu", quiet=True).dst
    written = load_all(dst)

    def deq(name):
        return SCHEMES["NVFP4"].dequantize({k.rsplit(".", 1)[1]: v for k, v in written.items() if k.rsplit(".", 1)[0] == name}).float()

    def swap(model):
        for name, mod in model.named_modules():
            if f"{name}.weight_scale" in written:
                mod.weight.data = deq(name)
            if hasattr(mod, "gate_up_proj") and getattr(mod, "gate_up_proj").dim() == 3:
                for e in range(mod.gate_up_proj.shape[0]):
                    mod.gate_up_proj.data[e] = torch.cat([deq(f"{name}.{e}.gate_proj"), deq(f"{name}.{e}.up_proj")])
                    mod.down_proj.data[e] = deq(f"{name}.{e}.down_proj")

    ours, _ = logits_of(dst, data=jsonl(tmp_path / "d.jsonl"), weights_only=True)
    ref = whole_model(src, SAMPLES, swap)
    assert torch.allclose(ours, ref, rtol=0, atol=2e-5), (ours - ref).abs().max()
    res = run_eval(dst, source=src, data=jsonl(tmp_path / "d.jsonl"), device="cpu")
    assert res.checkpoint["served"][0]["activations"] == "nvfp4, static" and 0 < res.metrics["kl_mean"] < 1


def test_encoder_reports_embedding_cosine(tmp_path):
    src = builders.bert(str(tmp_path / "src"))
    dst = convert(src, str(tmp_path / "dst"), algo="FP8", device="cpu", quiet=True).dst
    res = run_eval(dst, source=src, data=jsonl(tmp_path / "d.jsonl"), device="cpu")
    assert res.kind == "encoder" and 0.9 < res.metrics["embedding_cosine_mean"] < 1.0
    assert res.metrics["samples"] == 3 and res.metrics["embedding_cosine_min"] <= res.metrics["embedding_cosine_mean"]
    same = run_eval(src, source=src, data=jsonl(tmp_path / "d.jsonl"), device="cpu")
    assert same.metrics["embedding_cosine_min"] == pytest.approx(1.0, abs=1e-6)
    from quantize_cli.errors import UsageError

    with pytest.raises(UsageError, match="encoder"):
        run_eval(dst, source=src, data=jsonl(tmp_path / "d.jsonl"), device="cpu", max_kl=0.1)


def test_default_data_scores_every_token_of_the_held_out_text_once(llama):
    from importlib import resources

    from transformers import AutoTokenizer

    from quantize_cli.eval.data import load_eval_samples

    text = resources.files("quantize_cli.eval").joinpath("default_eval.txt").read_text(encoding="utf-8")
    calib = resources.files("quantize_cli.calibration").joinpath("default_calibration.txt").read_text(encoding="utf-8")
    assert not {p.strip() for p in text.split("\n\n")} & {p.strip() for p in calib.split("\n\n")}  # held out
    ids = AutoTokenizer.from_pretrained(llama)(text, add_special_tokens=False)["input_ids"]
    samples, meta = load_eval_samples("default", llama, builders.VOCAB, 10_000, 128)
    assert [t for s in samples for t in s] == ids and all(len(s) == 128 for s in samples[:-1])
    assert meta["tokens"] == len(ids) and meta["spec"] == "default"
    few, _ = load_eval_samples("default", llama, builders.VOCAB, 2, 128)
    assert few == samples[:2]
    from quantize_cli.calibration.data import load_samples
    from quantize_cli.eval.data import overlap

    calib_samples, _ = load_samples("default", llama, builders.VOCAB, 1000, 512)
    assert overlap(samples, calib_samples) == 0  # no 16-token window of the eval text is in the calibration samples


def test_a_text_file_is_read_as_far_as_its_samples_need(tmp_path, llama):
    """--data FILE.txt: consecutive samples, the same tokens as the whole file's first ones, read as a
    bounded prefix (a 4 MB file, 3 samples: it crashed with an AttributeError before)."""
    from transformers import AutoTokenizer

    from quantize_cli.eval.data import load_eval_samples

    para = "The quick brown fox jumps over the lazy dog near the river bank at dawn. " * 8 + "\n\n"
    path = tmp_path / "big.txt"
    path.write_text(para * 6000)  # ~4 MB
    samples, meta = load_eval_samples(str(path), llama, builders.VOCAB, 3, 64)
    ids = AutoTokenizer.from_pretrained(llama)(para * 40, add_special_tokens=False)["input_ids"]
    assert len(samples) == 3 and all(len(s) == 64 for s in samples)
    assert [t for s in samples for t in s] == ids[: 3 * 64]
    assert meta["spec"] == str(path) and meta["tokens"] == 192
    import hashlib

    assert meta["sha256"] != hashlib.sha256(path.read_bytes()).hexdigest()  # a prefix was read, not 4 MB


def test_overlap_with_the_calibration_data_is_warned(tmp_path, llama):
    long = [list(range(100, 140))]  # 40 tokens: 25 windows of 16
    data = jsonl(tmp_path / "d.jsonl", long)
    dst = convert(llama, str(tmp_path / "dst"), algo="FP8", device="cpu", quiet=True, calib_data=data).dst
    res = run_eval(dst, source=llama, data=data, device="cpu")
    assert res.data["calibration_overlap"] == 1.0 and any("overlap" in w for w in res.warnings)
    other = jsonl(tmp_path / "o.jsonl", [list(range(200, 240))])
    res = run_eval(dst, source=llama, data=other, device="cpu")
    assert res.data["calibration_overlap"] == 0.0 and not any("overlap" in w for w in res.warnings)
    partly = jsonl(tmp_path / "p.jsonl", [list(range(100, 120)) + list(range(200, 220))])  # windows 0..4 of 25 seen
    res = run_eval(dst, source=llama, data=partly, device="cpu")
    assert res.data["calibration_overlap"] == pytest.approx(5 / 25) and any("20.0%" in w for w in res.warnings)


def test_fp8_kv_cache_rounds_keys_and_values(tmp_path, llama):
    data = jsonl(tmp_path / "d.jsonl")
    plain = convert(llama, str(tmp_path / "plain"), algo="FP8", device="cpu", quiet=True, calib_data=data).dst
    kv = convert(llama, str(tmp_path / "kv"), algo="FP8", device="cpu", quiet=True, calib_data=data, kv_cache_dtype="fp8").dst
    a, _ = logits_of(plain, data=data)
    b, res = logits_of(kv, data=data)
    assert not torch.equal(a, b) and "3 attention module(s)" in res.checkpoint["kv_cache"]
    c, _ = logits_of(kv, data=data, weights_only=True)
    d, _ = logits_of(plain, data=data, weights_only=True)
    assert torch.equal(c, d)  # weights only: the KV cache is not quantized either


def test_a_source_of_another_shape_is_refused(tmp_path, llama):
    from quantize_cli.errors import SourceError

    other = builders.bert(str(tmp_path / "bert"))
    with pytest.raises(SourceError, match="model_type 'bert' differs"):
        run_eval(llama, source=other, data=jsonl(tmp_path / "d.jsonl"), device="cpu")
