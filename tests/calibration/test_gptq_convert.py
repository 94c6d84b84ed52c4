"""--rounding gptq and --smooth through convert and calibrate: the format's bytes, determinism,
refusal without data, memory, the scales file round trip, function preservation of the folding."""

from __future__ import annotations

import json
import os

import pytest
import torch
from click.testing import CliRunner

from quantize_cli import api
from quantize_cli.calibration import forward
from quantize_cli.cli import main
from quantize_cli.errors import UsageError
from quantize_cli.plan.options import ConvertOptions
from tests.calibration import builders
from tests.conftest import load_all, output_files

SAMPLES = [[5, 17, 99, 3, 250, 7, 8, 9, 310, 1, 44, 12], [42, 43, 44, 45, 46, 47, 48, 49], [1, 2, 3, 200, 100, 50, 25, 12, 6, 3, 1, 0]]


def _outlier_llama(folder: str) -> str:
    """builders.llama with a few norm channels x30: activations with outlier channels, as real LLMs have."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=builders.VOCAB, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.input_layernorm.weight[[3, 17]] *= 30
            layer.post_attention_layernorm.weight[[5]] *= 30
    return builders.save(model, folder)


def calib_jsonl(path, samples=SAMPLES) -> str:
    """`samples` (token id lists) as a calibration .jsonl at `path`."""
    path.write_text("".join(json.dumps({"input_ids": s}) + "\n" for s in samples))
    return str(path)


def outlier_llama_and_data(folder) -> tuple[str, str]:
    """(the outlier Llama, its calibration .jsonl) in `folder`: the module fixtures of the GPTQ tests."""
    return _outlier_llama(str(folder / "src")), calib_jsonl(folder / "calib.jsonl")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return outlier_llama_and_data(tmp_path_factory.mktemp("gptq"))


def tensors(folder) -> dict[str, bytes]:
    """The shard files' bytes (the configs record the calibration's timings, which vary)."""
    return {k: v for k, v in output_files(folder).items() if k.endswith(".safetensors")}


def convert(src, dst, **kw):
    return api.convert(ConvertOptions(src, str(dst), device="cpu", quiet=True, **kw))


def _convert(src, dst, algo, data, **kw):
    return convert(src, dst, algo=algo, calib_data=data, **kw)


def _payload(name: str) -> bool:
    return name.endswith((".weight", ".weight_packed")) and "norm" not in name and "embed" not in name and "lm_head" not in name


@pytest.mark.parametrize("algo", ["W4A16_NVFP4", "NVFP4", "INT8", "FP8_PER_CHANNEL_PER_TOKEN", "MXFP8"])
def test_gptq_writes_the_format_with_fixed_scales_deterministically(llama, tmp_path, algo):
    src, data = llama
    rtn = load_all(convert(src, tmp_path / "rtn", algo=algo).dst)
    _convert(src, tmp_path / "a", algo, data, rounding="gptq", verify=True)
    _convert(src, tmp_path / "b", algo, data, rounding="gptq")
    a = load_all(tmp_path / "a")
    assert tensors(tmp_path / "a") == tensors(tmp_path / "b"), "GPTQ is not deterministic"
    assert {k: (v.dtype, v.shape) for k, v in a.items()} == {k: (v.dtype, v.shape) for k, v in rtn.items()}
    for name, t in rtn.items():
        if "scale" in name and "input" not in name:
            assert torch.equal(a[name], t), f"{name}: GPTQ must keep the written scales"
    changed = [n for n in rtn if _payload(n) and not torch.equal(a[n].view(torch.uint8), rtn[n].view(torch.uint8))]
    assert len(changed) == 21, changed  # every quantized Linear of the 3 layers was rounded by GPTQ
    conv = json.load(open(tmp_path / "a" / "hf_quant_config.json"))["converter"]["weights"]
    assert conv["method"]["rounding"] == "gptq" and conv["modules"] == 21
    assert 0 < conv["gptq_output_error_vs_rtn"] < 1, "GPTQ must lower the H-weighted output error on the calibration data"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")], "nothing is left beside DST once it is published"


def test_gptq_packed_layout_and_compressed_tensors(llama, tmp_path):
    src, data = llama
    _convert(src, tmp_path / "ct", "W4A16_NVFP4", data, rounding="gptq", format="compressed-tensors", verify=True)
    _convert(src, tmp_path / "marlin", "W4A16_NVFP4", data, rounding="gptq", layout="marlin")
    _convert(src, tmp_path / "plain", "W4A16_NVFP4", data, rounding="gptq")
    api.unpack(str(tmp_path / "marlin"), str(tmp_path / "unpacked"), quiet=True)
    assert tensors(tmp_path / "plain") == tensors(tmp_path / "unpacked")  # the packed layout holds GPTQ's bytes


def test_refused_without_data(llama, tmp_path):
    src, _ = llama
    for flags in (["--rounding", "gptq"], ["--smooth", "awq"], ["--smooth", "smoothquant", "--rounding", "gptq"]):
        r = CliRunner().invoke(main, ["convert", src, "-o", str(tmp_path / "x"), "--algo", "NVFP4", *flags])
        assert r.exit_code == 2, r.output
        assert "needs calibration data" in r.output and "--calib-data" in r.output and len(r.output.strip().splitlines()) == 1
    r = CliRunner().invoke(main, ["calibrate", src, "-o", str(tmp_path / "s.json"), "--rounding", "gptq"])
    assert r.exit_code == 2 and "--algo" in r.output
    r = CliRunner().invoke(main, ["calibrate", src, "-o", str(tmp_path / "s.json"), "--algo", "NVFP4"])
    assert r.exit_code == 2 and "only with --rounding gptq or --smooth" in r.output
    assert not os.path.exists(tmp_path / "x")


def test_calibrate_then_convert_gives_the_same_bytes(llama, tmp_path):
    src, data = llama
    scales = str(tmp_path / "s.json")
    api.calibrate(src, calib_data=data, output=scales, device="cpu", quiet=True, rounding="gptq", smooth="awq", algo="NVFP4")
    assert os.path.isfile(tmp_path / "s.weights" / "index.json")
    _convert(src, tmp_path / "direct", "NVFP4", data, rounding="gptq", smooth="awq")
    convert(src, tmp_path / "reused", algo="NVFP4", act_scales=scales, rounding="gptq", smooth="awq")
    assert tensors(tmp_path / "direct") == tensors(tmp_path / "reused")
    with pytest.raises(UsageError, match="made with --rounding gptq --smooth awq"):
        convert(src, tmp_path / "plain", algo="NVFP4", act_scales=scales)
    with pytest.raises(UsageError, match="made with --algo \"NVFP4\", this conversion has \"FP8\""):
        convert(src, tmp_path / "int8", algo="FP8", act_scales=scales, rounding="gptq", smooth="awq")


def test_smoothing_preserves_the_function(tmp_path):
    """Folding any positive scales into norms and weights leaves the fp32 model's logits unchanged."""
    from transformers import AutoModelForCausalLM

    src = builders.llama(str(tmp_path / "src"))
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()

    def check(maps, folded):
        assert [m.prev for m in maps] == ["input_layernorm", "self_attn.v_proj", "post_attention_layernorm", "mlp.up_proj"]
        assert len(folded) == 9  # 2 norms, q k v o gate up down

    builders.fold_random_scales_keeps_logits(model, SAMPLES[0], check)


