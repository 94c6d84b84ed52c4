"""``convert``'s steps before the first tensor is read, and ``quantize check``: torch-free.

options -> plan -> validate (docs/architecture.md): :func:`check_options` (every usage error, in
the first second), :func:`make_plan` (SRC's headers, the recipe, the plan), :func:`validate` (every
problem at once) and, for ``--dry-run``, :func:`dry_run`. They need metadata only (safetensors
dtype names, shapes, byte sizes, algorithm facts), so ``quantize check`` and ``convert --dry-run``
import neither torch nor Triton (tests/test_torch_free.py). The exceptions import what they need:
calibration (``--calib-data``, ``--act-scales``: transformers and torch), ``--executor ray``,
an example checkpoint generated on first use, and a device that only torch can resolve
(``--device cuda``; ``auto`` where a dry run's ``--report`` records it or ``--kernels triton``
checks it).
"""

from __future__ import annotations

import os
from dataclasses import replace

from ..output.destination import Destination
from ..checkpoint.source import open_source
from ..console import Console
from ..devices import check_name, resolve_device, without_torch
from ..errors import PlanError, QuantizeError, UsageError
from .mixed import parse_algo_for
from .options import Checked, ConvertOptions
from .output_paths import check_json_output
from .build import Plan, build_plan, parse_size
from .recipe import load_recipe
from ..output.report import run_report, unplanned_report, write_json
from ..schemes import get_scheme
from ..schemes.searched import with_scale_search


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
            format: str = "modelopt", algo_for=()) -> Plan:
    """Resolve SRC, load the recipe and build the plan (no tensor data is read).

    `headers_only`: a Hub repo id planned from its remote headers (nothing downloaded yet).
    """
    from ..checkpoint.hub import open_hub_headers
    from ..formats import format_of, scheme_for

    scheme = scheme_for(format, get_scheme(algo))
    if (scale_search or "none").lower() != "none" and format_of(scheme) != "modelopt":
        raise UsageError(f"--scale-search {scale_search} --format {format}: searched scales are written in the ModelOpt format "
                         "only for now; drop --scale-search or use --format modelopt")
    _not_yet_with_mixed(algo_for, scheme, scale_search)
    scheme = with_scale_search(scheme, scale_search)
    source = open_hub_headers(src, revision, pin=True) if headers_only else open_source(src, revision=revision, quiet=quiet)
    rec = load_recipe(recipe, source.config.get("model_type"))
    return build_plan(source, scheme, rec, list(exclude), _size(max_shard_size, "--max-shard-size"), _kv(kv_cache_dtype),
                      layout=layout, act_scales=act_scales, algo_for=parse_algo_for(algo_for, format))


def check(src: str, algo: str, exclude=(), recipe: str | None = None, tp: int = 1, json: str | None = None,
          strict: bool = False, revision: str | None = None, quiet: bool = False, console: Console | None = None,
          format: str = "modelopt", algo_for=()):
    """``quantize check``: plan from headers only and report every finding; raise CheckFailed on errors.

    For a Hub repo id only config.json and the safetensors headers are fetched.
    """
    from .check import run_check
    from ..checkpoint.hub import open_hub_headers
    from ..repo_id import is_repo_id
    from ..errors import CheckFailed
    from ..formats import scheme_for

    scheme = scheme_for(format, get_scheme(algo))
    _local_options(src, revision, exclude)
    rules = parse_algo_for(algo_for, format)
    _not_yet_with_mixed(algo_for, scheme)
    if tp < 1:
        raise UsageError(f"--tp {tp}: must be a positive number of tensor-parallel ranks")
    if json:
        check_json_output(json, "--json", (src if os.path.isdir(src) else None,))
    local = src.startswith("example:") or os.path.isdir(src) or not is_repo_id(src, owner_required=False)
    source = open_source(src, revision=revision) if local else open_hub_headers(src, revision)
    rec = load_recipe(recipe, source.config.get("model_type"))
    plan = build_plan(source, scheme, rec, list(exclude), tp=tp, algo_for=rules)
    result = run_check(plan, list(exclude), tp)
    print(result.to_text(), flush=True)
    if json:
        write_json(json, result.to_json())
    bad = result.errors or (strict and result.warnings)
    if bad:
        what = f"{len(result.errors)} error(s)" + (f", {len(result.warnings)} warning(s) (--strict)" if strict else "")
        raise CheckFailed(f"check failed for {src} with {scheme.algo}: {what}; see the findings above")
    return result


