"""Eval data -> token id samples, and its overlap with the calibration data.

``--data`` takes what ``--calib-data`` takes, read by the same readers (calibration/data.py):

* ``default``: ``default_eval.txt``, shipped here and written for this project; no sentence of
  it is in the calibration text (``default_calibration.txt``), so ``convert --calib-data default``
  followed by ``eval`` measures text the scales never saw;
* ``FILE.txt`` (and ``default``): the text tokenized once and cut into consecutive samples of L
  tokens (the last one shorter), each framed with the tokenizer's special tokens (BOS), so every
  token is scored once (calibration also cuts paragraphs, which would score text twice);
* ``FILE.jsonl`` (``input_ids`` or ``text`` per line) and a cached Hub dataset id: exactly as
  calibration reads them.

:func:`overlap` is the share of eval n-grams (16 tokens) that the calibration samples contain.
"""

from __future__ import annotations

import hashlib
import os
from importlib import resources

from ..calibration import data as calib
from ..errors import CalibrationError, UsageError

DEFAULT = "default"
NGRAM = 16  # tokens: long enough that a shared window means shared text, not a common phrase


def load_eval_samples(spec: str, root: str, vocab_size: int | None, samples: int, seq_len: int) -> tuple[list[list[int]], dict]:
    """The first `samples` samples of `spec` and a description (spec, sha256, samples, seq_len, tokens)."""
    if samples < 1:
        raise UsageError(f"--samples {samples}: must be at least 1")
    if seq_len < 2:
        raise UsageError(f"--seq-len {seq_len}: must be at least 2 (one token predicts the next)")
    try:
        if spec == DEFAULT or (os.path.isfile(spec) and not spec.endswith(".jsonl")):
            out, digest = _text(spec, root, seq_len, samples)
            out = [s for s in out if s][:samples]
            calib._check_vocab(spec, out, vocab_size)
            meta = {"spec": spec, "sha256": digest, "samples": len(out), "seq_len": seq_len, "tokens": sum(map(len, out))}
            return out, meta
        return calib.load_samples(spec, root, vocab_size, samples, seq_len)
    except CalibrationError as exc:  # calibration's readers name their option; this one is --data
        raise CalibrationError(exc.message.replace("--calib-data", "--data", 1)) from None


def _text(spec: str, root: str, seq_len: int, samples: int) -> tuple[list[list[int]], str]:
    """Consecutive samples of `seq_len` tokens (each framed with the special tokens), so every token
    is scored once; a file is read as far as `samples` samples need (calibration's bounded reader)."""
    calib._TOKENIZERS.clear()
    if spec == DEFAULT:
        text = resources.files(__package__).joinpath("default_eval.txt").read_text(encoding="utf-8")
        digest = hashlib.sha256(text.encode()).hexdigest()
    else:
        text, digest = calib.read_text_prefix(spec, root, (samples + 1) * seq_len + calib.MARGIN_TOKENS, calib.TEXT_CAP_MAX)
    if not text.strip():
        raise CalibrationError(f"--data {spec}: the file is empty; give some text")
    tok = calib._tokenizer(root, spec)
    head, tail = calib._frame(tok)
    width = seq_len - len(head) - len(tail)
    if width < 1:
        raise UsageError(f"--seq-len {seq_len}: must exceed the {len(head) + len(tail)} special token(s) the tokenizer adds")
    ids, _ = calib._ids_offsets(tok, text)
    return [head + ids[i : i + width] + tail for i in range(0, len(ids), width)], digest


def calibration_record(path: str) -> dict | None:
    """The calibration data a converted checkpoint records (ModelOpt: ``converter.calibration.data``)."""
    from ..jsonfile import read_json_or_none

    nested = read_json_or_none(os.path.join(path, "hf_quant_config.json")) or {}
    cal = (nested.get("converter") or {}).get("calibration") if isinstance(nested.get("converter"), dict) else None
    if isinstance(cal, dict) and cal.get("calibrated"):
        return cal.get("data")
    return _card_record(path)


def _card_record(path: str) -> dict | None:
    """The calibration data the card records (output/card.py's DATA_COMMENT): compressed-tensors
    outputs and GPTQ / smoothed weights, whose documents have no calibration block."""
    from ..calibration.record import from_card, read_data_comment

    return from_card(path, read_data_comment)


def overlap(eval_samples: list[list[int]], calib_samples: list[list[int]], n: int = NGRAM) -> float:
    """Share of the eval samples' `n`-token windows that occur in the calibration samples (0..1)."""
    seen = {tuple(s[i : i + n]) for s in calib_samples for i in range(max(0, len(s) - n + 1))}
    windows = [tuple(s[i : i + n]) for s in eval_samples for i in range(max(0, len(s) - n + 1))]
    return sum(w in seen for w in windows) / len(windows) if windows else 0.0


def calibration_overlap(record: dict | None, eval_meta: dict, eval_samples: list[list[int]], root: str,
                        vocab_size: int | None) -> tuple[float | None, str]:
    """(share of eval windows seen in calibration or None if unknown, a sentence saying so)."""
    if not record:
        return None, "no calibration data is recorded in the checkpoint"
    if record.get("sha256") == eval_meta.get("sha256") and record.get("spec") == eval_meta.get("spec"):
        return 1.0, f"the eval data is the calibration data ({record.get('spec')!r})"
    spec = record.get("spec")
    try:
        reproducible = spec == DEFAULT or (os.path.isfile(str(spec)) and not spec.startswith("/dev/"))
        if not reproducible:
            return None, f"calibration data {spec!r} is not available here to compare"
        calib_samples, meta = calib.load_samples(spec, root, vocab_size, int(record.get("samples") or 1 << 30),
                                                 int(record.get("seq_len") or 512))
    except (CalibrationError, UsageError, OSError) as exc:
        return None, f"calibration data {spec!r} could not be re-read ({exc})"
    if record.get("sha256") and meta.get("sha256") != record.get("sha256"):
        return None, f"calibration data {spec!r} changed since the conversion (sha256 differs)"
    share = overlap(eval_samples, calib_samples)
    unhashed = "" if record.get("sha256") else "; no sha256 is recorded: compared with the data as it is now"
    return share, f"{100 * share:.1f}% of the eval {NGRAM}-token windows occur in the calibration data ({spec!r}){unhashed}"
