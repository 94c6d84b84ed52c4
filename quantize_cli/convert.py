"""``quantize convert`` from start to end: the table of contents of a conversion.

    check_options        every usage error, nothing read (plan/steps.py)
    preflight            DST, --report's path, --push-to-hub: refused before anything is read
    make_plan            SRC's headers (calibration first when asked) -> the Plan (plan/)
    raise_problems       every problem at once, before a byte is read
    RunIdentity.of       what decides the bytes (output/identity.py)
    WorkFolder.open      the lock, the work folder, --resume's verified tasks (output/workfolder.py)
    executor.produce     the bytes: local (run/local.py) or Ray (run/ray_executor.py), the same way
    WorkFolder.finish    shards checked, index, the format's documents, sidecars
    --verify             the work folder read back as a loader would (refused: DST never appears)
    card                 the model card
    --eval               the work folder's accuracy as served, vs SRC (eval/); a failed gate: DST never appears
    seal, commit         the identity and digests, the rename to DST
    follow-ups           the report, --push-to-hub

A ``--resume`` of a finished DST replaces open..commit by ``WorkFolder.confirm_finished`` and runs
the same follow-ups (--verify included), so a CI retry whose push failed pushes now.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, replace

from . import __version__  # noqa: F401  (the report names it)
from .checkpoint.durable import write_json
from .console import Console
from .devices import device_label
from .errors import CheckFailed, DestinationError, QuantizeError
from .eval import GATES as _GATES, SETTINGS as _EVAL_SETTINGS, check_convert_eval, convert_eval_settings  # torch-free
from .output.identity import RunIdentity
from .console import human_bytes
from .output.report import run_report, unplanned_report
from .output.workfolder import WorkFolder, finished_dst
from .plan.build import Plan
from .plan.options import Checked, ConvertOptions
from .plan.output_paths import check_json_output
from .plan.preflight import check_source_path
from .plan.steps import check_options, make_plan, print_plan, raise_problems
from .run import prefetch, startup
from .run.context import RunContext
from .run.options import RunChecked, check_run_options, resolve_run


@dataclass
class ConvertResult:
    """What :func:`convert` did: the plan, the destination (None for a dry run) and the report."""

    plan: Plan
    dst: str | None
    report: dict


class _Report:
    """``--report``: the one place the report is written (on success, on refusal and on failure)."""

    def __init__(self, path: str | None):
        self.path = path

    def write(self, doc: dict) -> dict:
        if self.path:
            write_json(self.path, doc)
        return doc

    def write_failure(self, doc: dict, warn) -> None:
        """The report of a failed run: a report that cannot be written either (the disk that just
        filled up) is a warning, so the run's own one-line error is what the user sees."""
        try:
            self.write(doc)
        except OSError as exc:
            warn(f"--report {self.path}: not written ({exc.strerror or exc})")


def convert(opts: ConvertOptions, console: Console | None = None) -> ConvertResult:
    """Run `opts` (see the module docstring). Raises QuantizeError subclasses for every user-facing
    failure; DST only ever appears complete."""
    try:
        return _convert(opts, console)
    finally:
        startup.end()  # what was started ahead (Ray, its workers) and no executor adopted