def raise_problems(plan: Plan) -> None:
    """Refuse a plan with problems: all of them at once, before any tensor is read."""
    if plan.problems:
        n = len(plan.problems)
        raise PlanError(f"{n} problem(s) found before converting {plan.source.label}; nothing was written:", details=plan.problems)


def check_options(opts: ConvertOptions) -> Checked:
    """Every usage error of `opts`, before any download or read (the order decides which is said first).

    Torch-free (issue 26: a refusal in a fraction of a second): the device stays a name here;
    :func:`with_device` resolves it once the plan is validated."""
    from ..formats import check_format, layout_problem
    from ..run.kernel_choice import check_kernels
    from ..output.publish import check_push_options
    from .preflight import check_calibration, check_source_path

    src, dst = opts.src, opts.dst
    with_scale_search(get_scheme(opts.algo), opts.scale_search)
    parse_algo_for(opts.algo_for)
    _kv(opts.kv_cache_dtype)
    budget = _size(opts.memory_budget, "--memory-budget")
    _size(opts.max_shard_size, "--max-shard-size")
    if opts.layout not in ("plain", "marlin", "cutlass", "flashinfer"):
        raise UsageError(f"--layout {opts.layout!r}: choose plain, marlin, cutlass or flashinfer")
    device, ray_device = check_name(opts.device), None
    if opts.executor != "local":  # Ray tasks ask for their own GPU: the driver itself needs none
        from ..run import ray_executor  # Ray itself is imported only there

        device, ray_device = "cpu", ray_executor.check_options(opts.executor, opts.device)
    format = check_format(opts.format)
    if layout_problem(format, opts.layout):
        raise UsageError(layout_problem(format, opts.layout))
    check_calibration(opts.calib_data, opts.calib_samples, opts.calib_seq_len, opts.act_scales)
    kernels = check_kernels(opts.kernels, ray_device or device, format != "modelopt")  # "auto": checked again resolved
    local_src = src.startswith("example:") or os.path.exists(src)
    if opts.low_disk and local_src:
        raise UsageError(f"--low-disk {src}: only for Hub repo ids (a local checkpoint is already on disk)")
    _local_options(src, opts.revision, opts.exclude)
    check_source_path(src)
    if not local_src and without_torch(device, auto_is_read=False) is None:
        resolve_device(device)  # a Hub SRC is downloaded next: a GPU that is not there is said first
    finished = not opts.dry_run and opts.resume and not opts.overwrite and _finished(dst)  # a retry after success
    if not opts.dry_run:
        if not dst:
            raise UsageError("convert needs -o DST (or --dry-run)")
        local = src if os.path.isdir(src) else None  # DST inside/equal to a local SRC: say so, not "--overwrite"
        if not finished:
            Destination(dst, src_root=local, overwrite=opts.overwrite)  # an existing DST fails before any download
    if opts.report:  # never over SRC's or DST's files, a device, a folder or a file that is not a report
        check_json_output(opts.report, "--report", (src if os.path.isdir(src) else None, dst))
    check_push_options(opts.push_to_hub, opts.private, opts.revision_out)
    if opts.push_to_hub and not opts.dry_run:  # the token and write access, before the first byte (network)
        from ..output.publish import check_push_access

        check_push_access(opts.push_to_hub)
    return Checked(budget, device, ray_device, format, kernels, bool(finished), not local_src)


def with_device(opts: ConvertOptions, ok: Checked) -> Checked:
    """`ok` with its device resolved through torch (after every refusal that needs no tensor data).

    A dry run reads no tensor: there the device stays a name (no torch) unless calibration ran on
    it, or something reads what "auto" resolves to (--report records it, --kernels triton checks it)."""
    from ..run.kernel_choice import check_kernels

    if not isinstance(ok.device, str):
        return ok
    calibrating = any(v is not None for v in (opts.calib_data, opts.act_scales, opts.calib_samples, opts.calib_seq_len))
    auto_is_read = bool(opts.report) or (opts.kernels or "auto").lower() == "triton"
    kept = without_torch(ok.device, auto_is_read) if opts.dry_run and not calibrating else None
    dev = kept or resolve_device(ok.device)
    return replace(ok, device=dev, kernels=check_kernels(opts.kernels, ok.ray_device or dev, ok.format != "modelopt"))


def _finished(dst: str | None) -> bool:
    """A DST already completed by an earlier run made the same way (retry.py; its writer side imports torch)."""
    from ..output.retry import finished_dst

    return finished_dst(dst)


