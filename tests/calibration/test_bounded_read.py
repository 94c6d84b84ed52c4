"""Reading calibration data is bounded by what is needed (hostile round 3, issue 26): a one-line
50 MB file with ``--calib-samples 2 --calib-seq-len 16`` grew past 10 GB of RSS (the whole text
tokenized with offsets, for 32 tokens). Each file here is read in a fresh process that reports its
peak RSS growth; the samples must still be those of the whole file."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from quantize_cli.calibration import data
from quantize_cli.checkpoint.example_tokenizer import copy_into
from quantize_cli.errors import CalibrationError

RUNNER = r"""
import json, resource, sys, time
from quantize_cli.calibration import data
spec, root = sys.argv[1], sys.argv[2]
data.load_samples("default", root, 512, 1, 16)  # transformers and the tokenizer loaded before the baseline
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
samples, meta = data.load_samples(spec, root, 512, 2, 16)
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
print(json.dumps({"growth_mb": grew / 1024, "seconds": time.perf_counter() - t, "samples": samples, "meta": meta}))
"""
SIZE = 6 << 20  # the old reader grew ~400 MB per MB of one-line text: 6 MB took 2.4 GB (50 MB: > 10 GB)
GROWTH_MB = 64  # what the bounded reader may add (measured: under 2 MB)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tok"))
    copy_into(root)  # the examples' 512-token tokenizer
    return root


def _one_line_text(n: int) -> str:
    rnd = random.Random(0)
    words = ["alpha", "beta", "quantize", "the", "of", "weights", "scale", "tensor", "7", "12.5"]
    out, size = [], 0
    while size < n:
        w = rnd.choice(words)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n]


def _read_fresh(spec: str, root: str) -> dict:
    r = subprocess.run([sys.executable, "-c", RUNNER, spec, root], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_a_huge_one_line_file_costs_what_its_first_tokens_cost(tok, tmp_path, kind):
    text = _one_line_text(SIZE)
    path = tmp_path / f"calib.{kind}"
    path.write_text(text if kind == "txt" else json.dumps({"text": text}) + "\n" + json.dumps({"text": "second row"}) + "\n")
    got = _read_fresh(str(path), tok)
    assert got["growth_mb"] < GROWTH_MB, got["growth_mb"]
    # the same samples as a short file holding the text's start: nothing past the needed prefix mattered
    short = tmp_path / f"short.{kind}"
    head = text[:4000]
    short.write_text(head if kind == "txt" else json.dumps({"text": head}) + "\n" + json.dumps({"text": "second row"}) + "\n")
    want, meta = data.load_samples(str(short), tok, 512, 2, 16)
    assert got["samples"] == want and len(want) == 2 and all(len(s) == 16 for s in want[: 1 if kind == "jsonl" else 2])
    assert got["meta"]["tokens"] == meta["tokens"]


def test_a_jsonl_line_longer_than_the_budget_allows_is_refused(tok, tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": "word " * 300_000}) + "\n")  # 1.5 MB
    with pytest.raises(CalibrationError, match="line 1 is longer than 1048576 bytes"):
        data.load_samples(str(path), tok, 512, 2, 16, budget=8 << 20)  # cap: an eighth of 8 MiB = 1 MiB
    samples, _ = data.load_samples(str(path), tok, 512, 2, 16, budget=4 << 30)  # the default budget takes it
    assert samples and len(samples[0]) == 16


def test_text_cap_follows_the_memory_budget():
    assert data.text_cap(None) == data.TEXT_CAP_MAX == 64 << 20
    assert data.text_cap(4 << 30) == 64 << 20 and data.text_cap(128 << 20) == 16 << 20 and data.text_cap(1 << 20) == 1 << 20
