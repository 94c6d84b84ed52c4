"""``--rounding gptq`` and ``--smooth awq|smoothquant``: the options, and their step in ``convert``.

The transform needs to know what the conversion will write (which Linears, which scheme, which
fused groups share a global amax), so ``convert`` plans first from the headers (a *draft* plan),
runs the layer-streamed calibration with :class:`.layerwise.Layerwise` (one forward: the input
amax are measured on the transformed model), and plans again with the result: the source seen
through the side folder's replaced tensors, and the precomputed GPTQ outputs
(:mod:`.weights_file`). ``quantize calibrate`` runs the same step and keeps the folder beside its
SCALES.json (``SCALES.weights/``), which ``convert --act-scales`` then reuses.

In ``convert`` the forward is a stage of the output's lifecycle (:mod:`.stage`): it runs under
DST's lock, into the work folder, keyed by everything that decides it.
"""

from __future__ import annotations

import hashlib
import json
import os

from ..errors import CalibrationError, UsageError
from .methods import AWQ_GRID, ROUNDINGS, SMOOTHING, SMOOTHQUANT_ALPHA
SCALES_NAME = "scales.json"


def normalise(rounding: str | None, smooth: str | None) -> tuple[str, str]:
    """Lower-cased, checked values of ``--rounding`` and ``--smooth`` (UsageError otherwise)."""
    r, s = (rounding or "nearest").lower(), (smooth or "none").lower()
    if r not in ROUNDINGS:
        raise UsageError(f"--rounding {rounding!r}: choose nearest or gptq")
    if s not in SMOOTHING:
        raise UsageError(f"--smooth {smooth!r}: choose none, awq or smoothquant")
    return r, s


def asked(rounding: str | None, smooth: str | None) -> bool:
    r, s = normalise(rounding, smooth)
    return r != "nearest" or s != "none"


def check_options(rounding, smooth, calib_data, act_scales, algo_for=(), low_disk: bool = False) -> bool:
    """Usage errors of the two options (before anything is read); True when a transform is asked."""
    r, s = normalise(rounding, smooth)
    if r == "nearest" and s == "none":
        return False
    flags = " ".join(f for f, on in ((f"--rounding {r}", r != "nearest"), (f"--smooth {s}", s != "none")) if on)
    if calib_data is None and act_scales is None:
        raise UsageError(f"{flags} needs calibration data: add --calib-data DATA (default, FILE.jsonl, FILE.txt or a "
                         "cached dataset id), or --act-scales SCALES.json made by `quantize calibrate` with the same options")
    if low_disk:
        raise UsageError(f"{flags} with --low-disk: the calibration forward needs the whole source on disk; drop --low-disk")
    return True


def targets_of(plan) -> dict:
    """Every Linear the plan quantizes -> :class:`.layerwise.Target` (scheme, amax-sharing group)."""
    from .layerwise import Target

    out = {}
    for task in plan.tasks:
        if task.kind not in ("quantize", "moe"):
            continue
        scheme = task.scheme or plan.scheme
        members = list(task.members)
        if task.kind == "moe":  # per expert: gate and up share a global amax, down has its own
            groups = [members[i : i + 2] for i in range(0, len(members), 3)] + [[m] for m in members[2::3]]
        else:
            groups = [members] if scheme.shares_global_amax else [[m] for m in members]
        for group in groups:
            key = group[0].module
            for m in group:
                out[m.module] = Target(m.module, m.source, scheme, key)
    return out


