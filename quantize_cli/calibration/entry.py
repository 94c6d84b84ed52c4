"""The calibration step of ``convert`` and the ``calibrate`` command (library side).

``convert`` calls :func:`scales_for_convert` once, before planning: it returns the ScalesDoc the
plan resolves (from ``--calib-data``, run now, or ``--act-scales``, read and checked against the
source), or None for the data-free path, which never imports transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UsageError
from ..problems import CALIB_IGNORED
from . import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN, calibrate, check_source, fingerprint, load
from .document import ScalesDoc


def _source(src: str, revision, quiet: bool):
    from ..checkpoint.source import open_source
    from ..modules.recipe import load_recipe

    source = open_source(src, revision=revision, quiet=quiet)
    return source, load_recipe(None, source.config.get("model_type"))


def run_calibration(src: str, calib_data: str, samples: int, seq_len: int, device: torch.device, budget: int | None,
                    revision=None, quiet: bool = True, recipe: str | None = None, info=None) -> ScalesDoc:
    """Open `src` and calibrate it (``quantize calibrate``); `info` prints progress lines."""
    from ..checkpoint.source import open_source
    from ..modules.recipe import load_recipe

    source = open_source(src, revision=revision, quiet=quiet)
    rec = load_recipe(recipe, source.config.get("model_type"))
    say = info or (lambda msg: None)
    say(f"calibrating {source.label} on {device} with {calib_data} ({samples} x {seq_len} tokens at most)")
    doc = calibrate(source, rec, calib_data, samples, seq_len, device, budget,
                    progress=lambda i, n, s: say(f"  block {i}/{n}: {s:.2f} s"))
    say(f"calibrated {len(doc.modules)} Linear inputs, {len(doc.kv)} attention K/V on {doc.data['samples']} samples "
        f"({doc.data['tokens']} tokens) in {doc.run['seconds']:.1f} s")
    return doc


@dataclass
class PlannedCalibration:
    """What ``convert --dry-run --calib-data`` checked and would run; no forward ran, nothing measured.

    The plan treats it as "calibration will replace the constants" (no "uncalibrated" warning) but
    resolves no scales: a dry run's plan lists the constant-sized tensors, and KV scales would be added."""

    planned = True
    data: dict
    model_type: str
    blocks: int
    device: str
    activations_on: str


def plan_calibration(src: str, calib_data: str, samples: int, seq_len: int, device: torch.device, budget: int | None,
                     revision=None, quiet: bool = True, recipe: str | None = None, info=None) -> PlannedCalibration:
    """Everything calibration checks before its forward (the data: format, tokenizer, vocabulary; the
    architecture: transformers builds it on the meta device, its blocks and tensor names; the memory
    budget), without running the model."""
    from ..checkpoint.source import open_source
    from ..modules.recipe import load_recipe
    from . import _hidden, _max_positions, _vocab, offload_decision
    from .data import load_samples
    from .model import build

    source = open_source(src, revision=revision, quiet=quiet)
    rec = load_recipe(recipe, source.config.get("model_type"))
    seq_len = min(seq_len, _max_positions(source.config) or seq_len)
    _, meta = load_samples(calib_data, source.root, _vocab(source.config), samples, seq_len, budget)
    act_bytes = 2 * 2 * _hidden(source.config) * meta["tokens"]
    offload = offload_decision(device, act_bytes, budget, None)
    sk = build(source.root, source.config, source.tensors, rec, torch.bfloat16)
    planned = PlannedCalibration(meta, str(source.config.get("model_type")), len(sk.blocks), str(device),
                                 "host" if offload or device.type == "cpu" else "device")
    (info or (lambda m: None))(
        f"dry run: would calibrate {source.label} ({planned.model_type}, {planned.blocks} blocks, one at a time on {device}) "
        f"on {calib_data}: {meta['samples']} samples, {meta['tokens']} tokens (at most {seq_len} each); hidden states "
        f"({act_bytes} bytes) in {planned.activations_on} memory; data and architecture checked, no forward run, "
        f"the input scales (and KV scales) are measured by the real conversion")
    return planned


def scales_for_convert(src: str, algos, calib_data, calib_samples, calib_seq_len, act_scales, device, budget,
                       revision, quiet, low_disk: bool, recipe=None, info=None, warn=None, dry_run: bool = False,
                       kv_cache: bool = False, scale_search: str | None = None):
    """The ScalesDoc a conversion uses, or None (no calibration asked for, or nothing to calibrate);
    with `dry_run` and ``--calib-data``: a :class:`PlannedCalibration` (checked, not run).

    `algos`: every algorithm the conversion writes (``--algo`` and the ``--algo-for`` ones); `kv_cache`:
    ``--kv-cache-dtype fp8``; `scale_search`: ``--scale-search``. Calibration runs when one of the
    algorithms has static activation scales, the KV cache is FP8 (its K/V scales are calibrated
    whatever the algorithms) or the data weights the scale search."""
    if calib_data is None and act_scales is None:
        if calib_samples is not None or calib_seq_len is not None:
            raise UsageError("--calib-samples / --calib-seq-len need --calib-data DATA")
        return None
    if calib_data is not None and act_scales is not None:
        raise UsageError("--calib-data and --act-scales: give one (calibrate now, or reuse a scales file)")
    if low_disk:
        raise UsageError("--low-disk with calibration: the forward needs the whole source on disk; drop --low-disk")
    from ..schemes import get_scheme

    from .uses import decides_bytes

    algos = [get_scheme(a).algo for a in ([algos] if isinstance(algos, str) else algos)]
    doc = load(act_scales) if act_scales is not None else None
    if doc is not None and doc.weights:  # its amax AND weights come from the transformed model: never "ignored" (item 10)
        method = doc.weights.get("request", {}).get("method", {})
        raise UsageError(f"--act-scales {act_scales}: made with --rounding {method.get('rounding')} --smooth "
                         f"{method.get('smooth')} (its weights and amax are those of the transformed model), but this conversion "
                         f"has --rounding nearest --smooth none; pass --rounding {method.get('rounding')} --smooth "
                         f"{method.get('smooth')} to convert, or make a scales file with `quantize calibrate` without them")
    if not decides_bytes([get_scheme(a) for a in algos], kv_cache, scale_search):
        (warn or (lambda m, code: None))(f"{'/'.join(dict.fromkeys(algos))} quantizes activations dynamically (or not at all) "
                                         f"and the KV cache is not FP8: {'--calib-data' if calib_data is not None else '--act-scales'} "
                                         "is ignored", CALIB_IGNORED)
        return None
    if doc is not None:
        from ..checkpoint.source import open_source

        source = open_source(src, revision=revision, quiet=quiet)
        check_source(doc, fingerprint(source.config, source.tensors), source.label)
        return doc
    if dry_run:
        return plan_calibration(src, calib_data, calib_samples or DEFAULT_SAMPLES, calib_seq_len or DEFAULT_SEQ_LEN,
                                device, budget, revision, quiet, recipe, info)
    return run_calibration(src, calib_data, calib_samples or DEFAULT_SAMPLES, calib_seq_len or DEFAULT_SEQ_LEN,
                           device, budget, revision, quiet, recipe, info)
