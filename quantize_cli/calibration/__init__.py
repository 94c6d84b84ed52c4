"""Calibrated activation scales: run the source model layer by layer and record amax.

Public interface (used by ``quantize calibrate``, ``convert --calib-data/--act-scales`` and any
writer that needs per-module input amax or KV amax)::

    doc = calibrate(source, recipe, "default", samples=128, seq_len=512, device=torch.device("cuda"))
    doc.save("SCALES.json");  doc = load("SCALES.json")            # document.py
    scales = resolve(doc, quantized_names, fused_groups, kv=True)    # apply.py -> ActScales

``transformers`` (the ``calib`` extra) is imported only inside these functions.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ..errors import UsageError
from .apply import ActScales, resolve
from .document import ScalesDoc, check_source, fingerprint, load

DEFAULT_SAMPLES = 128
DEFAULT_SEQ_LEN = 512


def _hidden(config: dict) -> int:
    for cfg in (config, config.get("text_config") or {}):
        if isinstance(cfg.get("hidden_size"), int):
            return cfg["hidden_size"]
    return 0


def _vocab(config: dict) -> int | None:
    for cfg in (config, config.get("text_config") or {}):
        if isinstance(cfg.get("vocab_size"), int):
            return cfg["vocab_size"]
    return None


def calibrate(source, recipe, calib_data: str, samples: int = DEFAULT_SAMPLES, seq_len: int = DEFAULT_SEQ_LEN,
              device: torch.device | None = None, memory_budget: int | None = None,
              progress: Callable[[int, int, float], None] | None = None) -> ScalesDoc:
    """Measure every Linear input amax (per expert) and K/V amax of `source` on `calib_data`.

    Args:
        source: an opened :class:`~quantize_cli.checkpoint.source.Source` (a local folder).
        recipe: its recipe (per-expert module names).
        memory_budget: host bytes; on the CPU the hidden states of all samples must fit in it.
    Raises CalibrationError / SourceError / UsageError with one-line messages (no transformers, bad
    data, unknown architecture, activations over budget).
    """
    from .model import build, require_transformers

    require_transformers()
    import transformers

    from . import forward, hooks
    from .data import load_samples

    device = device or torch.device("cpu")
    t0 = time.perf_counter()
    ids, data_meta = load_samples(calib_data, source.root, _vocab(source.config), samples, seq_len)
    act_bytes = 2 * 2 * _hidden(source.config) * data_meta["tokens"]  # bf16 inputs + outputs of a block
    if memory_budget and device.type == "cpu" and act_bytes > memory_budget:
        raise UsageError(f"--memory-budget {memory_budget}: the hidden states of {data_meta['samples']} x {seq_len} tokens "
                         f"need {act_bytes} bytes on the CPU; raise --memory-budget or lower --calib-samples / --calib-seq-len")
    sk = build(source.root, source.config, source.tensors, recipe, torch.bfloat16)
    rec = hooks.Recorder()
    timing = forward.run(sk, source.tensors, ids, device, rec, progress)
    modules = {k: {"amax": v.amax, "tokens": v.tokens} for k, v in sorted(rec.inputs.items())}
    kv = {k: {"k_amax": v["k"].amax, "v_amax": v["v"].amax, "tokens": v["k"].tokens} for k, v in sorted(rec.kv.items())}
    run = {"dtype": "bfloat16", "device": str(device), "seconds": round(time.perf_counter() - t0, 3),
           "forward_seconds": round(timing["seconds"], 3), "blocks": timing["blocks"],
           "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
           "activation_bytes": act_bytes}
    fp = {"label": source.label, **fingerprint(source.config, source.tensors)}
    return ScalesDoc(fp, data_meta, run, modules, kv)


__all__ = ["calibrate", "load", "resolve", "check_source", "fingerprint", "ScalesDoc", "ActScales",
           "DEFAULT_SAMPLES", "DEFAULT_SEQ_LEN"]