def _convert(opts: ConvertOptions, console: Console | None) -> ConvertResult:
    t0 = time.perf_counter()
    con = console or Console(opts.quiet)
    report = _Report(opts.report)
    try:
        ok = check_options(opts)  # usage errors, in the first second, before anything is read
        how = check_run_options(opts, ok.format)  # --executor, --device, --kernels by name (no torch yet)
        if opts.eval or any(getattr(opts, g) is not None for g in (*_GATES, *_EVAL_SETTINGS)):
            check_convert_eval(opts.eval, {g: getattr(opts, g) for g in _GATES}, {s: getattr(opts, s) for s in _EVAL_SETTINGS})
        check_source_path(opts.src)  # SRC exists (a folder, an example, a Hub id): after every usage error
        finished = not opts.dry_run and opts.resume and not opts.overwrite and finished_dst(opts.dst)  # a retry after success
        preflight(opts, finished)
        # torch (the device) only once every refusal that needs no tensor data is said (issue 26), unless
        # the device is needed before the plan: calibration runs on it, a Hub SRC is downloaded next
        early = ok.on_hub or any(v is not None for v in (opts.calib_data, opts.act_scales))
        if early:
            how = resolve_run(how, opts, ok.format)
        startup.begin(how, opts, finished)  # Ray and its workers start (the driver needs no torch), or a resolved device warms up, while we plan
        plan = make_plan(opts, ok, con, how.first_device)
    except QuantizeError as exc:  # "written on failure too": a refused option or SRC as well
        _report_refusal(opts, report, exc)
        raise
    identity = RunIdentity.of(opts, plan)
    options = {**identity.report_options(), **_run_settings(opts, how)}
    timings = {"plan_s": time.perf_counter() - t0}
    try:
        warned = getattr(con, "warned", ())  # said while planning (calibration), with their codes
        if opts.dry_run:
            print_plan(plan, opts.strict, warned, opts.allow)  # its note once, below
        raise_problems(plan, opts.strict, warned, opts.allow, con.info)
        resolution = None
        if not early and _copies_ahead(opts, finished):  # torch loads on a thread while the verbatim tensors are copied (_write)
            resolution = startup.resolve_ahead(how, opts, ok.format)
        elif not early:
            how = resolve_run(how, opts, ok.format)  # the device through torch (not for a dry run that needs none)
            options = {**identity.report_options(), **_run_settings(opts, how)}
    except QuantizeError as exc:
        report.write_failure(run_report(plan, options, None, timings, None, status="error", error=exc.message), con.warn)
        raise
    if opts.dry_run:
        return ConvertResult(plan, None, report.write(run_report(plan, options, None, timings, None, status="dry-run")))
    if not early and resolution is None:
        startup.warm(how)  # the CUDA context and the kernels of each device, beside the work folder's start
    if finished:
        try:
            path = WorkFolder.confirm_finished(opts.dst, identity, plan, con.info)
            verified = _verify(path, opts, ok, plan, con) if opts.verify else None
            evaluated = _eval(path, _eval_source(opts, ok), opts, how, con) if opts.eval else None
        except QuantizeError as exc:  # --report is written on failure too, after a retry as after a first run
            doc = run_report(plan, options, None, timings, None, status="error", error=exc.message)
            if getattr(exc, "eval", None) is not None:  # a failed --eval gate: its result, as on success
                doc["eval"] = exc.eval
            report.write_failure(doc, con.warn)
            raise
        doc = run_report(plan, options, None, timings, path, status="already-complete")
        return ConvertResult(plan, path, _follow_ups(opts, plan, doc, verified, report, con, evaluated))
    for w in plan.warnings:
        con.warn(w)
    for note in plan.source.notes:  # source folders not copied, and why (checkpoint/sidecars.py)
        con.info(note)
    try:
        work, stats, verified, evaluated, plan = _write(opts, ok, resolution or how, plan, identity, options, timings, t0, report, con)
    finally:
        prefetch.stop()  # never left warming after the call (a library caller goes on in-process)
    doc = run_report(plan, options, stats, timings, work.dst)
    for part in ("ray", "devices"):  # where each shard was written: Ray workers, or the devices of --device a,b
        if getattr(stats, part, None):
            doc[part] = getattr(stats, part)
    result = ConvertResult(plan, work.dst, _follow_ups(opts, plan, doc, verified, report, con, evaluated))
    speed = f" ({human_bytes(plan.bytes_in / timings['total_s'])}/s of input)" if timings["total_s"] else ""  # MB/s for a tiny run
    con.info(f"wrote {work.dst}: {human_bytes(plan.source.total_bytes)} in -> {human_bytes(plan.bytes_out)} out "
             f"({plan.source.total_bytes / max(plan.bytes_out, 1):.2f}x smaller) in {len(plan.shard_names)} shard(s), "
             f"{timings['total_s']:.1f} s{speed}" + (f"; pushed to {doc['publish']['url']}" if "publish" in doc else ""))
    return result


def _report_refusal(opts: ConvertOptions, report: _Report, exc: QuantizeError) -> None:
    """--report for a run refused before it had a plan, unless the report's own path is the problem."""
    if not opts.report:
        return
    try:
        check_json_output(opts.report, "--report", (opts.src if os.path.isdir(opts.src) else None, opts.dst))
        report.write(unplanned_report(opts.src, opts.dst, opts.algo, exc.message))
    except (QuantizeError, OSError):
        pass


def preflight(opts: ConvertOptions, finished: bool) -> None:
    """What the output needs, checked before anything is read or downloaded: DST (absent, or
    --overwrite; not inside a local SRC), the --report path, the --push-to-hub options."""
    from .output.destination import Destination
    from .output.publish import check_push_options

    src, dst = opts.src, opts.dst
    if not opts.dry_run and not finished:
        Destination(dst, src_root=src if os.path.isdir(src) else None, overwrite=opts.overwrite)  # type: ignore[arg-type]
    if opts.report:  # never over SRC's or DST's files, a device, a folder or a file that is not a report
        check_json_output(opts.report, "--report", (src if os.path.isdir(src) else None, dst))
    check_push_options(opts.push_to_hub, opts.private, opts.revision_out)
    if opts.push_to_hub and not opts.dry_run:  # the token and write access, before the first byte (network)
        from .output.publish import check_push_access

        check_push_access(opts.push_to_hub)