@pytest.mark.parametrize("method", ["awq", "smoothquant"])
def test_smoothed_output_loads_and_changes_norms(llama, tmp_path, method):
    src, data = llama
    res = _convert(src, tmp_path / "out", "NVFP4", data, smooth=method, verify=True)
    out, source = load_all(tmp_path / "out"), load_all(src)
    norm = "model.layers.0.input_layernorm.weight"
    assert out[norm].dtype == source[norm].dtype and out[norm].shape == source[norm].shape
    assert not torch.equal(out[norm], source[norm]), "the norm absorbs the smoothing scales"
    assert res.report["options"]["smooth"] == method and res.report["options"]["weights"]
    conv = json.load(open(tmp_path / "out" / "hf_quant_config.json"))["converter"]["weights"]
    assert conv["smoothed_mappings"] == (12 if method == "awq" else 6)
    if method == "awq":  # the search scores s = 1 first: what it keeps is never worse on the calibration data
        assert conv["smooth_loss_vs_unsmoothed"] < 0.9
    text = api.verify(str(tmp_path / "out"), source=src, quiet=True).to_text()
    assert "weights smoothed" in text and "result: 0 error(s)" in text


def test_memory_one_block_and_its_hessians(llama, tmp_path, monkeypatch):
    """One block is materialised at a time, and the Hessians held are those of one block's inputs."""
    from quantize_cli.calibration import layerwise

    src, data = llama
    live, peak = [0], [0]
    real_materialize, real_release = forward.materialize, forward.release

    def materialize(sk, module, path, *a, **k):
        real_materialize(sk, module, path, *a, **k)
        if path.startswith("layers."):
            live[0] += 1
            peak[0] = max(peak[0], live[0])

    def release(module):
        live[0] -= 1
        real_release(module)

    monkeypatch.setattr(forward, "materialize", materialize)
    monkeypatch.setattr(forward, "release", release)
    seen = {}
    real_call = layerwise.Layerwise.__call__

    def call(self, *args):
        real_call(self, *args)
        seen["peak"] = self.report["peak_hessian_bytes"]

    monkeypatch.setattr(layerwise.Layerwise, "__call__", call)
    _convert(src, tmp_path / "out", "W4A16_NVFP4", data, rounding="gptq")
    assert peak[0] == 1
    hidden, inter = 64, 128  # q/k/v share one input, gate/up another, o and down their own: fp32 [K, K] each
    assert seen["peak"] == 4 * (3 * hidden * hidden + inter * inter)


