"""``quantize eval``: the accuracy a converted checkpoint will have as served, from its own bytes.

    result = run_eval("out/", source="model/", data="default", samples=64, seq_len=512,
                      max_ppl_increase=5.0)            # -> EvalResult (report.py); result.passed

Rooms: ``weights.py`` (the written tensors -> what vLLM multiplies; every format decision),
``activations.py`` (vLLM's activation / KV quantization, citing its sources), ``model.py``
(transformers on the meta device, filled a block at a time), ``forward.py`` (DST and SRC in one
streamed pass), ``metrics.py``, ``data.py`` (``--data`` and its overlap with calibration),
``report.py`` (text, JSON, gates). transformers (the ``calib`` extra) and torch are imported inside
the functions only.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from ..errors import UsageError
from .report import GATES as _GATE_RULES, EvalResult, Gate, check_gates

if TYPE_CHECKING:
    import torch

DEFAULT_SAMPLES = 64
DEFAULT_SEQ_LEN = 512


def run_eval(dst: str, source: str | None = None, data: str = "default", samples: int = DEFAULT_SAMPLES,
             seq_len: int = DEFAULT_SEQ_LEN, device: str | torch.device = "auto", weights_only: bool = False,
             max_ppl_increase: float | None = None, max_kl: float | None = None, min_top1: float | None = None,
             min_cosine: float | None = None, min_sample_cosine: float | None = None, calib_data: str | None = None, progress: Callable[[int, int], None] | None = None,
             batch_tokens: int | None = None, observe: Callable | None = None) -> EvalResult:
    """Measure converted checkpoint `dst` as served (and against `source`, in the same pass).

    Args:
        dst: the converted checkpoint (folder or Hub id): ModelOpt (any algorithm, MIXED_PRECISION,
            packed layouts) or compressed-tensors.
        source: the unquantized checkpoint it was made from; needed for every comparison and gate.
        data: ``default`` (held-out text shipped with the tool), a ``.txt`` / ``.jsonl`` file or a
            cached Hub dataset id (data.py); `samples` of at most `seq_len` tokens.
        device: ``auto`` (GPU when present), ``cpu``, ``cuda[:N]``.
        weights_only: keep activations and the KV cache unquantized (what weight-only kernels such
            as Marlin serve where the GPU lacks FP4 / MX support, e.g. NVFP4 on Hopper).
        max_ppl_increase, max_kl, min_top1: a causal LM's gates (percent, nats, fraction); need `source`.
        min_cosine, min_sample_cosine: an encoder's gates (the mean and the lowest sample's embedding
            cosine to the source's); need `source`. A gate of the other kind is refused (UsageError).
        calib_data: the data the scales were calibrated on, when the checkpoint does not record it
            (compressed-tensors), to warn about overlap with `data`.
        progress: ``progress(layers_done, layers)`` after each layer.
        observe: ``observe(dst, src)`` with each chunk of logits (forward.run): tests and benches.
    Returns an :class:`EvalResult` (``passed`` is False when a gate failed; nothing is raised for it).
    Raises UsageError (bad options), SourceError / CalibrationError (unreadable checkpoint or data).
    """
    limits = {"max_ppl_increase": max_ppl_increase, "max_kl": max_kl, "min_top1": min_top1, "min_cosine": min_cosine,
              "min_sample_cosine": min_sample_cosine}
    _check_options(source, limits, samples, seq_len)
    from ..checkpoint.source import refuse_missing

    for path in (dst, source):  # a mistyped local path is said now, before torch and any Hub request
        if path and not path.startswith("example:"):
            refuse_missing(path)
    import sys

    import torch

    from .. import __version__
    from ..calibration import _max_positions, _vocab
    from ..calibration.forward import BATCH_TOKENS
    from ..checkpoint.source import open_source
    from ..devices import resolve_device
    from . import data as eval_data
    from . import forward
    from .model import build
    from .weights import open_served

    t0, cpu0 = time.perf_counter(), time.process_time()
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    served = open_served(dst, weights_only)
    config = served.source.config
    src = open_source(source) if source else None
    if src is not None:
        _check_pair(served.source, src, served.layout, served)
    seq_len = min(seq_len, _max_positions(config) or seq_len)
    ids, meta = _samples(data, served.source.root, src.root if src else None, _vocab(config), samples, seq_len)
    record = eval_data.calibration_record(served.source.root) or ({"spec": calib_data} if calib_data else None)
    share, sentence = eval_data.calibration_overlap(record, meta, ids, served.source.root, _vocab(config))
    meta.update({"calibration_overlap": share, "overlap_text": sentence})
    sk_dst, causal = build(served.source.root, config, served.tensors)
    dst_side = forward.Side(sk_dst, forward.ServedLoader(served, dev))
    src_side = forward.Side(build(src.root, src.config, src.tensors)[0], forward.SourceLoader(src.tensors)) if src else None
    kind = "causal-lm" if causal else "encoder"
    _check_gate_kind(dst, kind, limits)
    if causal and not sum(len(s) - 1 for s in ids):  # a gate must never pass on nothing measured
        from ..errors import CalibrationError

        raise CalibrationError(f"--data {data}: every sample is 1 token long, so no position is scored (a causal LM is "
                               "scored on the next token); give longer samples (at least 2 tokens each) or --seq-len >= 2")
    out = forward.run(dst_side, src_side, ids, dev, causal, progress, batch_tokens or BATCH_TOKENS, observe)
    metrics = out.lm.summary(src is not None) if causal else (out.encoder.summary() if out.encoder else {})
    result = EvalResult(dst, source, kind, _describe(served), meta, metrics, out.layers, check_gates(metrics, limits))
    result.run = {"device": str(dev), "dtype": "float32", "weights_only": weights_only, "batches": out.batches,
                  "peak_blocks_materialized": out.peak_blocks, "forward_seconds": round(out.seconds, 3),
                  "seconds": round(time.perf_counter() - t0, 3), "cpu_seconds": round(time.process_time() - cpu0, 3),
                  "torch": torch.__version__.split("+")[0],
                  "transformers": sys.modules["transformers"].__version__, "quantize": __version__}
    result.warnings = _warnings(result, served, src)
    return result


GATES = tuple(_GATE_RULES)  # the gate options, as keywords (``--max-kl`` on the CLI)
# convert --eval's own --eval-data / --eval-samples / --eval-seq-len: run_eval's data, samples, seq_len
SETTINGS = {"eval_data": "data", "eval_samples": "samples", "eval_seq_len": "seq_len"}


def convert_eval_settings(values: dict) -> dict:
    """``convert --eval-*`` values (None: eval's default) -> :func:`run_eval` keywords."""
    defaults = {"data": "default", "samples": DEFAULT_SAMPLES, "seq_len": DEFAULT_SEQ_LEN}
    return {kw: values[opt] if values.get(opt) is not None else defaults[kw] for opt, kw in SETTINGS.items()}


def check_convert_eval(enabled: bool, limits: dict, settings: dict | None = None) -> None:
    """``convert --eval``, its gates and its --eval-* settings: the usage errors, before anything is
    read (torch-free)."""
    given = [f"--{k.replace('_', '-')}" for k, v in {**limits, **(settings or {})}.items() if v is not None]
    if given and not enabled:
        raise UsageError(f"{', '.join(given)}: eval gate(s) / setting(s) of the converted output; add --eval (or run "
                         "`quantize eval DST --source SRC` with them)")
    kw = convert_eval_settings(settings or {})
    _check_options("SRC", limits, kw["samples"], kw["seq_len"])
    if enabled:
        import importlib.util

        from ..calibration.model import install_hint

        if importlib.util.find_spec("transformers") is None:  # refused now, not after the conversion
            raise UsageError(f"--eval runs the model with transformers, which is not installed; {install_hint()}")


def _check_options(source, limits: dict, samples: int, seq_len: int) -> None:
    given = [f"--{k.replace('_', '-')}" for k, v in limits.items() if v is not None]
    if given and not source:
        raise UsageError(f"{', '.join(given)} compare(s) with the unquantized model: give --source SRC")
    if limits.get("min_top1") is not None and not 0 <= limits["min_top1"] <= 1:
        raise UsageError(f"--min-top1 {limits['min_top1']}: a fraction between 0 and 1")
    for name in ("min_cosine", "min_sample_cosine"):
        if limits.get(name) is not None and not -1 <= limits[name] <= 1:
            raise UsageError(f"--{name.replace('_', '-')} {limits[name]}: a cosine between -1 and 1")
    for name in ("max_kl",):
        if limits.get(name) is not None and limits[name] < 0:
            raise UsageError(f"--{name.replace('_', '-')} {limits[name]}: must be >= 0")
    if samples < 1 or seq_len < 2:
        raise UsageError(f"--samples {samples} --seq-len {seq_len}: need at least 1 sample of at least 2 tokens")


def _check_gate_kind(dst: str, kind: str, limits: dict) -> None:
    """A gate measures one kind of model (report.GATES): a causal LM has no embedding cosine gate, an
    encoder no perplexity, KL or top-1."""
    wrong = [_GATE_RULES[k][2] for k, v in limits.items() if v is not None and _GATE_RULES[k][3] != kind]
    if wrong:
        right = " / ".join(rule[2] for rule in _GATE_RULES.values() if rule[3] == kind)
        what = ("an encoder (no causal LM head) has no perplexity, KL or top-1" if kind == "encoder"
                else "a causal LM is gated on its next-token predictions, not on embedding cosines")
        raise UsageError(f"{dst}: {what}; drop {' / '.join(wrong)} and gate with {right}")


def _check_pair(dst_source, src, layout: str | None = None, served=None) -> None:
    """SRC must be the same architecture and vocabulary (its tokens are scored against DST's)."""
    from ..calibration import _vocab
    from ..errors import SourceError

    a, b = dst_source.config, src.config
    for key in ("model_type", "hidden_size", "num_hidden_layers"):
        if a.get(key) != b.get(key):
            raise SourceError(f"--source {src.label}: {key} {b.get(key)!r} differs from DST's {a.get(key)!r}; "
                              "give the checkpoint DST was converted from")
    if _vocab(a) != _vocab(b):
        raise SourceError(f"--source {src.label}: vocab_size {_vocab(b)} differs from DST's {_vocab(a)}; "
                          "give the checkpoint DST was converted from")
    _check_shapes(dst_source, src, layout, served)


def _check_shapes(dst_source, src, layout: str | None, served=None) -> None:
    """SRC's tensors must have DST's shapes: a tensor DST keeps in a float dtype (norms, embeddings,
    excluded Linears) has SRC's shape, a quantized one (FP8, packed FP4 / INT4 with its scales) keeps
    the output rows first in the plain layout, after its scheme's ``logical_shape`` (ModelOpt's INT4
    packs two rows per byte: ``[N/2, K]``). A source with another intermediate size is refused
    here, naming the tensor, instead of being scored against DST."""
    from ..checkpoint.safetensors_header import FLOAT_SOURCE_DTYPES
    from ..errors import SourceError

    for name, info in dst_source.tensors.items():
        other = src.tensors.get(name)
        if other is None or not info.shape or not other.shape:
            continue
        plain = info.dtype in FLOAT_SOURCE_DTYPES and other.dtype in FLOAT_SOURCE_DTYPES
        if not plain and layout not in (None, "plain"):
            continue  # a repacked weight (Marlin): its rows are permuted tiles
        shape = tuple(info.shape)
        spec = served.linears.get(info.module) if served is not None and not plain and info.leaf == "weight" else None
        if spec is not None and layout in (None, "plain"):
            shape = tuple(served.format.scheme(spec.algo).logical_shape(shape))
        if (shape != tuple(other.shape)) if plain else shape[0] != other.shape[0]:
            raise SourceError(f"--source {src.label}: {name} has shape {list(other.shape)}, DST's is {list(info.shape)}; "
                              "give the checkpoint DST was converted from")


def _samples(spec, root, src_root, vocab, samples, seq_len):
    """The eval samples, tokenized with DST's tokenizer (else SRC's: a converted copy may lack one)."""
    from ..errors import CalibrationError
    from .data import load_eval_samples

    try:
        return load_eval_samples(spec, root, vocab, samples, seq_len)
    except CalibrationError:
        if src_root is None:
            raise
        return load_eval_samples(spec, src_root, vocab, samples, seq_len)


def _describe(served) -> dict:
    """The checkpoint as served: format, algorithm, Linears by (algorithm, activation rule), KV cache."""
    rows: dict[tuple[str, str], int] = {}
    for spec in served.linears.values():
        key = (spec.algo, spec.act.kind if spec.act.scale is None else f"{spec.act.kind}, static")
        rows[key] = rows.get(key, 0) + 1
    kv = None
    if served.kv_cache:
        attn = sorted({n.rsplit(".", 1)[0] for n in served.tensors if n.endswith(("k_proj.k_scale", ".k_scale"))})
        kv = f"{len(attn)} attention module(s) with k/v scales" if attn else "no k/v scales in the checkpoint (vLLM uses 1.0)"
    return {"format": served.fmt, "quant_algo": served.quant_algo, "layout": served.layout or "plain",
            "quantized_linears": len(served.linears), "kv_cache": kv,
            "served": [{"algo": a, "activations": r, "count": c} for (a, r), c in sorted(rows.items())]}


def _warnings(result: EvalResult, served, src) -> list[str]:
    out = []
    share = result.data.get("calibration_overlap")
    if share:
        out.append(f"eval and calibration data overlap: {result.data['overlap_text']}; the figures flatter the "
                   "static scales; evaluate on other text (--data)")
    from ..algorithms import ALGORITHMS

    algos = {s.algo for s in served.linears.values()}
    for algo, what in ((a.name, a.blackwell_kernels) for a in ALGORITHMS.values() if a.blackwell_kernels):
        if algo in algos and not result.run.get("weights_only"):
            out.append(f"{algo}: activations are quantized as vLLM's native {what} kernels do (Blackwell); on Hopper vLLM "
                       f"serves {algo} weight-only (Marlin): rerun with --weights-only for that figure")
    pqs = sum(s.pre_quant_scale for s in served.linears.values())
    if pqs:  # said once: the one place eval follows TensorRT-LLM, not vLLM
        out.append(f"pre_quant_scale (ModelOpt AWQ) applied on {pqs} Linear(s): linear(act(x * pre_quant_scale), W), as "
                   "TensorRT-LLM computes it; vLLM 0.33 reads no pre_quant_scale (nor quant_algo NVFP4_AWQ / W4A16_AWQ)")
    if src is None and result.kind == "causal-lm":
        out.append("no --source: perplexity only (give --source SRC for the comparison, per-layer error and gates)")
    return out


__all__ = ["run_eval", "EvalResult", "Gate", "DEFAULT_SAMPLES", "DEFAULT_SEQ_LEN", "GATES", "SETTINGS", "check_convert_eval",
           "convert_eval_settings"]
