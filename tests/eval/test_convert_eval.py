"""``convert --eval``: `quantize eval` of the finished work folder against SRC, before it becomes DST
(issue 24), and where it meets --resume, --push-to-hub, --report and the run identity.

The source is ``example:tiny-llama`` (2 layers, 14 Linears); eval reads the default held-out text.
"""

from __future__ import annotations

import json
import os

from tests.hostile.helpers import assert_clean_failure, invoke
from tests.matrix.support import fake_hub

EX = "example:tiny-llama"
BASE = ("--algo", "NVFP4", "--device", "cpu", "-q")


def _convert(dst, *extra):
    return invoke("convert", EX, "-o", dst, *BASE, *extra)


def test_a_passing_gate_writes_dst_and_the_report_holds_the_figures(tmp_path):
    dst, report = tmp_path / "out", tmp_path / "report.json"
    r = _convert(dst, "--eval", "--max-kl", "1", "--min-top1", "0.1", "--report", report)
    assert r.exit_code == 0, r.stderr
    doc = json.load(open(report))["eval"]
    assert doc["path"] == str(dst) and doc["ok"] is True
    m = doc["metrics"]
    assert 0 < m["kl_mean"] < 1 and 0.1 <= m["top1_agreement"] <= 1 and m["perplexity"] > 0
    assert {g["name"] for g in doc["gates"]} == {"max_kl", "min_top1"}
    assert len(doc["layers"]) == 2


def test_a_failed_gate_never_writes_dst_and_keeps_the_output_aside(tmp_path):
    dst, report = tmp_path / "out", tmp_path / "report.json"
    r = _convert(dst, "--eval", "--max-kl", "0", "--report", report)  # any quantization moves the logits: KL > 0
    line = assert_clean_failure(r, 1, "eval gate failed", "--max-kl 0", "DST was not written")
    assert not dst.exists(), line
    kept = tmp_path / "out.eval-failed"
    assert (kept / "hf_quant_config.json").is_file() and not [p for p in os.listdir(tmp_path) if p.startswith(".out")]
    doc = json.load(open(report))
    assert doc["status"] == "error"
    gate = doc["eval"]["gates"]  # the figures of the failure too (issue 35, 17: the report had no eval key)
    assert doc["eval"]["ok"] is False and [(g["name"], g["ok"]) for g in gate] == [("max_kl", False)] and gate[0]["value"] > 0


def test_eval_with_two_devices_runs_on_the_first(tmp_path):
    """``--device cpu,cpu --eval``: the eval forward runs on the first device, as calibration does (it passed
    the tuple of both to eval's device resolution: an internal error after the whole output was written)."""
    dst, report = tmp_path / "out", tmp_path / "report.json"
    r = invoke("convert", EX, "-o", dst, "--algo", "INT8", "--device", "cpu,cpu", "-q", "--eval", "--max-kl", "1",
               "--eval-samples", "2", "--eval-seq-len", "16", "--report", report)
    assert r.exit_code == 0, r.stderr
    doc = json.load(open(report))["eval"]
    assert doc["ok"] is True and doc["run"]["device"] == "cpu"


def test_gates_without_eval_are_refused_before_anything_is_read(tmp_path):
    r = _convert(tmp_path / "out", "--max-ppl-increase", "3")
    assert_clean_failure(r, 2, "--max-ppl-increase", "--eval")  # a usage error
    assert not os.listdir(tmp_path)
    r = _convert(tmp_path / "out", "--eval", "--min-top1", "1.5")
    assert_clean_failure(r, 2, "--min-top1 1.5")
    assert not os.listdir(tmp_path)


def test_eval_is_not_part_of_the_identity_and_runs_after_already_complete(tmp_path):
    dst, report = tmp_path / "out", tmp_path / "report.json"
    assert _convert(dst).exit_code == 0
    before = {f: os.path.getmtime(dst / f) for f in os.listdir(dst)}
    r = _convert(dst, "--resume", "--eval", "--max-kl", "1", "--report", report)
    assert r.exit_code == 0, r.stderr
    doc = json.load(open(report))
    assert doc["status"] == "already-complete" and doc["eval"]["ok"] is True
    assert {f: os.path.getmtime(dst / f) for f in os.listdir(dst)} == before  # measured, not rewritten
    r = _convert(dst, "--resume", "--eval", "--max-kl", "0")  # the gate fails: exit 1, the finished DST stays
    assert_clean_failure(r, 1, "eval gate failed")
    assert sorted(os.listdir(dst)) == sorted(before)


def test_a_failed_gate_pushes_nothing(tmp_path):
    with fake_hub(str(tmp_path)) as hub:
        r = _convert(tmp_path / "out", "--eval", "--max-kl", "0", "--push-to-hub", "me/tiny")
        assert_clean_failure(r, 1, "eval gate failed")
        assert ("me/tiny" not in hub.repos or not hub.files("me/tiny")) and not hub.puts


def test_eval_reads_a_compressed_tensors_work_folder(tmp_path):
    dst, report = tmp_path / "out", tmp_path / "report.json"
    r = invoke("convert", EX, "-o", dst, "--algo", "FP8", "--device", "cpu", "-q", "--format", "compressed-tensors", "--eval",
               "--report", report)
    assert r.exit_code == 0, r.stderr
    doc = json.load(open(report))["eval"]
    assert doc["checkpoint"]["format"] == "compressed-tensors" and doc["metrics"]["top1_agreement"] > 0.5


def test_eval_settings_choose_the_text_and_its_size(tmp_path):
    """--eval-data / --eval-samples / --eval-seq-len are eval's --data / --samples / --seq-len; alone
    they are refused like the gates (usage error, nothing read)."""
    text = tmp_path / "held-out.txt"
    text.write_text("The quick brown fox jumps over the lazy dog while the river runs to the sea. " * 40)
    r = _convert(tmp_path / "refused", "--eval-samples", "2")
    assert_clean_failure(r, 2, "--eval-samples", "--eval")
    dst, report = tmp_path / "out", tmp_path / "report.json"
    r = _convert(dst, "--eval", "--eval-data", text, "--eval-samples", "3", "--eval-seq-len", "16", "--report", report)
    assert r.exit_code == 0, r.stderr
    data = json.load(open(report))["eval"]["data"]
    assert data["spec"] == str(text) and data["samples"] == 3 and data["tokens"] == 3 * 16, data


def test_a_failed_gate_on_an_already_complete_dst_writes_the_report(tmp_path):
    """Noticed in session 7: `convert --resume --eval` of a finished DST whose gate fails wrote no --report."""
    dst, report = tmp_path / "out", tmp_path / "report.json"
    assert _convert(dst).exit_code == 0
    r = _convert(dst, "--resume", "--eval", "--eval-samples", "2", "--eval-seq-len", "16", "--max-kl", "0", "--report", report)
    assert_clean_failure(r, 1, "eval gate failed")
    doc = json.load(open(report))
    assert doc["status"] == "error" and "eval gate failed" in doc["error"] and doc["destination"] is None
    assert doc["eval"]["ok"] is False and [g["name"] for g in doc["eval"]["gates"]] == ["max_kl"]