def _run_settings(opts: ConvertOptions, how: RunChecked) -> dict:
    """How this run executes (never what it writes): the report lists them beside the identity."""
    device = f"{how.ray_device} (ray workers)" if how.ray_device else device_label(how.device)
    return {"device": device, "memory_budget": str(opts.memory_budget), "kernels": how.kernels, "executor": opts.executor}


def _context(opts: ConvertOptions, ok: Checked, how: RunChecked, plan: Plan, con: Console, copied=frozenset()) -> RunContext:
    # A Hub source read by workers: at the revision the plan pinned (a moving branch must not change the bytes)
    pinned = getattr(plan.source, "revision", None) or opts.revision
    hub = (opts.src, pinned, opts.low_disk) if ok.on_hub and (opts.low_disk or opts.executor == "ray") else None
    return RunContext(how.device, ok.budget, how.kernels, measure=bool(opts.report), hub=hub, ray_device=how.ray_device,
                      ray_address=opts.ray_address, quiet=con.quiet, info=con.info, warn=con.warn, copied_ahead=frozenset(copied))


def _copies_ahead(opts: ConvertOptions, finished: bool) -> bool:
    """The verbatim tensors are copied while torch loads (run/copy_ahead.py): a local run that
    writes bytes (not a dry run, nor the retry of a finished DST)."""
    return opts.executor == "local" and not opts.dry_run and not finished and not opts.low_disk


def _copy_while_resolving(resolution, plan: Plan, work: WorkFolder, done: set[int], opts: ConvertOptions, options: dict):
    """``(resolved run options, Copied)``: copy tasks until the device is ready, then its result.
    A device refusal found now keeps an earlier run's work folder for the retry (it was resumed)."""
    from .run.copy_ahead import copy_ahead

    copied = copy_ahead(plan, work.partial, work.journal, done, resolution.done)
    try:
        how = resolution.result()
    except QuantizeError as exc:
        exc.resumable = getattr(exc, "resumable", False) or bool(done)
        raise
    options.update(_run_settings(opts, how))
    return how, copied


def _executor(name: str):
    """The executor room: each has ``produce(plan, work, done, ctx) -> RunStats``."""
    if name == "ray":
        from .run import ray_executor

        return ray_executor
    from .run import local

    return local


def _write(opts, ok, how, plan, identity, options, timings, t0, report, con):
    """open -> produce -> finish -> --verify -> card -> --eval -> seal -> commit. On failure DST never appears:
    resumable failures keep the work folder, others remove it."""
    from .output.card import card_facts, card_text

    work = WorkFolder(opts.dst, src_root=plan.source.root or None, overwrite=opts.overwrite)
    stats = copied = None
    try:
        done = work.open(identity, plan, opts.resume, con.info)
        if plan.transform is not None:  # GPTQ / smoothing: its forward runs now, under the lock, in the work folder
            plan = _run_transform(plan, work, opts, ok, how, con)
            done = work.resume_tasks(plan, con.info)
        if isinstance(how, startup.Resolution):  # the device is still being resolved: copy what needs no torch meanwhile
            how, copied = _copy_while_resolving(how, plan, work, done, opts, options)
            done = done | copied.tasks
        ctx = _context(opts, ok, how, plan, con, copied.tasks if copied else frozenset())
        if ctx.hub:  # the driver fetches the Hub source's small files; workers fetch their shards
            plan = _with_hub_sidecars(plan, work, ctx.hub)
        stats = _executor(opts.executor).produce(plan, work, done, ctx)
        for w in getattr(stats, "warnings", ()):
            con.warn(w)
        if getattr(stats, "peak_inflight", 0) > ok.budget:  # a single unit of work (one tensor's rows, one expert) is larger
            con.warn(f"--memory-budget {opts.memory_budget}: {human_bytes(stats.peak_inflight)} were in flight at the peak (the "
                     f"smallest units of work are larger than the budget); give at least that much to stay within it")
        work.finish(plan)
        timings["convert_s"] = time.perf_counter() - t0 - timings["plan_s"]
        timings["stages_s"] = getattr(stats, "stages", {})
        if copied is not None and copied.tasks:
            timings["stages_s"]["copy_ahead"] = round(copied.seconds, 3)
        verified = None
        if opts.verify:
            verified = _verify_before_publishing(work, _verify_source(opts, ok, plan), plan, con)
            timings["verify_s"] = time.perf_counter() - t0 - timings["plan_s"] - timings["convert_s"]
        # the card before --eval: an output a failed gate sets aside (DST.eval-failed) keeps it, with the
        # weights method that `verify --source` reads for a compressed-tensors folder
        facts = card_facts(plan, identity, opts.dst, opts.push_to_hub, opts.base_model, verified)
        work.write_card(card_text(work.partial, facts, opts.push_to_hub))
        evaluated = None
        if opts.eval:
            t1 = time.perf_counter()
            evaluated = _eval(work.partial, _eval_source(opts, ok), opts, how, con, work)
            timings["eval_s"] = time.perf_counter() - t1
        work.seal(identity, plan)
        timings["total_s"] = time.perf_counter() - t0
        work.commit()
    except QuantizeError as exc:
        # Out of disk / write failures and failed downloads can be resumed; bad data or a changed source cannot.
        if isinstance(exc, DestinationError) or getattr(exc, "resumable", False):
            work.keep_for_resume(con.warn, exc)
        else:
            work.discard()
        doc = run_report(plan, options, stats, timings, None, status="error", error=exc.message)
        if getattr(exc, "eval", None) is not None:  # a failed --eval gate: its result, as on success
            doc["eval"] = exc.eval
        report.write_failure(doc, con.warn)
        raise
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM (signals.py): resumable; --report says so (exit 130)
        work.keep_for_resume(con.warn)
        report.write_failure(run_report(plan, options, stats, timings, None, status="interrupted", error="interrupted"), con.warn)
        raise
    except BaseException:
        work.discard()
        raise
    return work, stats, verified, evaluated, plan


