"""--calib-data owner/name: a Hugging Face dataset already in the local datasets cache, never downloaded."""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys

import pytest

from quantize_cli.calibration import data
from quantize_cli.errors import CalibrationError
from tests.calibration import builders

ROWS = ["The first row of the cached dataset.", "", "A second row, with some numbers: 3, 14, 159.", "Third row."]


def _fake_cache(monkeypatch, tmp_path, repo: str = "someone/tiny-text", rows=ROWS) -> None:
    """A datasets cache in tmp_path holding `repo`, laid out as load_dataset leaves it after a download
    (``<cache>/<owner>___<name>/<config>/<version>/<hash>/<name>-train.arrow`` + dataset_info.json),
    made offline from a local JSON file by datasets' own json builder."""
    import datasets  # in the test extra: a missing package fails here, it does not skip
    cache = tmp_path / "hf" / "datasets"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))  # read at import: patch the live value too
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
    b = datasets.load_dataset_builder("json", data_files={"train": str(src)}, cache_dir=str(tmp_path / "build"))
    b.download_and_prepare()
    built = next(d for d in glob.glob(str(tmp_path / "build" / "json" / "*" / "*" / "*")) if os.path.isdir(d))
    owner, name = repo.split("/")
    dst = cache / f"{owner}___{name}" / "default" / "0.0.0" / os.path.basename(built)
    shutil.copytree(built, dst)
    os.rename(dst / "json-train.arrow", dst / f"{name}-train.arrow")


def test_cached_dataset_is_read_offline(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub

    _fake_cache(monkeypatch, tmp_path)
    folder = builders.llama(str(tmp_path / "src"))
    online = hub.HF_HUB_OFFLINE
    samples, meta = data.load_samples("someone/tiny-text", folder, builders.VOCAB, samples=8, seq_len=10)
    assert hub.HF_HUB_OFFLINE == online  # offline only for the call
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    assert samples == [tok(t)["input_ids"][:10] for t in ROWS if t]  # rows with text, special tokens, cut to L
    assert meta["spec"] == "someone/tiny-text" and meta["samples"] == 3
    first, _ = data.load_samples("someone/tiny-text", folder, builders.VOCAB, samples=1, seq_len=10)
    assert first == samples[:1]


def test_uncached_dataset_refused_without_network(tmp_path, monkeypatch):
    _fake_cache(monkeypatch, tmp_path)
    folder = builders.llama(str(tmp_path / "src"))
    with pytest.raises(CalibrationError, match=r"--calib-data nobody/absent: .* no Hugging Face dataset of that id .* local cache"):
        data.load_samples("nobody/absent", folder, builders.VOCAB, samples=8, seq_len=10)


def test_dataset_without_text_column(tmp_path, monkeypatch):
    import datasets  # in the test extra: a missing package fails here, it does not skip
    _fake_cache(monkeypatch, tmp_path)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_dict({"body": ["x"]}))
    with pytest.raises(CalibrationError, match=r'no "text" column \(columns: body\)'):
        data.load_samples("someone/tiny-text", str(tmp_path), None, samples=8, seq_len=10)


def test_dataset_id_without_datasets_installed(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # importing it now raises ImportError
    with pytest.raises(CalibrationError, match=r"--calib-data someone/tiny-text: .* pip install datasets"):
        data.load_samples("someone/tiny-text", str(tmp_path), None, samples=8, seq_len=10)
