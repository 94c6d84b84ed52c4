"""Library entry points: one function per command, each the CLI's command with the flags' names.

``convert`` takes one :class:`ConvertOptions` and runs it (convert.py: options -> plan -> validate ->
execute -> the output's life); ``check``, ``verify``, ``unpack``, ``push``, ``calibrate`` and
``prepare`` (a plan from headers, nothing written) take keywords. Heavy modules (torch, the
executors, transformers) are imported inside them, so ``quantize check`` imports no torch.
"""

from __future__ import annotations

import os

from .checkpoint.durable import write_json
from .console import Console
from .convert import ConvertResult
from .devices import resolve_device
from .console import human_bytes
from .plan.options import ConvertOptions
from .plan.output_paths import check_json_output
from .plan.steps import _size, check, prepare  # noqa: F401  (check, prepare: the library's entry points too)


def verify(dst: str, source: str | None = None, json: str | None = None, strict: bool = False, quiet: bool = False):
    """``quantize verify``: check a converted checkpoint as a loader would; raise CheckFailed on errors."""
    from .errors import CheckFailed
    from .verify import verify_checkpoint

    if json:
        check_json_output(json, "--json", (dst, source if source and os.path.isdir(source) else None))
    result = verify_checkpoint(dst, source)
    print(result.to_text(), flush=True)
    if json:
        write_json(json, result.to_json())
    if result.errors or (strict and result.warnings):
        raise CheckFailed(f"verify failed for {dst}: {len(result.errors)} error(s), {len(result.warnings)} warning(s); see the findings above")
    return result


def unpack(dst: str, output: str, overwrite: bool = False, quiet: bool = False, console: Console | None = None) -> str:
    """``quantize unpack``: a packed-layout checkpoint back to the plain one (byte-identical to a plain conversion)."""
    from .errors import SourceError
    from .output.destination import Destination

    Destination(output, overwrite=overwrite)  # refuse an existing output first
    if not os.path.isdir(dst):  # before torch (issue 26: refusals that need no tensor data are instant)
        raise SourceError(f"{dst}: no such folder; unpack takes the output of convert --layout marlin|cutlass|flashinfer")
    from .formats.layout_record import layout_record

    layout_record(dst)  # nothing to unpack (another format, a plain output): said before torch
    from .unpack import unpack_checkpoint

    path = unpack_checkpoint(dst, output, overwrite=overwrite)
    (console or Console(quiet)).info(f"wrote {path}")
    return path


def convert(options: ConvertOptions, console: Console | None = None) -> ConvertResult:
    """Convert checkpoint ``options.src`` into ``options.dst`` (see ``docs/cli.md``; the steps: convert.py).

    `options`: one :class:`~quantize_cli.plan.options.ConvertOptions` (the CLI builds the same value
    from its flags), e.g. ``convert(ConvertOptions("my-model", "out", algo="NVFP4"))``. Raises
    :class:`QuantizeError` subclasses for every user-facing failure; DST only ever appears complete.
    """
    from .convert import convert as run

    if not isinstance(options, ConvertOptions):
        raise TypeError("convert takes one ConvertOptions, e.g. convert(ConvertOptions(src, dst, algo='NVFP4'))")
    return run(options, console)