def make_plan(opts: ConvertOptions, ok: Checked, con: Console) -> Plan:
    """Resolve SRC (calibrating first when asked) and plan from its headers; the report says why SRC was refused."""
    try:
        doc = _scales(opts.src, opts.algo, opts.calib_data, opts.calib_samples, opts.calib_seq_len, opts.act_scales, ok.device,
                      ok.budget, opts.revision, opts.quiet, opts.low_disk, opts.recipe, con, opts.dry_run)
        # Headers only: --low-disk fetches shards as it goes, Ray workers fetch their own, and a dry
        # run reads no tensor (it used to download a Hub model's whole snapshot to print a plan).
        headers_only = opts.low_disk or (ok.on_hub and (opts.executor == "ray" or (opts.dry_run and not opts.calib_data)))
        return prepare(opts.src, opts.algo, opts.exclude, opts.recipe, opts.kv_cache_dtype, opts.max_shard_size, opts.revision,
                       opts.quiet, opts.layout, headers_only, opts.scale_search, act_scales=doc, format=ok.format,
                       algo_for=opts.algo_for)
    except QuantizeError as exc:  # "written on failure too": also when SRC itself is refused
        if opts.report:
            write_json(opts.report, unplanned_report(opts.src, opts.dst, opts.algo, exc.message))
        raise


def recorded_options(opts: ConvertOptions, ok: Checked, plan: Plan) -> dict:
    """The options as the report, the resume fingerprint and the finished-DST record keep them."""
    options = dict(algo=plan.scheme.algo, exclude=list(opts.exclude), recipe=plan.recipe.name, layout=opts.layout,
                   device=str(ok.device), kv_cache_dtype=opts.kv_cache_dtype, max_shard_size=str(opts.max_shard_size),
                   memory_budget=str(opts.memory_budget), scale_search=(opts.scale_search or "none").lower(),
                   algo_for=list(opts.algo_for), kernels=ok.kernels)
    if plan.act_scales is not None:  # the scales decide bytes: part of the resume fingerprint
        options["calibration"] = plan.act_scales.digest()
    if ok.ray_device:
        options["device"] = f"{ok.ray_device} (ray tasks)"
    if ok.format != "modelopt":  # recorded (report, resume fingerprint) only when not the default: old journals stay valid
        options["format"] = ok.format
    return options


def dry_run(opts: ConvertOptions, plan: Plan, options: dict, timings: dict) -> dict:
    """--dry-run: print the plan, refuse its problems, write --report; returns the report.

    Its ``options.device`` is the device as given (``"auto"``) where the dry run had no reason to
    resolve it through torch (no --report, no --kernels triton, no calibration: check_options)."""
    print(plan.to_text(), flush=True)
    raise_problems(plan)
    if getattr(opts, "strict", False):  # as `check --strict`: the warnings printed above refuse
        from .preflight import strict_refusal

        strict_refusal(plan.warnings, plan.source.label)
    doc = run_report(plan, options, None, timings, None, status="dry-run")
    if opts.report:
        write_json(opts.report, doc)
    return doc


def validate(opts: ConvertOptions, plan: Plan, options: dict, timings: dict, warned=()) -> None:
    """Refuse a plan with problems (all at once, nothing read yet) and, with ``--strict``, one with
    warnings (the plan's and `warned`, said while planning); the report says why."""
    from .preflight import strict_refusal

    try:
        raise_problems(plan)
        if getattr(opts, "strict", False):
            strict_refusal(list(warned) + plan.warnings, plan.source.label)
    except QuantizeError as exc:
        if opts.report:
            write_json(opts.report, run_report(plan, options, None, timings, None, status="error", error=exc.message))
        raise


def _scales(src, algo, calib_data, calib_samples, calib_seq_len, act_scales, dev, budget, revision, quiet, low_disk, recipe, con,
            dry_run=False):
    """--calib-data / --act-scales -> the ScalesDoc the plan resolves (calibration/entry.py), or None."""
    if calib_data is None and act_scales is None and calib_samples is None and calib_seq_len is None:
        return None  # the data-free path: nothing of calibration (nor transformers) is imported
    from ..calibration.entry import scales_for_convert

    return scales_for_convert(src, algo, calib_data, calib_samples, calib_seq_len, act_scales, dev, budget, revision, quiet,
                              low_disk, recipe, con.info, con.warn, dry_run)