def request_of(plan, rounding: str, smooth: str, device, data: dict | None) -> dict:
    """Everything that decides the side folder's tensors (compared before one is reused)."""
    from .. import CONVERTER
    from . import fingerprint
    from .gptq import BLOCK, DAMP

    targets = sorted((t.module, t.scheme.algo, t.group) for t in targets_of(plan).values())
    return {"method": {"rounding": rounding, "smooth": smooth, "gptq_block": BLOCK, "gptq_damp": DAMP, "act_order": True,
                       "awq_grid": AWQ_GRID, "smoothquant_alpha": SMOOTHQUANT_ALPHA},
            "algo": plan.scheme.algo, "format": plan.format.name, "scale_search": getattr(plan.scheme, "scale_search", "none"),
            "targets_sha256": hashlib.sha256(json.dumps(targets).encode()).hexdigest(), "device": getattr(device, "type", str(device)),
            "source": fingerprint(plan.source.config, plan.source.tensors), "data": data, "converter": CONVERTER}


def _num_heads(config: dict) -> int | None:
    for cfg in (config, config.get("text_config") or {}):
        if isinstance(cfg.get("num_attention_heads"), int):
            return cfg["num_attention_heads"]
    return None


def run(src: str, plan, calib_data: str, samples: int, seq_len: int, device, budget, rounding: str, smooth: str,
        folder: str, revision=None, quiet: bool = True, recipe=None, info=None, warn=None, data=None):
    """Calibrate `src` with the transform for `plan`; returns (ScalesDoc, WeightsDoc) (the doc saved in
    `folder`). `data`: the samples already read (``(ids, description)``, calibration.load_data)."""
    from . import calibrate, load_data
    from ..checkpoint.source import open_source
    from ..modules.recipe import load_recipe
    from .layerwise import Layerwise
    from . import data_key
    from .weights_file import WeightsWriter

    say = info or (lambda msg: None)
    source = open_source(src, revision=revision, quiet=quiet)
    rec = load_recipe(recipe, source.config.get("model_type"))
    data = data or load_data(source, calib_data, samples, seq_len, budget)
    request = request_of(plan, rounding, smooth, device, data_key(*data))
    writer = WeightsWriter(folder, request)
    lw = Layerwise(targets_of(plan), rounding, smooth, writer, device, _num_heads(source.config), say).bind(source.tensors)
    what = " + ".join(x for x, on in ((f"smoothing ({smooth})", smooth != "none"), ("GPTQ", rounding == "gptq")) if on) or "rounding"
    say(f"calibrating {source.label} with {what} for {plan.scheme.algo} on {device} with {calib_data} ({samples} x {seq_len} tokens at most)")
    doc = calibrate(source, rec, calib_data, samples, seq_len, device, budget,
                    progress=lambda i, n, s: say(f"  block {i}/{n}: {s:.2f} s"), transform=lw, data=data)
    weights = writer.finish({**_summary(lw.report), "data": doc.data})  # the data, as a calibrated output records it (eval's overlap check)
    doc.weights = {"folder": os.path.basename(folder), "sha256": weights.sha256, "request": request}
    doc.save(os.path.join(folder, SCALES_NAME))
    say(_describe(weights.summary))
    if smooth != "none" and not weights.summary.get("smoothed_mappings"):
        (warn or say)(_nothing_smoothed(smooth, rounding, source.config.get("model_type")))
    return doc, weights


def _nothing_smoothed(smooth: str, rounding: str, model_type) -> str:
    """--smooth found no pair to fold into (smooth.mappings knows Llama-style decoder layers only)."""
    rest = "GPTQ" if rounding == "gptq" else "round-to-nearest"
    return (f"--smooth {smooth}: nothing was smoothed: no layer of this model (model_type {model_type!r}) has the pairs "
            "it folds into (a norm before q/k/v or gate/up, v_proj before o_proj, up_proj before down_proj); "
            f"the weights are {rest} as without --smooth")


def _summary(r: dict) -> dict:
    out = {"modules": r["modules"], "seconds": round(r["seconds"], 3), "peak_hessian_bytes": r["peak_hessian_bytes"],
           "no_tokens": r["no_tokens"][:20], "damp_raised": r["damp_raised"][:20], "smoothed_mappings": r["smoothed"]}
    if r["rtn_error"] > 0:
        out["gptq_output_error_vs_rtn"] = round(r["gptq_error"] / r["rtn_error"], 6)
    if r["smooth_loss_unsmoothed"] > 0:
        out["smooth_loss_vs_unsmoothed"] = round(r["smooth_loss"] / r["smooth_loss_unsmoothed"], 6)
    return out


