"""``convert``'s steps before the first tensor is read, and ``quantize check``: torch-free.

options -> plan -> validate (docs/architecture.md): :func:`check_options` (every usage error, in
the first second), :func:`make_plan` (SRC's headers, the recipe, the plan), :func:`raise_problems`
(every problem at once) and, for ``--dry-run``, :func:`print_plan`. They need metadata only
(safetensors dtype names, shapes, byte sizes, algorithm facts), so ``quantize check`` and ``convert
--dry-run`` import neither torch nor Triton (tests/test_torch_free.py). The exceptions import what
they need: calibration (``--calib-data``, ``--act-scales``: transformers and torch), ``--executor
ray``, an example checkpoint generated on first use, and a device that only torch can resolve
(``--device cuda``; ``auto`` where a dry run's ``--report`` records it or ``--kernels triton`` checks
it). Nothing here writes a file: the report, DST and the work folder are the output lifecycle's
(convert.py, output/).
"""

from __future__ import annotations

import os
from dataclasses import replace

from ..algorithms import alias_format_problem
from ..checkpoint.durable import write_json
from ..checkpoint.source import open_source
from ..console import Console
from ..errors import PlanError, UsageError
from ..modules.matching import regex_problem
from ..modules.recipe import load_recipe
from ..schemes import get_scheme
from ..schemes.searched import with_scale_search
from .build import Plan, build_plan, parse_size
from .mixed import parse_algo_for
from .options import Checked, ConvertOptions
from .output_paths import check_json_output
from ..problems import WARNING


def _scheme_of(algo: str, fmt, scale_search: str, algo_for=()):
    """The scheme `fmt` writes for `algo` with `scale_search`, or the UsageError of the pair (torch-free:
    check_options says it before any calibration or read, issue 36; prepare uses the same)."""
    scheme = fmt.scheme(get_scheme(algo).algo)
    problem = fmt.scale_search_problem(scale_search, scheme.algo)
    if problem:
        raise UsageError(problem)
    _not_yet_with_mixed(algo_for, scheme, scale_search)
    return with_scale_search(scheme, scale_search)


def _not_yet_with_mixed(algo_for, scheme, scale_search: str = "none") -> None:
    """--algo-for (mixed precision, either format) is written without searched scales, for now."""
    if not algo_for:
        return
    if (scale_search or "none").lower() != "none":
        raise UsageError(f"--algo-for with --scale-search {scale_search}: searched scales apply to single-algorithm "
                         "checkpoints only for now; drop one of the two")


def _local_options(src: str, revision: str | None, exclude) -> None:
    """Options that cannot apply are usage errors, not silently ignored."""
    if revision and (src.startswith("example:") or os.path.exists(src)):
        raise UsageError(f"--revision {revision}: {src} is a local checkpoint, which has no revisions; drop --revision")
    for pat in exclude or ():
        if not str(pat).strip():
            raise UsageError("--exclude '': an empty pattern matches every module (vLLM's substring rule); remove it or give a pattern")
        if regex_problem(str(pat)):
            raise UsageError(regex_problem(str(pat)))


def _size(value, flag: str) -> int:
    try:
        n = parse_size(value)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    if n <= 0:
        raise UsageError(f"{flag}: must be positive, got {value!r}")
    return n


def _kv(kv_cache_dtype: str | None) -> str | None:
    if kv_cache_dtype in (None, "", "none", "auto"):
        return None
    if kv_cache_dtype.lower() != "fp8":
        raise UsageError(f"--kv-cache-dtype {kv_cache_dtype!r}: only fp8 is supported (ModelOpt 'cast' mode, no scale tensors)")
    return "fp8"


def prepare(src: str, algo: str, exclude=(), recipe=None, kv_cache_dtype=None, max_shard_size="5GB", revision=None, quiet=True,
            layout: str = "plain", headers_only: bool = False, scale_search: str = "none", act_scales=None,
            format: str = "modelopt", algo_for=(), weights=None) -> Plan:
    """Resolve SRC, load the recipe and build the plan (no tensor data is read).

    `headers_only`: a Hub repo id planned from its remote headers (nothing downloaded yet).
    """
    from ..checkpoint.hub import open_hub_headers
    from ..formats import format_named

    fmt = format_named(format)
    scheme = _scheme_of(algo, fmt, scale_search, algo_for)
    source = open_hub_headers(src, revision, pin=True) if headers_only else open_source(src, revision=revision, quiet=quiet)
    rec = load_recipe(recipe, source.config.get("model_type"))
    _size(max_shard_size, "--max-shard-size")
    if weights is not None:  # --rounding gptq / --smooth: smoothed tensors are read from the side folder
        source = weights.overlay(source)
    plan = build_plan(source, scheme, rec, list(exclude), max_shard_size, _kv(kv_cache_dtype), layout=layout,
                      act_scales=act_scales, algo_for=parse_algo_for(algo_for, fmt), fmt=fmt)
    return plan if weights is None else replace(plan, weights=weights)