def test_the_stage_reuses_a_finished_folder_only_when_unchanged(llama, tmp_path):
    """calibration/stage.py reuses an interrupted run's weights only when their request is this
    run's and their files still hash to their index; an unfinished folder (no index) is redone."""
    from quantize_cli.calibration import stage, weights_entry
    from quantize_cli.plan.steps import prepare

    src, data = llama
    plan = prepare(src, "NVFP4")
    dev = torch.device("cpu")
    folder = str(tmp_path / "w")
    doc, weights = weights_entry.run(src, plan, data, 8, 64, dev, None, "gptq", "none", folder)
    assert set(weights.request["data"]) == {"ids_sha256", "samples", "seq_len"}  # the tokens, never the path
    again = stage._finished(folder, weights.request)
    assert again is not None and again[1].sha256 == weights.sha256
    other = weights_entry.request_of(prepare(src, "INT8"), "gptq", "none", dev, weights.request["data"])
    assert stage._finished(folder, other) is None
    first = os.path.join(folder, sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))[0])
    original = open(first, "rb").read()
    for at in (200, len(original) - 3):  # its header, then its data
        with open(first, "r+b") as f:
            f.seek(at)
            f.write(b"\x00\x01")
        assert stage._finished(folder, weights.request) is None
        with open(first, "wb") as f:
            f.write(original)
    assert stage._finished(folder, weights.request) is not None
    os.unlink(os.path.join(folder, "index.json"))
    assert stage._finished(folder, weights.request) is None


