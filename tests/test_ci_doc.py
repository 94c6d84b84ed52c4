"""docs/ci.md is a pipeline a user can copy: its shell script and its report gate run as written.

The script runs with bash as the doc writes it (taken from its code block, so the two cannot
drift), for every algorithm on a decoder and an encoder, against a fake Hub (tests/fakehub.py).
`quantize` on its PATH runs this checkout's code: once as a plain process (`python -m quantize_cli`,
one case), and for the other cases through tests/forkserver.py, which forks each command from one
process that imported torch and transformers once (the same CLI, ~10x less CPU on a 2-core machine).
"""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from quantize_cli.algorithms import ALGOS

from .fakehub import FakeHub

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "ci.md")
TOKEN = "hf_" + "Zk" * 17


def blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", open(DOC).read(), flags=re.S)


def script() -> str:
    return next(b for b in blocks("bash") if b.startswith("#!/usr/bin/env bash"))


def gate() -> str:
    """The workflow's report gate (its python heredoc), unindented."""
    text = re.search(r"python - <<'EOF'\n(.*?)\n\s*EOF", blocks("yaml")[0], flags=re.S).group(1)
    return "\n".join(line[10:] for line in text.splitlines())  # the YAML block's indentation


def token_ids(path, vocab: int) -> str:
    """3 samples of 32 token ids below `vocab` (the test models have no tokenizer): eval and calibration data."""
    path.write_text("".join(f'{{"input_ids": {[(k * 37 + i * 11) % vocab for i in range(32)]}}}\n' for k in range(3)))
    return str(path)


def plain_quantize(bindir) -> str:
    """`bindir/quantize`: this checkout's CLI as its own process (the venv's console script may be
    another checkout's editable install)."""
    bindir.mkdir(exist_ok=True)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    (bindir / "quantize").write_text(f'#!/bin/sh\nPYTHONPATH="{root}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" -m quantize_cli "$@"\n')
    (bindir / "quantize").chmod(0o755)
    return str(bindir)


def test_the_shell_script_and_the_gate_publish_a_verified_checkpoint(tmp_path):
    (tmp_path / "quantize.sh").write_text(script())
    eval_data = token_ids(tmp_path / "eval.jsonl", 512)  # example:tiny-llama's vocabulary
    server = FakeHub().start()
    try:
        bindir = plain_quantize(tmp_path / "bin")
        env = {**os.environ, "HF_ENDPOINT": server.url, "HF_TOKEN": TOKEN, "HF_HUB_DISABLE_XET": "1",
               "HF_HOME": str(tmp_path / "hf"), "WORK": str(tmp_path / "w"), "PATH": f"{bindir}:{os.environ['PATH']}",
               "EVAL_DATA": eval_data, "CALIB_DATA": eval_data}
        run = subprocess.run(["bash", str(tmp_path / "quantize.sh"), "example:tiny-llama", "FP8_PB_WO", "me/tiny-FP8"],
                             capture_output=True, text=True, env=env, timeout=300)
        assert run.returncode == 0, run.stderr
        out = tmp_path / "w" / "out"
        ev = json.loads((tmp_path / "w" / "eval.json").read_text())
        assert ev["ok"] and [g["name"] for g in ev["gates"]] == ["max_ppl_increase", "max_kl"] and ev["metrics"]["positions"] == 93
        assert server.files("me/tiny-FP8") == {f: (out / f).read_bytes() for f in os.listdir(out) if not f.startswith(".")}
        g = subprocess.run([sys.executable, "-"], input=gate(), capture_output=True, text=True, cwd=tmp_path / "w", timeout=60)
        assert g.returncode == 0 and g.stdout.startswith("ok: "), g.stdout + g.stderr
        assert TOKEN not in run.stdout + run.stderr
    finally:
        server.stop()


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A MiniLM-shaped BERT folder (fp32, hidden 128 so that every algorithm's groups fit), no tokenizer."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    root = str(tmp_path_factory.mktemp("enc") / "minilm")
    BertModel(BertConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, vocab_size=96,
                         max_position_embeddings=64)).save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """One fake Hub and one fork server for every case; yields (hub, environment for bash)."""
    from .forkserver import ForkServer

    home = tmp_path_factory.mktemp("ci")
    hub = FakeHub(lifetime_s=1800).start()
    server = None
    try:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN, "HF_HUB_DISABLE_XET": "1", "HF_HOME": str(home / "hf")}
        server = ForkServer(str(home), env).start()
        bindir = server.install(str(home / "bin"))
        yield hub, {**server.env, "PATH": f"{bindir}:{os.environ['PATH']}"}
    finally:
        if server is not None:
            server.stop()
        hub.stop()


def test_the_fork_servers_quantize_reports_the_exit_code(recipe, tmp_path):
    """The script's `set -e` relies on it: a refused command must not read as success."""
    run = subprocess.run(["quantize", "check", str(tmp_path / "absent"), "--algo", "FP8"], capture_output=True, text=True,
                         env=recipe[1], timeout=60)
    assert run.returncode != 0 and "absent" in run.stderr, run.stderr


@pytest.mark.parametrize("model", ["decoder", "encoder"])
@pytest.mark.parametrize("algo", ALGOS)
def test_the_recipe_publishes_every_algorithm_on_a_decoder_and_an_encoder(algo, model, recipe, encoder, tmp_path):
    """Issue 36 item 1: the whole script as written (check --strict, convert --verify with calibration,
    the report check, eval with the gates of the model's kind, push) and then the workflow's report
    gate pass for every algorithm, on example:tiny-llama and a BERT encoder."""
    hub, env = recipe
    src, vocab = ("example:tiny-llama", 512) if model == "decoder" else (encoder, 96)
    data = token_ids(tmp_path / "data.jsonl", vocab)
    (tmp_path / "quantize.sh").write_text(script())
    repo = f"me/{model}-{algo}"
    env = {**env, "WORK": str(tmp_path / "w"), "EVAL_DATA": data, "CALIB_DATA": data}
    run = subprocess.run(["bash", str(tmp_path / "quantize.sh"), src, algo, repo], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    work = tmp_path / "w"
    check = json.loads((work / "check.json").read_text())
    assert check["ok"] and check["algo"] == algo and check["kind"] == ("causal-lm" if model == "decoder" else "encoder")
    ev = json.loads((work / "eval.json").read_text())
    gates = ["max_ppl_increase", "max_kl"] if model == "decoder" else ["min_cosine"]
    assert ev["ok"] and [g["name"] for g in ev["gates"]] == gates and ev["kind"] == check["kind"]
    report = json.loads((work / "report.json").read_text())
    assert report["algo"] == algo and report["options"]["algo"] == algo
    out = work / "out"
    assert hub.files(repo) == {f: (out / f).read_bytes() for f in os.listdir(out) if not f.startswith(".")}
    g = subprocess.run([sys.executable, "-"], input=gate(), capture_output=True, text=True, cwd=work, timeout=60)
    assert g.returncode == 0 and g.stdout.startswith("ok: "), g.stdout + g.stderr
    assert TOKEN not in run.stdout + run.stderr