def check(src: str, algo: str, exclude=(), recipe: str | None = None, tp: int = 1, json: str | None = None,
          strict: bool = False, revision: str | None = None, quiet: bool = False, console: Console | None = None,
          format: str = "modelopt", algo_for=(), calib_data: str | None = None, act_scales: str | None = None, allow=()):
    """``quantize check``: plan from headers only and report every finding; raise CheckFailed on errors.

    For a Hub repo id only config.json and the safetensors headers are fetched. `calib_data` /
    `act_scales`: the conversion will be calibrated (checked as convert checks them from their values;
    no forward runs here), so the ``uncalibrated`` warning does not apply. `allow`: warning codes
    ``--strict`` accepts (``--allow int8-vllm``); errors are never allowed.
    """
    from .check import run_check
    from ..checkpoint.hub import open_hub_headers
    from ..repo_id import is_repo_id
    from ..errors import CheckFailed
    from ..formats import format_named

    fmt = format_named(format)
    problem = alias_format_problem(algo, fmt.name)
    if problem:
        raise UsageError(problem)
    scheme = fmt.scheme(get_scheme(algo).algo)
    _local_options(src, revision, exclude)
    rules = parse_algo_for(algo_for, fmt)
    _not_yet_with_mixed(algo_for, scheme)
    if tp < 1:
        raise UsageError(f"--tp {tp}: must be a positive number of tensor-parallel ranks")
    from .preflight import check_allow, check_calibration

    check_allow(strict, allow)
    check_calibration(calib_data, None, None, act_scales)
    if act_scales is not None and not os.path.isfile(act_scales):
        raise UsageError(f"--act-scales {act_scales}: no such file; give the SCALES.json `quantize calibrate` wrote")
    if json:
        check_json_output(json, "--json", (src if os.path.isdir(src) else None,))
    local = src.startswith("example:") or os.path.isdir(src) or not is_repo_id(src, owner_required=False)
    source = open_source(src, revision=revision) if local else open_hub_headers(src, revision)
    rec = load_recipe(recipe, source.config.get("model_type"))
    plan = build_plan(source, scheme, rec, list(exclude), tp=tp, algo_for=rules, fmt=fmt)
    result = run_check(plan, list(exclude), tp)
    if calib_data is not None or act_scales is not None:  # convert will calibrate: the constants are replaced
        result.findings[:] = [f for f in result.findings if f.code != "uncalibrated"]
    print(result.to_text(), flush=True)
    if json:
        write_json(json, result.to_json())
    from .preflight import allowed_codes

    allowed = allowed_codes(allow, result.warnings, None if quiet else lambda m: print(m, flush=True))
    refused = [f for f in result.warnings if f.code not in allowed]
    bad = result.errors or (strict and refused)
    if bad:
        what = f"{len(result.errors)} error(s)" + (f", {len(refused)} warning(s) (--strict)" if strict else "")
        raise CheckFailed(f"check failed for {src} with {scheme.algo}: {what}; see the findings above")
    return result


def raise_problems(plan: Plan, strict: bool = False, warned=(), allow=(), note=None) -> None:
    """Refuse a plan with problems: all of them at once, before any tensor is read; with `strict`
    (``--strict``) one with warnings too (the plan's and `warned`, the findings said while planning),
    except those whose code is in `allow` (``--allow CODE``; `note` hears of a code matching none)."""
    if plan.problems:
        n = len(plan.problems)
        from .suggest import fix_line

        fix = fix_line(plan.modules, plan.findings)
        raise PlanError(f"{n} problem(s) found before converting {plan.source.label}; nothing was written:",
                        details=plan.problems + ([fix] if fix else []))
    if strict:
        from .preflight import strict_refusal

        strict_refusal(list(warned) + [f for f in plan.findings if f.level == WARNING], plan.source.label, allow, note)


def check_options(opts: ConvertOptions) -> Checked:
    """Every usage error of `opts` about what is written, before any download or read (the order
    decides which is said first). How it runs (--executor, --device, --kernels) is checked next by
    run.options.check_run_options; DST, --report and --push-to-hub by the output lifecycle."""
    from ..formats import format_named
    from .preflight import check_allow, check_calibration

    src, dst = opts.src, opts.dst
    with_scale_search(get_scheme(opts.algo), opts.scale_search)
    fmt = format_named(opts.format)
    problem = alias_format_problem(opts.algo, fmt.name)
    if problem:
        raise UsageError(problem)
    _scheme_of(opts.algo, fmt, opts.scale_search, opts.algo_for)  # the format's own refusals of the pair, before calibrating
    parse_algo_for(opts.algo_for, fmt)
    from ..calibration.weights_entry import check_options as check_weights  # torch-free

    check_weights(opts.rounding, opts.smooth, opts.calib_data, opts.act_scales, opts.algo_for, opts.low_disk)
    _kv(opts.kv_cache_dtype)
    budget = _size(opts.memory_budget, "--memory-budget")
    _size(opts.max_shard_size, "--max-shard-size")
    if opts.layout not in ("plain", "marlin", "cutlass", "flashinfer"):
        raise UsageError(f"--layout {opts.layout!r}: choose plain, marlin, cutlass or flashinfer")
    if fmt.layout_problem(opts.layout):
        raise UsageError(fmt.layout_problem(opts.layout))
    local_src = src.startswith("example:") or os.path.exists(src)
    if opts.low_disk and local_src:
        raise UsageError(f"--low-disk {src}: only for Hub repo ids (a local checkpoint is already on disk)")
    _local_options(src, opts.revision, opts.exclude)
    check_calibration(opts.calib_data, opts.calib_samples, opts.calib_seq_len, opts.act_scales, opts.scale_search)
    check_allow(opts.strict, opts.allow)
    if not opts.dry_run and not dst:
        raise UsageError("convert needs -o DST (or --dry-run)")
    return Checked(budget, fmt, not local_src)