def _describe(s: dict) -> str:
    parts = [f"{s['modules']} Linears quantized in the forward"]
    if "gptq_output_error_vs_rtn" in s:
        parts.append(f"GPTQ output error {s['gptq_output_error_vs_rtn']:.3f}x round-to-nearest's on the calibration inputs")
    if s.get("smoothed_mappings"):
        parts.append(f"{s['smoothed_mappings']} smoothing scale vectors folded"
                     + (f" (search loss {s['smooth_loss_vs_unsmoothed']:.3f}x unsmoothed)" if "smooth_loss_vs_unsmoothed" in s else ""))
    return "; ".join(parts)


def from_scales_file(doc, plan, rounding: str, smooth: str, device):
    """The WeightsDoc a SCALES.json made by ``calibrate --rounding/--smooth`` names, checked against this plan."""
    from .weights_file import load, verify_digest

    flags = f"--rounding {rounding} --smooth {smooth}"
    if not doc.weights:
        raise UsageError(f"--act-scales {doc.path}: made without --rounding/--smooth, but this conversion asks for {flags}; "
                         f"make it with `quantize calibrate ... {flags} --algo {plan.scheme.algo}` or drop them")
    folder = os.path.join(os.path.dirname(os.path.abspath(doc.path)), doc.weights["folder"])
    weights = load(folder)
    want = request_of(plan, rounding, smooth, device, weights.request.get("data"))
    differ = _differences(weights.request, want)
    if differ:
        raise UsageError(f"--act-scales {doc.path}: its weights ({folder}) were made with {'; '.join(differ)}; "
                         "calibrate again with this conversion's --algo, --format, --scale-search, --exclude and method options")
    if weights.sha256 != doc.weights.get("sha256") or not verify_digest(weights):
        raise CalibrationError(f"{folder}: its files changed since {doc.path} was written; run `quantize calibrate` again")
    return weights


# request key -> the option that sets it (what a mismatch message names, issue 35 item 11)
_OPTION = {"rounding": "--rounding", "smooth": "--smooth", "algo": "--algo", "format": "--format",
           "scale_search": "--scale-search", "targets_sha256": "the quantized Linears (--algo-for / --exclude)",
           "source": "the source checkpoint", "device": "the device type (--device: GPU and CPU arithmetic differ)",
           "converter": "the converter's byte-deciding version", "data": "the calibration data"}


def _differences(made: dict, want: dict) -> list[str]:
    """'OPTION X, this conversion has Y' for each deciding value that differs (method keys one by one)."""
    out = []
    m, w = made.get("method") or {}, want.get("method") or {}
    for key in sorted(set(m) | set(w), key=lambda k: (k not in _OPTION, k)):
        if m.get(key) != w.get(key):
            out.append(f"{_OPTION.get(key, f'the converter constant {key}')} {_short(m.get(key))}, this conversion has {_short(w.get(key))}")
    for key in ("algo", "format", "scale_search", "targets_sha256", "source", "device", "converter", "data"):
        if made.get(key) != want.get(key):
            out.append(f"{_OPTION[key]} {_short(made.get(key))}, this conversion has {_short(want.get(key))}")
    return out


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


def keeps_scales(opts, draft) -> bool:
    """Does the final plan read the forward's scales doc? Where it takes calibrated scales (static
    input scales, an FP8 KV cache) or channel statistics (a weighted --scale-search of the Linears
    round to nearest quantizes after --smooth: the recorded pass of calibration.forward). Every
    scheme the draft writes counts (``--algo-for`` rules too: issue 35 item 1)."""
    from .uses import decides_bytes

    return decides_bytes([draft.scheme_of(m.name) for m in draft.quantized] or [draft.scheme],
                         (opts.kv_cache_dtype or "").lower() == "fp8")


