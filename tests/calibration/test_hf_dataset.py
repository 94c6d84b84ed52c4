"""--calib-data owner/name: a Hugging Face dataset already in the local Hub cache, never downloaded,
read without the `datasets` package (calibration/hub_data.py)."""

from __future__ import annotations

import gzip
import json
import sys
import types

import pytest

from quantize_cli.calibration import data, hub_data
from quantize_cli.errors import CalibrationError
from tests.calibration import builders

ROWS = ["The first row of the cached dataset.", "", "A second row, with some numbers: 3, 14, 159.", "Third row."]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(monkeypatch, tmp_path, files: dict[str, bytes], repo: str = "someone/tiny-text", commit: str = COMMIT):
    """A Hub cache in tmp_path holding dataset `repo` at `commit`, laid out as huggingface_hub leaves it
    (``datasets--owner--name/refs/main`` naming the commit, files under ``snapshots/<commit>/``)."""
    import huggingface_hub.constants as hub

    cache = tmp_path / "hub"
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(cache))  # read at import: patch the live value
    owner, name = repo.split("/")
    top = cache / f"datasets--{owner}--{name}"
    (top / "refs").mkdir(parents=True, exist_ok=True)
    (top / "refs" / "main").write_text(commit)
    for rel, body in files.items():
        path = top / "snapshots" / commit / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    return top / "snapshots" / commit


def _jsonl(rows, key="text") -> bytes:
    return "".join(json.dumps({key: t}) + "\n" for t in rows).encode()