# Warnings of a draft plan (GPTQ / smoothing) that the stage's calibration forward answers.
STAGE_PROVIDES = ("uncalibrated", "search-data-free")


def make_plan(opts: ConvertOptions, ok: Checked, con: Console, device="cpu") -> Plan:
    """Resolve SRC (calibrating first when asked, on `device`) and plan from its headers.

    With ``--rounding gptq`` / ``--smooth`` (and no ``--act-scales``) the plan is a *draft* whose
    ``transform`` (calibration/stage.Pending) names the forward still to run: convert runs it under
    DST's lock and plans again with :func:`plan_with_weights`."""
    from ..calibration.weights_entry import asked

    if asked(opts.rounding, opts.smooth):  # GPTQ / smoothing: a draft plan says what the forward quantizes
        from ..calibration.stage import for_convert

        draft = _prepare(opts, ok)
        raise_problems(draft)  # refuse a bad plan before the forward, not after it
        doc, weights, step = for_convert(opts, ok, con, draft, device)
        if step is None:
            return _prepare(opts, ok, doc, weights)
        # the stage's forward calibrates what the draft would write with constants (as `check --calib-data` says)
        # and weights the scale search by the activations it sees: neither warning applies to the final plan
        return replace(draft, transform=step, findings=[f for f in draft.findings if f.code not in STAGE_PROVIDES])
    algos = [opts.algo] + [rule.scheme.algo for rule in parse_algo_for(opts.algo_for, ok.format)]
    doc = _scales(opts.src, algos, opts.calib_data, opts.calib_samples, opts.calib_seq_len, opts.act_scales, device,
                  ok.budget, opts.revision, opts.quiet, opts.low_disk, opts.recipe, con, opts.dry_run, _kv(opts.kv_cache_dtype) == "fp8",
                  opts.scale_search)
    return _prepare(opts, ok, doc)


def plan_with_weights(opts: ConvertOptions, ok: Checked, draft: Plan, doc, weights) -> Plan:
    """The final plan of a draft once its transform ran: the source read through the weights'
    folder, its activation scales `doc` (or None); the step stays on it (the run identity's)."""
    return replace(_prepare(opts, ok, doc, weights), transform=draft.transform)


def _prepare(opts: ConvertOptions, ok: Checked, doc=None, weights=None) -> Plan:
    # Headers only: --low-disk fetches shards as it goes, Ray workers fetch their own, and a dry
    # run reads no tensor (it used to download a Hub model's whole snapshot to print a plan).
    headers_only = opts.low_disk or (ok.on_hub and (opts.executor == "ray" or (opts.dry_run and not opts.calib_data)))
    return prepare(opts.src, opts.algo, opts.exclude, opts.recipe, opts.kv_cache_dtype, opts.max_shard_size, opts.revision,
                   opts.quiet, opts.layout, headers_only, opts.scale_search, act_scales=doc, format=ok.format.name,
                   algo_for=opts.algo_for, weights=weights)


def print_plan(plan: Plan, strict: bool = False, warned=(), allow=(), note=None) -> None:
    """--dry-run: the plan, one line per module, then refuse its problems (all at once) and, with
    ``--strict``, its warnings but `allow`'s (as ``check --strict --allow``)."""
    print(plan.to_text(), flush=True)
    raise_problems(plan, strict, warned, allow, note)


def _scales(src, algos, calib_data, calib_samples, calib_seq_len, act_scales, dev, budget, revision, quiet, low_disk, recipe, con,
            dry_run=False, kv_cache=False, scale_search=None):
    """--calib-data / --act-scales -> the ScalesDoc the plan resolves (calibration/entry.py), or None."""
    if calib_data is None and act_scales is None and calib_samples is None and calib_seq_len is None:
        return None  # the data-free path: nothing of calibration (nor transformers) is imported
    from ..calibration.entry import scales_for_convert

    return scales_for_convert(src, algos, calib_data, calib_samples, calib_seq_len, act_scales, dev, budget, revision, quiet,
                              low_disk, recipe, con.info, con.warn, dry_run, kv_cache, scale_search)
