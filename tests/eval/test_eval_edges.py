"""``quantize eval`` at its edges (issue 35 items 9, 15, 16): the DeepSeek example runs, a source of
another shape is refused naming the tensor, and nothing measured never passes a gate."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors, write_checkpoint
from quantize_cli.checkpoint.examples import example_path
from quantize_cli.cli import main
from tests.conftest import convert
from tests.eval.test_eval import jsonl


def run(*args):
    return CliRunner().invoke(main, ["eval", *args])


@pytest.fixture(scope="module")
def llama_fp8(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("edges")
    src = example_path("tiny-llama")
    return src, convert(src, str(root / "fp8"), algo="FP8", device="cpu", quiet=True).dst


def test_tiny_deepseek_example_converts_with_calibration_and_evaluates(tmp_path):
    """Issue 35 item 9: the example set no n_group / topk_group, so transformers' router crashed."""
    dst = tmp_path / "ds"
    r = CliRunner().invoke(main, ["convert", "example:tiny-deepseek", "-o", str(dst), "--algo", "FP8", "--calib-data",
                                  "default", "--calib-samples", "2", "--calib-seq-len", "16", "--device", "cpu", "-q"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "e.json"
    r = run(str(dst), "--source", "example:tiny-deepseek", "--device", "cpu", "--samples", "2", "--seq-len", "16",
            "--json", str(out))
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["metrics"]["positions"] == 30 and doc["kind"] == "causal-lm"


def test_a_source_with_another_intermediate_size_is_refused_naming_the_tensor(tmp_path, llama_fp8):
    """Issue 35 item 15: same vocabulary, other MLP width: refused, not scored."""
    _, dst = llama_fp8
    cfg = llama_config(intermediate=256)
    other = write_checkpoint(str(tmp_path / "other"), llama_tensors(cfg), cfg)
    data = jsonl(tmp_path / "d.jsonl")
    r = run(dst, "--source", other, "--data", data, "--device", "cpu")
    assert r.exit_code == 1, r.output
    line = r.output.strip().splitlines()[-1]
    assert "mlp" in line and "[256, 256]" in line and "[512, 256]" in line and "Traceback" not in r.output


def test_samples_of_one_token_are_refused_not_passed(tmp_path, llama_fp8):
    """Issue 35 item 16: zero scored positions: exit 1 saying why and the fix, never PASS."""
    src, dst = llama_fp8
    data = jsonl(tmp_path / "one.jsonl", [[5], [7], [9]])
    out = tmp_path / "e.json"
    r = run(dst, "--source", src, "--data", data, "--device", "cpu", "--max-kl", "1", "--json", str(out))
    assert r.exit_code == 1, r.output
    assert "PASS" not in r.output and "1 token" in r.output and "longer samples" in r.output


@pytest.fixture(scope="module")
def bert_fp8(tmp_path_factory) -> tuple[str, str]:
    from tests.calibration import builders

    root = tmp_path_factory.mktemp("bert")
    src = builders.bert(str(root / "src"))
    return src, convert(src, str(root / "dst"), algo="FP8", device="cpu", quiet=True).dst


def test_an_encoder_is_gated_on_its_embedding_cosines(tmp_path, bert_fp8):
    """Issue 36 item 4: --min-cosine gates the mean, --min-sample-cosine the lowest sample."""
    src, dst = bert_fp8
    data, out = jsonl(tmp_path / "d.jsonl"), tmp_path / "e.json"
    r = run(dst, "--source", src, "--data", data, "--device", "cpu", "--min-cosine", "0.5", "--min-sample-cosine", "0.5",
            "--json", str(out))
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["ok"] and [g["name"] for g in doc["gates"]] == ["min_cosine", "min_sample_cosine"]
    assert doc["gates"][0]["value"] == doc["metrics"]["embedding_cosine_mean"]
    assert doc["gates"][1]["value"] == doc["metrics"]["embedding_cosine_min"]
    assert r.output.strip().splitlines()[-1].startswith("eval: PASS: embedding cosine mean")
    r = run(dst, "--source", src, "--data", data, "--device", "cpu", "--min-sample-cosine", "1", "--json", str(out))
    assert r.exit_code == 1 and "is below --min-sample-cosine 1" in r.output, r.output
    assert json.loads(out.read_text())["ok"] is False


def test_a_perplexity_gate_on_an_encoder_is_refused_and_the_json_still_written(tmp_path, bert_fp8):
    src, dst = bert_fp8
    out = tmp_path / "e.json"
    r = run(dst, "--source", src, "--data", jsonl(tmp_path / "d.jsonl"), "--device", "cpu", "--max-kl", "0.05",
            "--json", str(out))
    assert r.exit_code == 2 and "encoder" in r.output and "--max-kl" in r.output and "--min-cosine" in r.output
    doc = json.loads(out.read_text())
    assert doc["ok"] is False and doc["exit_code"] == 2 and "--max-kl" in doc["error"]


def test_a_cosine_gate_on_a_causal_lm_is_refused(tmp_path, llama_fp8):
    src, dst = llama_fp8
    r = run(dst, "--source", src, "--data", jsonl(tmp_path / "d.jsonl"), "--device", "cpu", "--min-cosine", "0.9")
    assert r.exit_code == 2 and "--min-cosine" in r.output and "--max-kl" in r.output


@pytest.mark.parametrize("options", [{"algo": "W4A16_NVFP4", "rounding": "gptq"},
                                     {"algo": "NVFP4", "format": "compressed-tensors"}], ids=["gptq", "ct-nvfp4"])
def test_eval_finds_the_calibration_of_gptq_and_compressed_tensors_outputs(tmp_path, options):
    """Issue 36 item 8: the card says what the calibration decided, and eval's overlap check runs."""
    from quantize_cli.eval import run_eval
    from tests.calibration.test_gptq_convert import _outlier_llama

    src = _outlier_llama(str(tmp_path / "src"))
    calib = jsonl(tmp_path / "calib.jsonl", [[(i * 13 + k) % 200 for i in range(40)] for k in range(3)])
    dst = convert(src, str(tmp_path / "dst"), calib_data=calib, device="cpu", quiet=True, **options).dst
    card = open(f"{dst}/README.md").read()
    assert "None needed" not in card and f"Calibrated on `{calib}`" in card
    res = run_eval(dst, source=src, data=calib, device="cpu")
    assert res.data["calibration_overlap"] == 1.0, res.data["overlap_text"]
    assert any("eval and calibration data overlap" in w for w in res.warnings)


def test_a_dst_without_tokenizer_files_is_scored_with_the_source_tokenizer(llama_fp8, tmp_path):
    """An output written by another tool (llm-compressor and ModelOpt save no tokenizer) is scored on
    text tokenized by SRC's tokenizer. transformers 5 builds a tokenizer from config.json alone, with
    only its special tokens, so every text was one token and eval refused ("every sample is 1 token
    long"); a folder without a tokenizer file is now treated as having no tokenizer."""
    import shutil

    src, dst = llama_fp8
    bare = tmp_path / "bare"
    shutil.copytree(dst, bare)
    for f in bare.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            f.unlink()
    docs = []
    for i, folder in enumerate((dst, bare)):
        out = tmp_path / f"eval{i}.json"
        r = run(str(folder), "--source", src, "--device", "cpu", "--samples", "2", "--seq-len", "16", "--json", str(out))
        assert r.exit_code == 0, r.output
        docs.append(json.loads(out.read_text())["metrics"])
    assert docs[1] == docs[0] and docs[0]["positions"] > 2
    r = run(str(bare), "--device", "cpu", "--samples", "2", "--seq-len", "16")  # no source to fall back on
    assert r.exit_code != 0 and "has no tokenizer file" in r.output, r.output