def calibrate(src: str, calib_data: str = "default", output: str | None = None, calib_samples: int | None = None,
              calib_seq_len: int | None = None, device: str = "auto", memory_budget: str | int = "4GB",
              revision: str | None = None, recipe: str | None = None, quiet: bool = False, console: Console | None = None,
              rounding: str = "nearest", smooth: str = "none", algo: str | None = None, format: str = "modelopt",
              scale_search: str = "none", exclude=()):
    """``quantize calibrate``: measure activation amax of `src` on `calib_data`; write SCALES.json to `output`.

    With `rounding` ``gptq`` / `smooth`: also the weights they choose for `algo` (calibration/weights_entry.py)."""
    from .plan.preflight import check_calibration, check_source_path

    con = console or Console(quiet)
    check_calibration(calib_data, calib_samples, calib_seq_len)  # 0 is refused, not taken for the default
    check_source_path(src)  # these refusals come before torch and transformers are imported (issue 26)
    if output:
        check_json_output(output, "-o", (src if os.path.isdir(src) else None,))
    from .calibration import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN
    from .calibration.entry import run_calibration
    from .calibration.weights_entry import asked, calibrate_weights, check_calibrate, refuse_weight_flags

    if asked(rounding, smooth):  # the weights are made for the conversion's plan: planned here from the headers
        from .plan.steps import raise_problems

        rounding, smooth = check_calibrate(rounding, smooth, algo, output)
        draft = prepare(src, algo, tuple(exclude), recipe, None, "5GB", revision, quiet, scale_search=scale_search, format=format)
        raise_problems(draft)
        return calibrate_weights(src, draft, calib_data, output, calib_samples or DEFAULT_SAMPLES, calib_seq_len or DEFAULT_SEQ_LEN,
                                 resolve_device(device), _size(memory_budget, "--memory-budget"), revision, recipe, quiet, con,
                                 rounding, smooth)
    refuse_weight_flags(algo, format, scale_search, exclude)
    dev = resolve_device(device)
    doc = run_calibration(src, calib_data, calib_samples or DEFAULT_SAMPLES, calib_seq_len or DEFAULT_SEQ_LEN, dev,
                          _size(memory_budget, "--memory-budget"), revision, quiet, recipe, con.info)
    if output:
        doc.save(output)
        con.info(f"wrote {output}")
    return doc


def push(dst: str, repo_id: str, private: bool = False, revision_out: str | None = None, json: str | None = None,
         quiet: bool = False, console: Console | None = None) -> dict:
    """``quantize push``: upload finished checkpoint `dst` to Hub repo `repo_id` (publish.py); a rerun resumes."""
    from .output.publish import push as run

    if json:
        check_json_output(json, "--json", (dst,))
    record = run(dst, repo_id, private=private, revision_out=revision_out, quiet=quiet)
    if json:
        write_json(json, record)
    (console or Console(quiet)).info(f"pushed {dst} to {record['url']} ({record['revision']}, commit {record['commit']}): "
                                     f"{record['files']} file(s), {human_bytes(record['bytes'])}")
    return record


# --- quantize eval (issue 24): the accuracy as served; quantize_cli/eval/ -------------------------


def eval(dst: str, source: str | None = None, data: str = "default", samples: int | None = None, seq_len: int | None = None,
         device: str = "auto", json: str | None = None, max_ppl_increase: float | None = None, max_kl: float | None = None,
         min_top1: float | None = None, weights_only: bool = False, quiet: bool = False, console: Console | None = None,
         min_cosine: float | None = None, min_sample_cosine: float | None = None):
    """``quantize eval``: measure `dst` as served (vs `source`); raise CheckFailed when a gate fails.

    The result is printed (the last line: verdict and key numbers) and written to `json` either way;
    a refusal once the options are checked (unreadable DST or data, a gate of the other kind of
    model) writes `json` too, with ``ok: false`` and the error."""
    from .errors import CheckFailed, QuantizeError
    from .eval import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN, run_eval
    from .eval.progress import layer_bar

    if json:
        check_json_output(json, "--json", (dst if os.path.isdir(dst) else None, source if source and os.path.isdir(source) else None))
    try:
        with layer_bar(quiet) as bar:
            result = run_eval(dst, source=source, data=data, samples=samples or DEFAULT_SAMPLES,
                              seq_len=seq_len or DEFAULT_SEQ_LEN, device=device, weights_only=weights_only,
                              max_ppl_increase=max_ppl_increase, max_kl=max_kl, min_top1=min_top1, min_cosine=min_cosine,
                              min_sample_cosine=min_sample_cosine, progress=bar)
    except QuantizeError as exc:  # CI reads the JSON for every outcome (docs/ci.md)
        if json:
            from .eval.report import refusal_json

            write_json(json, refusal_json(dst, source, exc))
        raise
    print(result.to_text(), flush=True)  # its warnings included
    if json:
        write_json(json, result.to_json())
    if not result.passed:
        from .eval.report import gate_failure

        raise CheckFailed(gate_failure(dst, result))
    return result
