"""Calibrated activation scales: run the source model layer by layer and record amax.

Public interface (used by ``quantize calibrate``, ``convert --calib-data/--act-scales`` and any
writer that needs per-module input amax or KV amax)::

    doc = calibrate(source, recipe, "default", samples=128, seq_len=512, device=torch.device("cuda"))
    doc.save("SCALES.json");  doc = load("SCALES.json")            # document.py
    scales = resolve(doc, quantized_names, fused_groups, kv=True)    # apply.py -> ActScales

``transformers`` (the ``calib`` extra) and torch are imported only inside these functions: the
plan reads resolved scales (``apply.py``) with neither.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from ..errors import UsageError
from .apply import ActScales, resolve
from .document import ScalesDoc, check_source, fingerprint, load

if TYPE_CHECKING:
    import torch

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


def _max_positions(config: dict) -> int | None:
    for cfg in (config, config.get("text_config") or {}):
        if isinstance(cfg.get("max_position_embeddings"), int) and cfg["max_position_embeddings"] > 0:
            return cfg["max_position_embeddings"]
    return None


def offload_decision(device: torch.device, act_bytes: int, memory_budget: int | None, offload: bool | None) -> bool:
    """Where the hidden states of all samples live between blocks (True: host memory).

    On a GPU they stay on the device while they take at most a quarter of its free memory (the
    block's weights and its forward need the rest), else they go to pinned host memory, one batch on
    the device at a time. Host-held states (the CPU path, or offloaded) must fit `memory_budget`."""
    if offload is None and device.type == "cuda":
        import torch

        offload = act_bytes > torch.cuda.mem_get_info(device)[0] // 4
    elif offload is None:
        offload = False
    on_host = device.type == "cpu" or offload
    if memory_budget and on_host and act_bytes > memory_budget:
        where = "on the CPU" if device.type == "cpu" else f"offloaded from {device} to host memory"
        raise UsageError(f"--memory-budget {memory_budget}: the hidden states of the calibration samples need {act_bytes} bytes "
                         f"{where}; raise --memory-budget or lower --calib-samples / --calib-seq-len")
    return offload


def load_data(source, calib_data: str, samples: int, seq_len: int, memory_budget: int | None = None) -> tuple[list, dict]:
    """``(ids, description)``: the token ids the forward of `source` runs on (`samples` lists of at
    most `seq_len` ids; `seq_len` lowered to the model's ``max_position_embeddings``, as positions past
    it do not exist) and their description (:func:`.data.load_samples`). Needs the tokenizer
    (transformers) for text; never torch."""
    from .data import load_samples

    seq_len = min(seq_len, _max_positions(source.config) or seq_len)
    return load_samples(calib_data, source.root, _vocab(source.config), samples, seq_len, memory_budget)


def ids_sha256(ids: list[list[int]]) -> str:
    """The digest of the token ids themselves: what decides a forward's results, whatever file
    (or path) they were read from."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(ids, separators=(",", ":")).encode()).hexdigest()


def data_key(ids, data: dict) -> dict:
    """What of the calibration data decides a GPTQ / smoothing request: the token ids' digest and the
    sizes, never the path (the same tokens from another file are the same weights; another content
    at the same path is not). `data`: :func:`load_data`'s description."""
    return {"ids_sha256": ids_sha256([list(s) for s in ids]), "samples": data["samples"], "seq_len": data["seq_len"]}


def calibrate(source, recipe, calib_data: str, samples: int = DEFAULT_SAMPLES, seq_len: int = DEFAULT_SEQ_LEN,
              device: torch.device | None = None, memory_budget: int | None = None,
              progress: Callable[[int, int, float], None] | None = None, offload: bool | None = None,
              batch_tokens: int | None = None, transform=None, data: tuple | None = None) -> ScalesDoc:
    """Measure every Linear input amax (per expert), its per-channel ``E[x_j^2]`` and K/V amax of
    `source` on `calib_data`.

    Args:
        source: an opened :class:`~quantize_cli.checkpoint.source.Source` (a local folder).
        recipe: its recipe (per-expert module names).
        seq_len: at most the model's ``max_position_embeddings`` (a longer one is lowered to it, and recorded).
        memory_budget: host bytes; hidden states held in host memory (CPU, or offloaded) must fit in it.
        offload: force the hidden states to host memory (True) or the device (False); None decides
            (:func:`offload_decision`).
        batch_tokens: tokens per forward (padding-free batches of equal-length samples).
        transform: a per-block transform run before each block's recorded pass (GPTQ and smoothing,
            :class:`.layerwise.Layerwise`); the amax are then those of the transformed model. One
            with a ``memory_budget`` attribute is given `memory_budget` (GPTQ's row slices).
        data: ``(ids, description)`` from :func:`load_data` when the caller read the samples already
            (convert's GPTQ / smoothing stage keys its work by their digest before the forward).
    Raises CalibrationError / SourceError / UsageError with one-line messages (no transformers, bad
    data, unknown architecture, activations over budget).
    """
    from .model import build, require_transformers

    require_transformers()
    import torch
    import transformers

    from . import forward, hooks, stats
    from .one_thread import one_thread

    device = device or torch.device("cpu")
    t0 = time.perf_counter()
    ids, data_meta = data or load_data(source, calib_data, samples, seq_len, memory_budget)
    act_bytes = 2 * 2 * _hidden(source.config) * data_meta["tokens"]  # bf16 inputs + outputs of a block
    offload = offload_decision(device, act_bytes, memory_budget, offload)
    sk = build(source.root, source.config, source.tensors, recipe, torch.bfloat16)
    if memory_budget and hasattr(transform, "memory_budget"):
        transform.memory_budget = memory_budget
    energy = stats.ChannelEnergy()  # E[x_j^2] per input channel: the weights of --scale-search mse
    rec = hooks.Recorder(observers=[energy])
    with one_thread(device):  # the forward too: its products split their sums by thread count on the CPU (one_thread.py)
        timing = forward.run(sk, source.tensors, ids, device, rec, progress, batch_tokens or forward.BATCH_TOKENS, offload,
                             transform)
    modules = {k: {"amax": v.amax, "tokens": v.tokens} for k, v in sorted(rec.inputs.items())}
    kv = {k: {"k_amax": v["k"].amax, "v_amax": v["v"].amax, "tokens": v["k"].tokens} for k, v in sorted(rec.kv.items())}
    run = {"dtype": "bfloat16", "device": str(device), "seconds": round(time.perf_counter() - t0, 3),
           "forward_seconds": round(timing["seconds"], 3), "blocks": timing["blocks"],
           "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
           "activation_bytes": act_bytes, "activations_on": "host" if offload or device.type == "cpu" else "device",
           "batches": timing["batches"]}
    fp = {"label": source.label, **fingerprint(source.config, source.tensors)}
    return ScalesDoc(fp, data_meta, run, modules, kv, channels=energy.mean_squares())


__all__ = ["calibrate", "load_data", "ids_sha256", "data_key", "load", "resolve", "check_source", "fingerprint", "ScalesDoc", "ActScales",
           "DEFAULT_SAMPLES", "DEFAULT_SEQ_LEN"]
