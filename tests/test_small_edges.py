"""Issue 36 item 10 and issue 35 item 17: the report on an interrupt and on a failed eval gate, a
second Ctrl-C during the exit, `verify` of an unquantized folder, `inspect` of a config without a dtype."""

from __future__ import annotations

import json
import os
import signal

import pytest

from quantize_cli import cli
from tests.hostile.helpers import invoke
from tests.test_resume import interrupt_after


def test_report_is_written_on_an_interrupt(tiny_llama, tmp_path, monkeypatch):
    interrupt_after(monkeypatch, 3)
    report = tmp_path / "r.json"
    r = invoke("convert", tiny_llama, "-o", tmp_path / "out", "--algo", "FP8_PB_WO", "--report", report)
    assert r.exit_code == 130
    doc = json.loads(report.read_text())
    assert doc["status"] == "interrupted"


def test_a_second_ctrl_c_during_the_exit_exits_at_once(monkeypatch, default_stop_handlers):
    """After the first interrupt was handled, a second one must not raise inside atexit hooks."""
    exits = []
    monkeypatch.setattr(os, "_exit", exits.append)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def interrupted():
        raise KeyboardInterrupt

    try:
        with pytest.raises(SystemExit) as e:
            cli._run(False, interrupted)
        assert e.value.code == 130
        try:
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # the second Ctrl-C
        except KeyboardInterrupt:
            pytest.fail("a second Ctrl-C raises KeyboardInterrupt during the exit (an atexit traceback)")
        assert exits == [130]
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_a_failed_eval_gate_keeps_its_figures_in_the_report(tmp_path):
    report = tmp_path / "r.json"
    r = invoke("convert", "example:tiny-llama", "-o", tmp_path / "out", "--algo", "NVFP4", "--device", "cpu", "-q",
               "--eval", "--eval-samples", "2", "--eval-seq-len", "16", "--max-kl", "0", "--report", report)
    assert r.exit_code == 1
    doc = json.loads(report.read_text())
    assert doc["status"] == "error" and doc["eval"]["ok"] is False
    assert [g["name"] for g in doc["eval"]["gates"]] == ["max_kl"] and doc["eval"]["metrics"]["kl_mean"] > 0


def test_verify_of_an_unquantized_folder_says_not_quantized(tiny_llama):
    r = invoke("verify", tiny_llama)
    assert r.exit_code == 1
    assert "not quantized" in r.output and "hf_quant_config.json: missing" not in r.output


def test_inspect_prints_no_dtype_none(tiny_llama, tmp_path):
    import shutil

    src = tmp_path / "minilm-like"
    shutil.copytree(tiny_llama, src)
    cfg = json.loads((src / "config.json").read_text())
    for k in ("torch_dtype", "dtype"):
        cfg.pop(k, None)
    (src / "config.json").write_text(json.dumps(cfg))
    r = invoke("inspect", src)
    assert r.exit_code == 0 and "dtype None" not in r.output and "model_type 'llama'" in r.output


@pytest.mark.parametrize("args", [("eval", "out/nonexist", "--device", "cpu"), ("convert", "out/nonexist", "-o", "x", "--algo", "FP8"),
                                  ("inspect", "out/nonexist"), ("eval", "EX", "--source", "out/nonexist", "--device", "cpu")])
def test_a_mistyped_local_path_is_no_such_folder_not_a_hub_lookup(tmp_path, monkeypatch, args):
    """Issue 36 item 6: `out/nonexist` with `out/` present is a local path: said at once, no Hub request."""
    import quantize_cli.checkpoint.hub as hub
    import quantize_cli.checkpoint.source as source

    def no_hub(*a, **k):
        raise AssertionError("looked up on the Hub")

    monkeypatch.setattr(source, "_download", no_hub)
    monkeypatch.setattr(hub, "hub_headers", no_hub)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    r = invoke(*["example:tiny-llama" if a == "EX" else a for a in args])
    assert r.exit_code == 1
    assert "out/nonexist: no such folder (its parent folder out exists here" in r.output, r.output


def test_offline_a_repo_id_not_in_the_cache_is_no_such_folder(tmp_path, monkeypatch):
    import quantize_cli.checkpoint.source as source

    monkeypatch.setattr(source, "_download", lambda *a, **k: pytest.fail("looked up on the Hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    r = invoke("eval", "nobody-here/no-such-model-xyz", "--device", "cpu")
    assert r.exit_code == 1 and "no such folder (HF_HUB_OFFLINE is set" in r.output, r.output