def _run_transform(draft: Plan, work: WorkFolder, opts: ConvertOptions, ok: Checked, how, con: Console) -> Plan:
    """The draft's GPTQ / smoothing stage (calibration/stage.py), then the final plan (the identity,
    taken from the draft, decides it: equal identities give equal final plans)."""
    from .calibration.stage import produce
    from .plan.steps import plan_with_weights

    doc, weights = produce(draft.transform, draft, work.partial, opts.src, how.first_device, ok.budget, opts.revision,
                           opts.quiet, opts.recipe, con.info, con.warn)
    plan = plan_with_weights(opts, ok, draft, doc, weights)
    for w in plan.warnings:
        if w not in draft.warnings:
            con.warn(w)
    return plan


def _eval_source(opts: ConvertOptions, ok: Checked) -> str | None:
    """The source --eval compares with: SRC, unless only its headers are on disk (--low-disk, Ray from the Hub)."""
    return None if opts.low_disk or (opts.executor == "ray" and ok.on_hub) else opts.src


def _eval(folder: str, src: str | None, opts: ConvertOptions, how, con: Console, work: WorkFolder | None = None):
    """convert --eval: `quantize eval` of `folder` against `src` on the run's device. A failed gate
    refuses the run: a work folder is kept beside DST (``DST.eval-failed``), never published."""
    from .eval import run_eval
    from .eval.progress import layer_bar
    from .eval.report import gate_failure

    limits = {g: getattr(opts, g) for g in _GATES}
    if src is None and any(v is not None for v in limits.values()):
        raise CheckFailed(f"--eval: {opts.src} is not on disk here (--low-disk or Ray workers read it), so the gates have nothing "
                          "to compare with; run `quantize eval DST --source SRC` with them instead")
    with layer_bar(opts.quiet) as bar:
        settings = convert_eval_settings({s: getattr(opts, s) for s in _EVAL_SETTINGS})
        # one forward, on the first of several devices (--device cuda:0,cuda:1), as calibration's
        result = run_eval(folder, source=src, device=how.first_device, progress=bar, **settings, **limits)
    result.dst = opts.dst  # the text and the report name DST, not the work folder it was measured in
    if opts.quiet:
        for w in result.warnings:
            con.warn(w)
    con.info(result.to_text())  # its warnings included
    if not result.passed:
        kept = work.set_aside("eval-failed") if work is not None else None
        exc = CheckFailed(gate_failure(opts.dst, result) + (f"; the output is kept at {kept} for inspection, DST was not written"
                                                             if kept else ""))
        exc.eval = result.to_json()  # the --report holds the result either way (docs/cli.md)
        raise exc
    return result


def _verify_source(opts: ConvertOptions, ok: Checked, plan: Plan) -> str | None:
    """The source --verify compares with, or None: one rule for a fresh output and a finished one
    (issue 35 item 7: a retry once compared where the first run did not)."""
    on_disk = not (opts.low_disk or (opts.executor == "ray" and ok.on_hub))  # compare only with a source on disk
    return opts.src if on_disk and _comparable(plan) else None


