"""``--calib-data owner/name``: the ``text`` rows of a Hugging Face dataset already in the local Hub cache.

A dataset lands in the Hub cache (``HF_HUB_CACHE``, ``~/.cache/huggingface/hub`` by default) when
``hf download --repo-type dataset owner/name`` fetches it, and when ``datasets.load_dataset``
does (datasets fetches Hub files through huggingface_hub into the same cache). We read those raw
files ourselves, so the feature costs no dependency: the ``datasets`` package (and pyarrow,
pandas behind it: ~300 MB) is not needed. Only parquet needs pyarrow, which is imported then.

The Hub is never contacted (``local_files_only``). Which files form the ``train`` split follows
the Hub's default data-files rule for a repository without a ``configs:`` section: the files whose
path carries a split keyword (``train`` / ``training``) as a word, or every data file when no file
names any split. Rows are read in file order, lazily: only the first N rows with text are tokenized.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
from typing import Iterator

from ..errors import CalibrationError

#: Split keywords as the Hub's default rule spells them (a file in no split is in train).
_SPLITS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test", "testing", "eval", "evaluation"),
}
#: Data files we read, with ``.gz`` allowed on the text ones.
_TEXT_EXTS = (".jsonl", ".json", ".txt", ".csv")
_EXTS = _TEXT_EXTS + (".parquet",)


def _err(spec: str, what: str) -> CalibrationError:
    return CalibrationError(f"--calib-data {spec}: {what}")


def snapshot(spec: str) -> str:
    """The local folder of the cached snapshot of dataset `spec` (its ``main`` revision); never downloads."""
    from huggingface_hub import constants, snapshot_download

    try:
        return snapshot_download(spec, repo_type="dataset", local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - not cached, a bad id, a broken cache: many types
        raise _err(spec, f"not a file, and no Hugging Face dataset of that id in the local Hub cache "
                         f"{constants.HF_HUB_CACHE} ({type(exc).__name__}); fetch it once while online "
                         f"(hf download --repo-type dataset {spec}), or give a .jsonl/.txt file or `default`") from None


def train_files(spec: str, folder: str) -> list[str]:
    """Paths (sorted, relative to `folder`) of the data files of the ``train`` split."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if not name.startswith(".") and _data_ext(name):
                found.append(rel)
    if not found:
        raise _err(spec, f"the cached dataset {folder} holds no data file ({', '.join(_EXTS)}, or .gz of the text ones)")
    found.sort()
    split_of = {rel: _split(rel) for rel in found}
    if all(s is None for s in split_of.values()):
        return found
    train = [rel for rel in found if split_of[rel] == "train"]
    if not train:
        named = sorted({s for s in split_of.values() if s})
        raise _err(spec, f"the cached dataset has no train split (its files name: {', '.join(named)}); "
                         "give a .jsonl/.txt file made from the split you want")
    return train


def _data_ext(name: str) -> bool:
    low = name.lower()
    return low.endswith(_EXTS) or any(low.endswith(e + ".gz") for e in _TEXT_EXTS)


def _split(rel: str) -> str | None:
    """The split a file's path names as a whole word (``data/train-00000-of-00002.parquet`` -> train)."""
    words = set(re.split(r"[-._ 0-9/]+", rel.lower()))
    for split, keys in _SPLITS.items():
        if words.intersection(keys):
            return split
    return None


def texts(spec: str, folder: str, files: list[str], cap: int = 64 << 20) -> Iterator[str]:
    """The ``text`` value of every row of `files`, in order. Lazy: line-based files (.jsonl, .txt,
    .csv, gzipped or not) and parquet are read a line / batch at a time; a .json is read whole.
    A line holds at most `cap` characters: a longer .txt row is cut there (only its first tokens are
    used), a longer .jsonl row is refused (data.text_cap: bounded by --memory-budget)."""
    for rel in files:
        path = os.path.join(folder, rel)
        low = rel.lower()
        if low.endswith(".parquet"):
            yield from _parquet(spec, rel, path)
            continue
        base = low[:-3] if low.endswith(".gz") else low
        try:
            with _open_text(path, low.endswith(".gz")) as f:
                if base.endswith(".txt"):
                    yield from (line.rstrip("\r\n") for line in _capped_lines(f, cap))  # the Hub's rule: one row per line
                elif base.endswith(".csv"):
                    yield from _column(spec, rel, csv.DictReader(f))
                elif base.endswith(".jsonl"):
                    yield from _column(spec, rel, _json_lines(spec, rel, _capped_lines(f, cap, spec, rel)))
                else:
                    yield from _column(spec, rel, _json_records(spec, rel, f.read()))
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise _err(spec, f"{rel}: cannot read it as UTF-8 text ({type(exc).__name__}); the cache may be "
                             "incomplete: fetch the dataset again") from None


def _capped_lines(f, cap: int, spec: str | None = None, rel: str = "") -> Iterator[str]:
    """The lines of text file `f`, each at most `cap` characters: a longer one is cut there (the rest
    skipped) or, with `spec` (JSON lines, which cannot be cut), refused."""
    n = 0
    while True:
        line = f.readline(cap)
        if not line:
            return
        n += 1
        if len(line) == cap and not line.endswith("\n"):
            if spec is not None:
                raise _err(spec, f"{rel}: line {n} is longer than {cap} characters (bounded by --memory-budget); "
                                 "give a .jsonl file with shorter rows")
            while (rest := f.readline(cap)) and not rest.endswith("\n"):
                pass
        yield line


def _open_text(path: str, gz: bool) -> io.TextIOBase:
    raw = gzip.open(path, "rb") if gz else open(path, "rb")
    return io.TextIOWrapper(raw, encoding="utf-8", newline="")


def _column(spec: str, rel: str, rows) -> Iterator[str]:
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict) or "text" not in row:
            cols = ", ".join(map(str, row)) if isinstance(row, dict) else type(row).__name__
            raise _err(spec, f"{rel}: row {n} has no \"text\" column (columns: {cols}); "
                             "give a .jsonl file with \"text\" or \"input_ids\" instead")
        if isinstance(row["text"], str):
            yield row["text"]


def _json_lines(spec: str, rel: str, lines) -> Iterator[object]:
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise _err(spec, f"{rel}: line {n}: not valid JSON ({exc.msg})") from None


def _json_records(spec: str, rel: str, text: str) -> list[object]:
    """A ``.json`` file: JSON lines, an array of records, or one object of columns (``{"text": [...]}``)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return list(_json_lines(spec, rel, text.splitlines()))  # the Hub accepts JSON lines under .json too
    if isinstance(obj, dict) and isinstance(obj.get("text"), list):
        return [{"text": t} for t in obj["text"]]
    return obj if isinstance(obj, list) else [obj]


def _parquet(spec: str, rel: str, path: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise _err(spec, f"{rel}: reading parquet needs pyarrow: pip install pyarrow") from None
    table = pq.ParquetFile(path)
    if "text" not in table.schema_arrow.names:
        raise _err(spec, f"{rel}: no \"text\" column (columns: {', '.join(table.schema_arrow.names)}); "
                         "give a .jsonl file with \"text\" or \"input_ids\" instead")
    for batch in table.iter_batches(columns=["text"], batch_size=256):
        for value in batch.column(0).to_pylist():
            if isinstance(value, str):
                yield value
