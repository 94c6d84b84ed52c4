"""``convert --rounding gptq / --smooth`` as a stage of the one run lifecycle (issue 35).

The transform's weights decide bytes, so they are decided like every other byte of the output:

1. at plan time (:func:`pending`), from the draft plan (the headers) and the calibration samples
   read once, the *request* is fixed: every input that decides the weights (method options, the
   quantized Linears and their schemes, the source fingerprint, the device type, the converter's
   byte-deciding version, and the digest of the token ids themselves, not of a path). Its sha256,
   the *key*, enters the run identity, so ``--resume`` refuses a changed option, data file or
   converter version before anything is touched, and a finished DST is confirmed without a forward;
2. once the output's lock is held (:meth:`output.workfolder.WorkFolder.open`), :func:`produce`
   runs the calibration forward into ``.DST.partial/.weights/<key>/`` (or reuses that folder when an
   interrupted run finished it: its index is written last, its files' digest is checked), and the
   final plan reads the source through it;
3. :meth:`WorkFolder.seal` removes the folder with the rest of the resume state: nothing is left
   beside DST.

A second run to the same DST is refused by the lock before its forward; content addressing means a
data file changed and restored between an interruption and its ``--resume`` finds its weights again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass

WORK_DIR = ".weights"  # in the work folder; the seal removes it with the resume state (output/workfolder.py SCRATCH)


@dataclass(frozen=True)
class Pending:
    """The transform a draft plan still needs (what :func:`produce` runs once the lock is held).

    request: what decides the weights (``weights_entry.request_of``; ``data`` holds the ids'
    digest); key: sha256 of `request`; ids / data: the calibration samples (lists of token ids) and
    their description (spec, bytes' sha256, samples, seq_len, tokens); keep_scales: the final plan
    reads the forward's activation scales (static input scales, an FP8 KV cache, weighted search)."""

    rounding: str
    smooth: str
    request: dict
    key: str
    ids: tuple
    data: dict
    keep_scales: bool

    @property
    def method(self) -> dict:
        return self.request.get("method") or {}

    def identity(self) -> dict:
        """What the run identity records (output/identity.py): the data's and the request's digests,
        and the request itself (a difference is then named: :func:`differences`)."""
        return {"data_sha256": self.request["data"]["ids_sha256"], "request_sha256": self.key, "request": self.request}


def differences(made: dict, want: dict) -> str:
    """How two recorded stage identities differ, said as the options that decide them."""
    from .weights_entry import _differences

    if made.get("data_sha256") != want.get("data_sha256"):
        return (f"calibration data whose token ids hash to {str(made.get('data_sha256'))[:12]}..., this run's hash to "
                f"{str(want.get('data_sha256'))[:12]}... (the --calib-data file changed, or --calib-samples / --calib-seq-len)")
    said = _differences(made.get("request") or {}, want.get("request") or {}) if isinstance(made.get("request"), dict) else []
    return "; ".join(said) or f"GPTQ / smoothing inputs {str(made.get('request_sha256'))[:12]}..., this run's {want['request_sha256'][:12]}..."


def key_of(request: dict) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def for_convert(opts, ok, con, draft, device):
    """``(scales doc, WeightsDoc, None)`` when the weights come without this run's forward
    (``--act-scales``, a dry run: weights_entry.weights_for_convert), else ``(None, None, Pending)``."""
    from .weights_entry import keeps_scales, weights_for_convert

    got = weights_for_convert(opts, ok, con, draft, device)
    if got is not None:
        return (*got, None)
    return None, None, pending(opts, draft, device, ok.budget, keeps_scales(opts, draft))


def pending(opts, draft, device, budget, keep_scales: bool) -> Pending:
    """Read the calibration samples of ``opts.calib_data`` for `draft`'s source (`budget`: the
    text held at once, ``--memory-budget``) and fix the request."""
    from . import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN, data_key, load_data
    from .model import require_transformers
    from .weights_entry import normalise, request_of

    require_transformers()
    rounding, smooth = normalise(opts.rounding, opts.smooth)
    samples, seq_len = opts.calib_samples or DEFAULT_SAMPLES, opts.calib_seq_len or DEFAULT_SEQ_LEN
    ids, data = load_data(draft.source, opts.calib_data, samples, seq_len, budget)
    request = request_of(draft, rounding, smooth, device, data_key(ids, data))  # the ids' digest, never the path
    return Pending(rounding, smooth, request, key_of(request), tuple(map(tuple, ids)), data, keep_scales)


def folder_of(partial: str, key: str) -> str:
    """Where the stage keeps the weights of `key` in the work folder `partial`."""
    return os.path.join(partial, WORK_DIR, key[:32])


def produce(step: Pending, draft, partial: str, src: str, device, budget, revision, quiet, recipe, info, warn):
    """``(ScalesDoc or None, WeightsDoc)`` for `draft` under the held lock of `partial`: the finished
    folder of an interrupted run with this key, else a fresh forward (an unfinished folder is redone:
    its index is written last)."""
    from .weights_entry import run

    folder = folder_of(partial, step.key)
    again = _finished(folder, step.request)
    if again is not None:
        info(f"--resume: reusing the GPTQ / smoothing weights computed by the interrupted run ({step.key[:12]})")
        doc, weights = again
    else:
        for old in _others(partial, folder):  # an earlier key's weights: never read again (the identity moved on)
            shutil.rmtree(old, ignore_errors=True)
        doc, weights = run(src, draft, step.data["spec"], step.data["samples"], step.data["seq_len"], device, budget,
                           step.rounding, step.smooth, folder, revision, quiet, recipe, info, warn,
                           data=([list(s) for s in step.ids], dict(step.data)))
        if weights.request != step.request:  # the forward must have made what the identity records
            from ..errors import QuantizeError

            raise QuantizeError(f"{folder}: the weights were made for another request than the plan's (internal); rerun")
    return (doc if step.keep_scales else None), weights


def _finished(folder: str, request: dict):
    """(ScalesDoc, WeightsDoc) of a finished folder made for `request` whose files are intact, else None."""
    from ..errors import QuantizeError
    from . import load as load_scales
    from .weights_entry import SCALES_NAME
    from .weights_file import load, verify_digest

    try:
        weights = load(folder)
        doc = load_scales(os.path.join(folder, SCALES_NAME))
    except (QuantizeError, OSError):  # unfinished (no index) or damaged (a header): computed again
        return None
    if weights.request != request or not verify_digest(weights):
        return None
    return doc, weights


def _others(partial: str, keep: str) -> list[str]:
    root = os.path.join(partial, WORK_DIR)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return [os.path.join(root, n) for n in names if os.path.join(root, n) != keep]


def method_of(plan) -> dict:
    """The GPTQ / smoothing method options of `plan` (draft or final), {} without a transform."""
    step = getattr(plan, "transform", None)
    if step is not None:
        return step.method
    return (getattr(plan.weights, "request", None) or {}).get("method") or {}


__all__ = ["Pending", "for_convert", "pending", "produce", "folder_of", "key_of", "method_of", "WORK_DIR"]