def _comparable(plan: Plan) -> bool:
    """Can --verify compare the weights with the source? Not smoothed ones (--smooth rescales them by
    design). GPTQ's are, without the weight floors: the verifier is given the method (_verify_folder)."""
    from .calibration.stage import method_of

    return method_of(plan).get("smooth", "none") == "none"  # the draft of a finished retry, or the final plan


def _with_hub_sidecars(plan, work, hub):
    """A Hub source read by workers (--low-disk, Ray): its small files fetched into the work
    folder, a new plan whose source is rooted there (the planned one is never changed)."""
    from .checkpoint.hub import hub_sidecars

    side = work.path(".source-sidecars")
    return replace(plan, source=replace(plan.source, root=side, sidecars=hub_sidecars(hub[0], hub[1], side)))


def _verify_before_publishing(work: WorkFolder, src: str | None, plan: Plan, con: Console):
    """convert --verify: `verify` (with the source when given) on the finished work folder; refuse on errors.

    A refused output is kept beside DST (``DST.verify-failed``) for inspection, never published as DST."""
    res = _verify_folder(work.partial, src, plan.packing is not None, plan)
    for f in res.warnings:
        con.warn(f"verify: {f.message}")
    if res.errors:
        kept = work.set_aside("verify-failed")
        raise CheckFailed(f"--verify found {len(res.errors)} error(s) in the converted output; DST was not written; "
                          f"the output is kept in {kept} for inspection:", details=[f.message for f in res.errors])
    _say_verified(res, con)
    return res


def _verify(path: str, opts: ConvertOptions, ok: Checked, plan: Plan, con: Console):
    """--verify of a finished DST (--resume after success): the same check, on DST itself."""
    res = _verify_folder(path, _verify_source(opts, ok, plan), "layout" in (_config_block(path) or {}), plan)
    for f in res.warnings:
        con.warn(f"verify: {f.message}")
    if res.errors:
        raise CheckFailed(f"--verify found {len(res.errors)} error(s) in {path}; fix or rebuild it with --overwrite:",
                          details=[f.message for f in res.errors])
    _say_verified(res, con)
    return res


def _verify_folder(folder: str, src: str | None, packed: bool, plan: Plan):
    """`verify` of `folder`, told how `plan` made its weights (a compressed-tensors output records it only
    in the card, written after --verify); a packed layout (which no stock loader reads, by design) is
    verified through its plain form: unpacked beside it (exact: the plain scales are kept beside the
    packed ones), checked, removed."""
    import shutil

    from .calibration.stage import method_of
    from .verify import verify_checkpoint

    method = method_of(plan)
    if not packed:
        return verify_checkpoint(folder, src, method)
    from .unpack import unpack_checkpoint

    parent, name = os.path.split(os.path.abspath(folder))
    plain = os.path.join(parent, f".{name.lstrip('.')}.verify-plain")
    shutil.rmtree(plain, ignore_errors=True)
    try:
        res = verify_checkpoint(unpack_checkpoint(folder, plain), src, method)
    finally:
        shutil.rmtree(plain, ignore_errors=True)
    res.path = folder
    return res


def _config_block(path: str) -> dict | None:
    from .jsonfile import read_json_or_none

    return ((read_json_or_none(os.path.join(path, "config.json")) or {}).get("quantization_config"))


def _say_verified(res, con: Console) -> None:
    sqnr = [e["sqnr_db"] for e in res.errors_by_tensor.values()]
    detail = f", median SQNR {statistics.median(sqnr):.1f} dB" if sqnr else " (not compared with the source)"
    con.info(f"verify: OK ({len(res.quantized)} quantized modules{detail})")


def _follow_ups(opts: ConvertOptions, plan: Plan, doc: dict, verified, report: _Report, con: Console, evaluated=None) -> dict:
    """After a fresh output and after "already complete" alike: --verify's and --eval's outcomes, the report, --push-to-hub."""
    if verified is not None:  # --verify's outcome, as the card states it
        from .output.card import verify_summary

        doc["verify"] = verify_summary(verified, lambda m: plan.scheme_of(m).algo)
    if evaluated is not None:  # --eval's result, as `quantize eval --json` writes it
        doc["eval"] = evaluated.to_json()
    report.write(doc)
    if opts.push_to_hub:
        from .output.publish import push_after_convert

        push_after_convert(doc["destination"], opts.push_to_hub, opts.private, opts.revision_out, opts.quiet, doc, report.path)
    return doc


__all__ = ["convert", "preflight", "ConvertResult"]