def test_gptq_moe_experts_take_their_routed_tokens(tmp_path):
    """Fused transformers experts: each expert's gate/up/down is solved on its routed tokens and written
    back into the 3-D parameters for the next layer; experts without tokens keep round to nearest."""
    src = builders.qwen3_moe(str(tmp_path / "src"))
    data = calib_jsonl(tmp_path / "c.jsonl")
    rtn = load_all(convert(src, tmp_path / "rtn", algo="W4A16_NVFP4").dst)
    _convert(src, tmp_path / "out", "W4A16_NVFP4", data, rounding="gptq", verify=True)
    out = load_all(tmp_path / "out")
    conv = json.load(open(tmp_path / "out" / "hf_quant_config.json"))["converter"]["weights"]
    assert conv["modules"] == 2 * (4 + 8 * 3)
    experts = [n for n in rtn if ".experts." in n and n.endswith(".weight") and rtn[n].dtype == torch.uint8]
    changed = [n for n in experts if not torch.equal(out[n], rtn[n])]
    unrouted = {f"{m}.weight" for m in conv["no_tokens"]}
    assert set(experts) - set(changed) <= unrouted and len(changed) >= len(experts) - len(unrouted) > 0


@pytest.fixture(scope="module")
def ray_cluster():
    from tests.matrix.support import local_ray

    with local_ray() as ray:
        yield ray


def test_ray_executor_writes_the_same_bytes(llama, tmp_path, ray_cluster):
    src, data = llama
    _convert(src, tmp_path / "local", "NVFP4", data, rounding="gptq", smooth="awq")
    _convert(src, tmp_path / "ray", "NVFP4", data, rounding="gptq", smooth="awq", executor="ray")
    assert tensors(tmp_path / "local") == tensors(tmp_path / "ray")


def test_smooth_on_a_model_without_its_pairs_says_so(tmp_path):
    """BERT (post-norm, GELU between the MLP's Linears) has none of the pairs --smooth folds into:
    the run warns instead of silently writing round-to-nearest."""
    src = builders.bert(str(tmp_path / "bert"))
    data = calib_jsonl(tmp_path / "calib.jsonl")
    r = CliRunner().invoke(main, ["convert", src, "-o", str(tmp_path / "out"), "--algo", "W4A16_NVFP4", "--device", "cpu",
                                  "--calib-data", str(data), "--smooth", "awq"])
    assert r.exit_code == 0, r.output
    assert "--smooth awq: nothing was smoothed" in r.output and "model_type 'bert'" in r.output
    conv = json.load(open(tmp_path / "out" / "hf_quant_config.json"))["converter"]["weights"]
    assert conv["smoothed_mappings"] == 0


@pytest.mark.parametrize("method", ["awq", "smoothquant"])
def test_smoothing_never_rewrites_an_excluded_module(tmp_path, llama, method):
    """Issue 35 item 6: with q/k/v and gate/up excluded, no fold goes into or out of them (v_proj is
    o_proj's prev, up_proj down_proj's): every excluded weight keeps the source bytes."""
    src, data = llama
    excluded = ["*q_proj*", "*k_proj*", "*v_proj*", "*gate_proj*", "*up_proj*"]
    dst = tmp_path / "out"
    convert(src, dst, algo="NVFP4", calib_data=data, smooth=method, exclude=tuple(excluded))
    got, want = load_all(str(dst)), load_all(src)
    kept = [n for n in want if n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight"))]
    assert len(kept) == 15
    for name in kept:
        assert torch.equal(got[name], want[name]), name


def test_gptq_with_the_search_does_not_warn_that_the_search_is_data_free(llama, tmp_path):
    """The draft plan (before the stage's forward) has no scales yet, so its scale search looked data-free:
    `--rounding gptq --scale-search mse --calib-data` warned "without calibration data" though the forward
    weights the search. The final plan's warnings are the ones said."""
    src, data = llama
    r = CliRunner().invoke(main, ["convert", src, "-o", str(tmp_path / "o"), "--algo", "W4A16_NVFP4", "--rounding", "gptq",
                                  "--scale-search", "mse", "--calib-data", data, "--device", "cpu", "--report", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    assert "without calibration data" not in r.output
    assert not any("without calibration data" in w for w in json.load(open(tmp_path / "r.json"))["warnings"])