def _tok(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def test_cached_dataset_is_read_offline_without_datasets(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # importing it would raise: never needed
    _hub_cache(monkeypatch, tmp_path, {"README.md": b"# card", "data/train.jsonl": _jsonl(ROWS)})
    folder = builders.llama(str(tmp_path / "src"))
    samples, meta = data.load_samples("someone/tiny-text", folder, builders.VOCAB, samples=8, seq_len=10)
    tok = _tok(folder)
    assert samples == [tok(t)["input_ids"][:10] for t in ROWS if t]  # rows with text, special tokens, cut to L
    assert meta["spec"] == "someone/tiny-text" and meta["samples"] == 3
    first, again = data.load_samples("someone/tiny-text", folder, builders.VOCAB, samples=1, seq_len=10)
    assert first == samples[:1] and again["sha256"] == meta["sha256"]


def test_digest_names_the_cached_revision(tmp_path, monkeypatch):
    folder = builders.llama(str(tmp_path / "src"))
    _hub_cache(monkeypatch, tmp_path, {"train.jsonl": _jsonl(ROWS)})
    _, a = data.load_samples("someone/tiny-text", folder, builders.VOCAB, samples=8, seq_len=10)
    _hub_cache(monkeypatch, tmp_path, {"train.jsonl": _jsonl(ROWS)}, commit="f" * 40)
    _, b = data.load_samples("someone/tiny-text", folder, builders.VOCAB, samples=8, seq_len=10)
    assert a["sha256"] != b["sha256"]  # a re-fetched dataset is another calibration source


def test_train_split_chosen_by_the_hub_rule(tmp_path):
    files = ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet",
             "data/validation-00000-of-00001.parquet", "test.jsonl", "README.md", ".gitattributes"]
    for rel in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    assert hub_data.train_files("x/y", str(tmp_path)) == files[:2]
    assert hub_data._split("en/c4-train.00000-of-01024.json.gz") == "train"
    assert hub_data._split("constrain/x.jsonl") is None  # a word, not a substring


def test_files_naming_no_split_are_all_train(tmp_path):
    for rel in ("b.txt", "a/rows.csv", "notes.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    assert hub_data.train_files("x/y", str(tmp_path)) == ["a/rows.csv", "b.txt"]


def test_no_train_split_is_refused(tmp_path, monkeypatch):
    _hub_cache(monkeypatch, tmp_path, {"test.jsonl": _jsonl(ROWS), "dev.jsonl": _jsonl(ROWS)})
    with pytest.raises(CalibrationError, match=r"someone/tiny-text: the cached dataset has no train split \(its files name: test, validation\)"):
        data.load_samples("someone/tiny-text", str(tmp_path), None, samples=8, seq_len=10)


@pytest.mark.parametrize("name, body", [
    ("train.txt", "\n".join(ROWS).encode()),
    ("train.csv", ("text,id\n" + "".join(f'"{t}",{i}\n' for i, t in enumerate(ROWS))).encode()),
    ("train.json", json.dumps([{"text": t} for t in ROWS]).encode()),
    ("train.json", json.dumps({"text": ROWS}).encode()),
    ("train.jsonl.gz", gzip.compress(_jsonl(ROWS))),
    ("train.txt.gz", gzip.compress("\r\n".join(ROWS).encode())),
])
def test_text_formats(tmp_path, name, body):
    (tmp_path / name).write_bytes(body)
    assert list(hub_data.texts("x/y", str(tmp_path), [name])) == ROWS


def test_rows_are_read_lazily(tmp_path):
    """Only as much of a file is read as the samples need: a broken line after them is never reached."""
    (tmp_path / "train.jsonl").write_bytes(_jsonl(ROWS) + b"{not json\n")
    it = hub_data.texts("x/y", str(tmp_path), ["train.jsonl"])
    assert [next(it) for _ in ROWS] == ROWS
    with pytest.raises(CalibrationError, match=r"x/y: train.jsonl: line 5: not valid JSON"):
        next(it)


def test_dataset_without_text_column(tmp_path, monkeypatch):
    _hub_cache(monkeypatch, tmp_path, {"train.jsonl": _jsonl(["x"], key="body")})
    with pytest.raises(CalibrationError, match=r'train.jsonl: row 1 has no "text" column \(columns: body\)'):
        data.load_samples("someone/tiny-text", str(tmp_path), None, samples=8, seq_len=10)


def test_no_data_files(tmp_path, monkeypatch):
    _hub_cache(monkeypatch, tmp_path, {"README.md": b"# card", "x.zst": b"\x28\xb5"})
    with pytest.raises(CalibrationError, match=r"someone/tiny-text: the cached dataset .* holds no data file"):
        data.load_samples("someone/tiny-text", str(tmp_path), None, samples=8, seq_len=10)


def test_broken_gzip_names_the_file(tmp_path):
    (tmp_path / "train.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(CalibrationError, match=r"x/y: train.jsonl.gz: cannot read it as UTF-8 text \(.*\); the cache may be incomplete"):
        list(hub_data.texts("x/y", str(tmp_path), ["train.jsonl.gz"]))


def test_uncached_dataset_refused_without_network(tmp_path, monkeypatch):
    _hub_cache(monkeypatch, tmp_path, {"train.jsonl": _jsonl(ROWS)})
    with pytest.raises(CalibrationError, match=r"--calib-data nobody/absent: .* no Hugging Face dataset of that id in the local Hub cache .*hub "
                                               r"\(.*\); fetch it once while online \(hf download --repo-type dataset nobody/absent\)"):
        data.load_samples("nobody/absent", str(tmp_path), None, samples=8, seq_len=10)


def test_parquet_without_pyarrow_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "train.parquet").write_bytes(b"PAR1")
    with pytest.raises(CalibrationError, match=r"x/y: train.parquet: reading parquet needs pyarrow: pip install pyarrow"):
        list(hub_data.texts("x/y", str(tmp_path), ["train.parquet"]))


class _FakeParquetFile:
    """The slice of pyarrow.parquet.ParquetFile that hub_data uses, over an in-memory column set."""

    def __init__(self, columns: dict[str, list]):
        self.columns = columns
        self.schema_arrow = types.SimpleNamespace(names=list(columns))

    def iter_batches(self, columns, batch_size):
        col = self.columns[columns[0]]
        for i in range(0, len(col), 2):
            yield types.SimpleNamespace(column=lambda _, part=col[i:i + 2]: types.SimpleNamespace(to_pylist=lambda: part))


def test_parquet_rows_through_pyarrow(tmp_path, monkeypatch):
    """hub_data's use of pyarrow (column check, batches, non-string cells skipped), with pyarrow stood in
    for: the test install does not carry pyarrow (~170 MB, with pandas behind datasets ~300 MB)."""
    tables = {"train.parquet": {"text": ROWS + [None]}, "other.parquet": {"body": ["x"]}}
    pq = types.ModuleType("pyarrow.parquet")
    pq.ParquetFile = lambda path: _FakeParquetFile(tables[path.rsplit("/", 1)[-1]])
    pa = types.ModuleType("pyarrow")
    pa.parquet = pq
    monkeypatch.setitem(sys.modules, "pyarrow", pa)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", pq)
    assert list(hub_data.texts("x/y", str(tmp_path), ["train.parquet"])) == ROWS
    with pytest.raises(CalibrationError, match=r'other.parquet: no "text" column \(columns: body\)'):
        list(hub_data.texts("x/y", str(tmp_path), ["other.parquet"]))
