"""Calibration data -> token id samples ``list[list[int]]`` (each at most ``seq_len`` ids).

Accepted ``--calib-data``:

* ``default``: the text shipped in this package (``default_calibration.txt``: prose, code,
  dialogue, numbers; written for this project), tokenized, then cut into consecutive samples of
  L tokens and, as well, every paragraph on its own (see :func:`_cut_text`), each framed with the
  tokenizer's special tokens (BOS, or [CLS] ... [SEP]) as served inputs are;
* ``FILE.jsonl``: one JSON object per line, with ``"input_ids"`` (used as is: no BOS added,
  truncated to L) or ``"text"`` (tokenized with the checkpoint's own tokenizer, truncated to L);
* ``FILE.txt``: as ``default``;
* a Hugging Face dataset id already in the local Hub cache (split ``train``, column ``text``;
  :mod:`.hub_data`; no ``datasets`` package needed).

Every problem is one line naming the file, the line and the rule.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
from importlib import resources

from ..errors import CalibrationError, UsageError
from . import hub_data

DEFAULT = "default"


# A --calib-data value ending so is a file: a Hub dataset id does not carry a data file's extension.
DATA_SUFFIXES = (".jsonl", ".json", ".txt", ".csv", ".parquet", ".jsonl.gz", ".json.gz", ".txt.gz", ".csv.gz")


def looks_like_a_file(spec: str) -> bool:
    """Whether ``--calib-data`` `spec` names a file rather than ``default`` or a dataset id ``owner/name``."""
    return (spec.startswith((".", "/", "~")) or spec.count("/") > 1 or "\\" in spec
            or spec.lower().endswith(DATA_SUFFIXES))


def _err(spec: str, what: str) -> CalibrationError:
    return CalibrationError(f"--calib-data {spec}: {what}")


# Text held at once while reading calibration data: an eighth of --memory-budget, between these
# bounds (a line of a .jsonl may not be longer; a .txt is read as a prefix of at most this).
TEXT_CAP_MIN, TEXT_CAP_MAX = 1 << 20, 64 << 20
# Tokens past the ones needed before a prefix is cut: a word split at the cut changes only its own tokens.
MARGIN_TOKENS = 32
BYTES_PER_TOKEN = 4  # the first guess of a prefix's size (doubled until it holds enough tokens)


def text_cap(budget: int | None) -> int:
    """Bytes of calibration text held at once for `budget` (--memory-budget; None: the largest)."""
    return TEXT_CAP_MAX if not budget else max(TEXT_CAP_MIN, min(TEXT_CAP_MAX, budget // 8))


def load_samples(spec: str, root: str, vocab_size: int | None, samples: int, seq_len: int,
                 budget: int | None = None) -> tuple[list[list[int]], dict]:
    """The first `samples` samples of `spec` and a description (spec, sha256, samples, seq_len, tokens).

    Reading is bounded by what is needed (issue 26: a one-line 50 MB file took 10 GB): a text file
    is read and tokenized as a prefix holding the tokens of `samples` samples (plus one, plus a
    margin), a .jsonl line by line until `samples` samples, each text tokenized as a prefix of
    `seq_len` tokens; the text held at once is at most :func:`text_cap` of `budget`. The samples
    are those of the whole file; ``sha256`` is of the bytes read (the whole file unless it holds
    far more than needed)."""
    if samples < 1:
        raise UsageError(f"--calib-samples {samples}: must be at least 1")
    if seq_len < 1:
        raise UsageError(f"--calib-seq-len {seq_len}: must be at least 1")
    _TOKENIZERS.clear()  # loaded once per call, never reused across calls (the files may change)
    cap = text_cap(budget)
    if spec == DEFAULT:
        text = resources.files(__package__).joinpath("default_calibration.txt").read_text(encoding="utf-8")
        out = _cut_text(root, spec, text, seq_len)
        digest = hashlib.sha256(text.encode()).hexdigest()
    elif os.path.isfile(spec):
        if spec.endswith(".jsonl"):
            out, digest = _jsonl(spec, root, seq_len, samples, cap)
        else:
            out, digest = _text_file(spec, root, seq_len, samples, cap)
    elif os.path.exists(spec) or looks_like_a_file(spec):
        raise _err(spec, "no such file; give a .jsonl or .txt file, `default`, or a cached Hugging Face dataset id")
    else:
        out, digest = _dataset(spec, root, seq_len, samples, cap)
    out = [s for s in out if s][:samples]
    if not out:
        raise _err(spec, "no tokens in it; give text or input_ids")
    _check_vocab(spec, out, vocab_size)
    return out, {"spec": spec, "sha256": digest, "samples": len(out), "seq_len": seq_len, "tokens": sum(map(len, out))}


def _open(path: str):
    try:
        return open(path, "rb")
    except OSError as exc:
        raise _err(path, f"cannot read it ({exc.strerror or exc})") from None


def _text_file(path: str, root: str, seq_len: int, samples: int, cap: int) -> tuple[list[list[int]], str]:
    """A .txt (or any text) file: the samples of :func:`_cut_text` from the shortest prefix that
    holds them. The first N samples (ordered by start) lie within the first N + 1 pieces of the
    text, so a prefix of (N + 1) * L tokens plus a margin gives the same ones as the whole file."""
    text, digest = read_text_prefix(path, root, (samples + 1) * seq_len + MARGIN_TOKENS, cap)
    return _cut_text(root, path, text, seq_len), digest


def read_text_prefix(path: str, root: str, need: int, cap: int) -> tuple[str, str]:
    """(the shortest prefix of text file `path` holding `need` tokens of `root`'s tokenizer, or the
    whole file, or `cap` bytes; the sha256 of the bytes read). Calibration and eval read text files
    through here: bounded by what is needed, never a whole 50 MB line."""
    digest, decoder = hashlib.sha256(), codecs.getincrementaldecoder("utf-8")()
    parts, read, target = [], 0, need * BYTES_PER_TOKEN
    with _open(path) as f:
        while True:
            want = max(0, min(target, cap) - read)
            chunk = f.read(want)
            digest.update(chunk)
            end = len(chunk) < want  # the whole file is read
            try:
                parts.append(decoder.decode(chunk, final=end))
            except UnicodeDecodeError as exc:
                raise _err(path, f"not UTF-8 text (bad byte at offset {read + exc.start}); save it as UTF-8") from None
            read += len(chunk)
            text = "".join(parts)
            if end or read >= cap or len(_tokenizer(root, path)(text, add_special_tokens=False)["input_ids"]) >= need:
                break
            parts, target = [text], target * 2  # geometric: at most twice the tokenizing the prefix needs
    if not text.strip():
        raise _err(path, "the file is empty; give at least one sample")
    return text, digest.hexdigest()


def _lines(f, path: str, cap: int):
    """(line number, bytes) of every line of binary file `f`; a line longer than `cap` is refused."""
    n = 0
    while True:
        line = f.readline(cap + 1)
        if not line:
            return
        n += 1
        if len(line) > cap:
            raise _err(path, f"line {n} is longer than {cap} bytes (an eighth of --memory-budget, at most 64 MiB); "
                             "split it into several samples, or raise --memory-budget")
        yield n, line


def _jsonl(path: str, root: str, seq_len: int, samples: int, cap: int) -> tuple[list[list[int]], str]:
    """A .jsonl file, read line by line until `samples` samples; sha256 of the bytes read."""
    out, digest, seen = [], hashlib.sha256(), False
    with _open(path) as f:
        for n, raw in _lines(f, path, cap):
            digest.update(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _err(path, f"line {n}: not UTF-8 text (bad byte at column {exc.start}); save it as UTF-8") from None
            if not line.strip():
                continue
            seen = True
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _err(path, f"line {n}: not valid JSON ({exc.msg}); one JSON object per line") from None
            if not isinstance(obj, dict) or not ("input_ids" in obj or "text" in obj):
                raise _err(path, f"line {n}: needs an object with \"input_ids\" (list of ints) or \"text\" (string)")
            if "input_ids" in obj:
                ids = obj["input_ids"]
                if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                    raise _err(path, f"line {n}: \"input_ids\" must be a non-empty list of integers")
                out.append(ids[:seq_len])
            else:
                if not isinstance(obj["text"], str) or not obj["text"].strip():
                    raise _err(path, f"line {n}: \"text\" must be a non-empty string")
                out.append(_tokenize_prefix(root, path, obj["text"], seq_len))
            if len(out) == samples:  # the rest of the file is never read
                break
    if not seen:
        raise _err(path, "the file is empty; give at least one sample")
    return out, digest.hexdigest()


def _cut_text(root: str, spec: str, text: str, seq_len: int) -> list[list[int]]:
    """Two views of the same text, both framed with the tokenizer's special tokens (BOS; BERT's
    [CLS] ... [SEP]) as served inputs have them (those positions often carry the largest
    activations, so a calibration without them would clip them at serve time):

    * long context: the whole text tokenized and cut into consecutive pieces of L tokens (the
      last, shorter piece kept: no token of the text is dropped);
    * short inputs: every paragraph (blank-line separated) on its own, cut to L, because served
      inputs range from one sentence to L tokens and short ones reach larger values in places
      (the first token, attention outputs over few tokens) that long pieces never show.

    Samples are ordered by where they start in the text (each piece, then the paragraphs that
    start inside it), so the first N samples cover a prefix of the text in both views."""
    tok = _tokenizer(root, spec)
    head, tail = _frame(tok)
    extra = len(head) + len(tail)
    if seq_len <= extra:
        raise UsageError(f"--calib-seq-len {seq_len}: must exceed the {extra} special token(s) the tokenizer adds")
    width = seq_len - extra
    ids, offsets = _ids_offsets(tok, text)
    pieces = [(offsets[i], ids[i : i + width]) for i in range(0, len(ids), width)]
    paras = []
    for start, para in _paragraphs(text):
        p_ids, p_off = _ids_offsets(tok, para)
        paras.extend((start + p_off[i], p_ids[i : i + width]) for i in range(0, len(p_ids), width))
    out, seen = [], set()
    for _, piece in sorted(pieces + paras, key=lambda sp: sp[0]):  # stable: a piece before its paragraphs
        key = tuple(piece)
        if piece and key not in seen:  # a one-paragraph text would otherwise run twice
            seen.add(key)
            out.append(head + piece + tail)
    return out


def _ids_offsets(tok, text: str) -> tuple[list[int], list[int]]:
    """Token ids of `text` (no special tokens) and the character offset where each starts."""
    try:
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [o[0] for o in enc["offset_mapping"]]
    except NotImplementedError:  # a slow (Python) tokenizer has no offsets: place tokens evenly
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        return ids, [i * len(text) // max(1, len(ids)) for i in range(len(ids))]


def _paragraphs(text: str) -> list[tuple[int, str]]:
    """(start offset, paragraph) for every block of text between blank lines."""
    import re

    return [(m.start(), m.group().strip()) for m in re.finditer(r"\S(?:.|\n(?!\s*\n))*", text)]


def _frame(tok) -> tuple[list[int], list[int]]:
    """The special ids the tokenizer puts before and after a text (found by tokenizing a probe both ways)."""
    probe = "calibration probe"
    framed = list(tok(probe, add_special_tokens=True)["input_ids"])
    plain = list(tok(probe, add_special_tokens=False)["input_ids"])
    for i in range(len(framed) - len(plain) + 1):
        if framed[i : i + len(plain)] == plain:
            return framed[:i], framed[i + len(plain) :]
    return [], []


_TOKENIZERS: dict[str, object] = {}


# A folder holds a tokenizer when one of these is in it (transformers' fast, SentencePiece, BPE and
# WordPiece files, Mistral's tekken). Checked first because transformers 5 builds a tokenizer from
# config.json alone, with only its special tokens: every text became one token (a folder written by
# llm-compressor or ModelOpt has no tokenizer files).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json",
                   "vocab.txt", "merges.txt", "tekken.json")
MIN_VOCAB = 256  # fewer entries: a tokenizer without its vocabulary


def _tokenizer(root: str, spec: str):
    tok = _TOKENIZERS.get(root)
    if tok is None:
        from transformers import AutoTokenizer

        fix = 'add tokenizer files or give a .jsonl with "input_ids"'
        if os.path.isdir(root) and not any(os.path.isfile(os.path.join(root, f)) for f in TOKENIZER_FILES):
            raise _err(spec, f"text needs the checkpoint's tokenizer and {root} has no tokenizer file ({', '.join(TOKENIZER_FILES[:3])} "
                             f"...); {fix}")
        try:
            tok = AutoTokenizer.from_pretrained(root, local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - a missing or broken tokenizer, in many types
            raise _err(spec, f"text needs the checkpoint's tokenizer, which {root} does not have or transformers cannot load "
                             f"({type(exc).__name__}); {fix}") from None
        if len(tok) < MIN_VOCAB:
            raise _err(spec, f"the tokenizer transformers loads from {root} has {len(tok)} entries (no vocabulary); {fix}")
        tok.model_max_length = 1 << 60  # we cut the text ourselves; silence the "longer than" warning
        _TOKENIZERS[root] = tok
    return tok


def _tokenize_prefix(root: str, spec: str, text: str, n: int) -> list[int]:
    """The first `n` ids of `text` tokenized with special tokens, tokenizing only a prefix of it
    (doubled until it holds `n` ids and a margin): a 50 MB text costs what its first tokens cost."""
    tok = _tokenizer(root, spec)
    chars = (n + MARGIN_TOKENS) * BYTES_PER_TOKEN
    while True:
        ids = tok(text[:chars], add_special_tokens=True)["input_ids"]
        if chars >= len(text) or len(ids) >= n + MARGIN_TOKENS:
            return list(ids[:n])
        chars *= 2


def _dataset(spec: str, root: str, seq_len: int, samples: int, cap: int = TEXT_CAP_MAX) -> tuple[list[list[int]], str]:
    """The first `samples` ``text`` rows of the ``train`` split of a dataset in the local Hub cache
    (:mod:`.hub_data`), each tokenized with special tokens and cut to L. The digest names the
    cached revision and the files read, so a re-fetched dataset is a new source of scales."""
    folder = hub_data.snapshot(spec)
    files = hub_data.train_files(spec, folder)
    out = []
    for text in hub_data.texts(spec, folder, files, cap):
        if text.strip():
            out.append(_tokenize_prefix(root, spec, text, seq_len))
            if len(out) == samples:  # the first N rows with text: the rest is never read on
                break
    revision = os.path.basename(os.path.normpath(folder))
    return out, hashlib.sha256(f"{spec}@{revision}:{','.join(files)}".encode()).hexdigest()


def _check_vocab(spec: str, samples: list[list[int]], vocab_size: int | None) -> None:
    if not vocab_size:
        return
    for n, s in enumerate(samples, 1):
        bad = [i for i in s if i < 0 or i >= vocab_size]
        if bad:
            raise _err(spec, f"sample {n}: token id {bad[0]} is outside the model's vocabulary [0, {vocab_size}); "
                             "these ids were made for another tokenizer")