def weights_for_convert(opts, ok, con, draft, device):
    """``(scales doc or None, WeightsDoc or None)`` for ``convert`` with --rounding / --smooth when
    they come without this run's forward, else None (the forward is then the run's own stage,
    calibration/stage.py, run under DST's lock).

    `draft`: the plan from the headers (no calibration), its problems already refused; the forward
    runs on `device`. ``--act-scales`` gives both from ``calibrate``'s files; a dry run checks the
    data and the architecture (``plan_calibration``) and returns no weights."""
    from . import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN, load as load_scales
    from .entry import plan_calibration

    rounding, smooth = normalise(opts.rounding, opts.smooth)
    keep = keeps_scales(opts, draft)
    if opts.act_scales is not None:
        doc = load_scales(opts.act_scales)
        from .document import check_source, fingerprint

        check_source(doc, fingerprint(draft.source.config, draft.source.tensors), draft.source.label)
        return (doc if keep else None), from_scales_file(doc, draft, rounding, smooth, device)
    if opts.dry_run:
        samples, seq_len = opts.calib_samples or DEFAULT_SAMPLES, opts.calib_seq_len or DEFAULT_SEQ_LEN
        planned = plan_calibration(opts.src, opts.calib_data, samples, seq_len, device, ok.budget, opts.revision,
                                   opts.quiet, opts.recipe, con.info)
        return (planned if keep else None), None
    return None


def check_calibrate(rounding, smooth, algo, output) -> tuple[str, str]:
    """Usage errors of ``calibrate --rounding gptq / --smooth`` (it needs --algo and -o)."""
    rounding, smooth = normalise(rounding, smooth)
    flags = f"--rounding {rounding} --smooth {smooth}"
    if not algo:
        raise UsageError(f"calibrate {flags}: the weights depend on the format they are made for; add --algo ALGO "
                         "(and --format / --scale-search / --exclude as the conversion will use them)")
    if not output:
        raise UsageError(f"calibrate {flags}: needs -o SCALES.json (the weights are written beside it)")
    return rounding, smooth


def calibrate_weights(src: str, draft, calib_data: str, output: str, samples: int, seq_len: int, device, budget, revision,
                      recipe, quiet: bool, con, rounding: str, smooth: str):
    """``quantize calibrate --rounding gptq / --smooth`` for the `draft` plan (the conversion's, from
    the headers): SCALES.json and ``SCALES.weights/`` beside it."""
    flags = f"--rounding {rounding} --smooth {smooth}"
    stem = output[:-5] if output.endswith(".json") else output
    doc, _ = run(src, draft, calib_data, samples, seq_len, device, budget, rounding, smooth, f"{stem}.weights", revision,
                 quiet, recipe, con.info, con.warn)
    doc.save(output)
    con.info(f"wrote {output} and {stem}.weights/ (use: quantize convert {src} -o DST --algo {draft.scheme.algo} "
             f"--act-scales {output} {flags})")
    return doc


def refuse_weight_flags(algo, fmt, scale_search, exclude) -> None:
    """``calibrate`` without --rounding gptq / --smooth: the options that only serve them are usage errors."""
    from ..formats import MODELOPT, format_named

    given = [f for f, on in (("--algo", algo), ("--format", fmt is not None and format_named(fmt) is not MODELOPT),
                             ("--scale-search", (scale_search or "none").lower() != "none"), ("--exclude", exclude)) if on]
    if given:
        raise UsageError(f"calibrate {' '.join(given)}: only with --rounding gptq or --smooth (the activation amax do not depend on them)")


__all__ = ["ROUNDINGS", "normalise", "asked", "check_options", "targets_of", "request_of", "run", "from_scales_file", "keeps_scales", "weights_for_convert", "check_calibrate", "calibrate_weights", "refuse_weight_flags"]
