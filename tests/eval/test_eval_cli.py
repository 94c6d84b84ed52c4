"""``quantize eval`` on the command line: the verdict line, JSON, gates and exit codes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.conftest import convert
from quantize_cli import api
from quantize_cli.cli import main
from tests.eval.test_eval import jsonl


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str, str]:
    from quantize_cli.checkpoint.examples import example_path

    root = tmp_path_factory.mktemp("cli")
    src = example_path("tiny-llama")
    dst = convert(src, str(root / "fp8"), algo="FP8_PB_WO", device="cpu", quiet=True).dst
    data = jsonl(root / "d.jsonl", [[i * 7 % 512 for i in range(k, k + 24)] for k in range(3)])
    return src, dst, data


def run(*args):
    return CliRunner().invoke(main, ["eval", *args])


def test_passing_gates_exit_0_and_write_json(tmp_path, pair):
    src, dst, data = pair
    out = tmp_path / "r.json"
    r = run(dst, "--source", src, "--data", data, "--device", "cpu", "--json", str(out), "--max-ppl-increase", "50",
            "--max-kl", "1", "--min-top1", "0.1")
    assert r.exit_code == 0, r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("eval: PASS: perplexity") and "KL" in last and "top-1" in last
    doc = json.loads(out.read_text())
    assert doc["ok"] and doc["command"] == "eval" and doc["schema_version"] == 1 and len(doc["gates"]) == 3
    assert doc["metrics"]["positions"] == 69 and doc["kind"] == "causal-lm" and len(doc["layers"]) == 2
    assert doc["checkpoint"]["served"] == [{"algo": "FP8_PB_WO", "activations": "fp8_group", "count": 14}]
    assert doc["run"]["device"] == "cpu" and doc["run"]["peak_blocks_materialized"] == 2


def test_a_failed_gate_exits_1_naming_the_figure_and_still_writes_json(tmp_path, pair):
    src, dst, data = pair
    out = tmp_path / "r.json"
    r = run(dst, "--source", src, "--data", data, "--device", "cpu", "--json", str(out), "--max-kl", "0", "--min-top1", "0.1")
    assert r.exit_code == 1
    assert "eval: FAIL:" in r.output
    assert "mean KL (nats)" in r.output and "is above --max-kl 0" in r.output and "Traceback" not in r.output
    doc = json.loads(out.read_text())
    assert not doc["ok"] and [g["ok"] for g in doc["gates"]] == [False, True]


@pytest.mark.parametrize("args, said", [(["--max-kl", "0.1"], "give --source SRC"),
                                        (["--source", "SRC", "--min-top1", "1.5"], "between 0 and 1"),
                                        (["--samples", "0"], "0")])
def test_usage_errors_exit_2(pair, args, said):
    src, dst, data = pair
    args = [src if a == "SRC" else a for a in args]
    r = run(dst, "--data", data, "--device", "cpu", *args)
    assert r.exit_code == 2 and said in r.output


def test_a_folder_that_is_not_a_checkpoint_exits_1(tmp_path):
    r = run(str(tmp_path), "--device", "cpu")
    assert r.exit_code == 1 and r.output.startswith("error: ") and "Traceback" not in r.output


def test_without_source_the_verdict_is_the_perplexity(pair):
    _, dst, data = pair
    r = run(dst, "--data", data, "--device", "cpu", "--weights-only")
    assert r.exit_code == 0
    assert r.output.strip().splitlines()[-1].startswith("eval: perplexity ") and "over 69 positions" in r.output
    assert "no --source" in r.output


def test_without_transformers_the_message_names_the_extra(pair, monkeypatch):
    import sys

    src, dst, data = pair
    monkeypatch.setitem(sys.modules, "transformers", None)  # importing it now raises ImportError
    r = run(dst, "--data", data, "--device", "cpu")
    assert r.exit_code == 1 and "pip install 'quantize-cli[calib]'" in r.output and "Traceback" not in r.output
