"""Library entry points. Every CLI flag is a keyword of the same name.

``convert`` reads like the architecture: resolve -> plan -> validate -> execute -> metadata ->
publish. Everything that can fail on user input fails before the first tensor is read.

The steps up to validate, and ``check``, are :mod:`.planning` (torch-free); this module adds the
write path (execute, metadata, publish) and imports torch, the executor and the writer only
inside it, so ``quantize check`` and ``convert --dry-run`` import no torch.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .run import prefetch
from .output.destination import Destination
from .checkpoint.durable import copy_durable
from .formats.modelopt_documents import hf_quant_config, mixed_hf_quant_config, output_config, write_config_files
from .console import Console
from .devices import resolve_device, warm_device as _warm_device  # noqa: F401  (resolve_device: the library's)
from .errors import DestinationError, QuantizeError
from .plan.options import Checked, ConvertOptions
from .plan.output_paths import check_json_output
from .plan.build import Plan
from .plan.steps import _kv, _size, check, check_options, dry_run, make_plan, prepare, raise_problems, recorded_options, validate
from .output.report import human_bytes, run_report, write_json

if TYPE_CHECKING:
    import torch


@dataclass
class ConvertResult:
    """What :func:`convert` did: the plan, the destination (None for a dry run) and the report."""

    plan: Plan
    dst: str | None
    report: dict


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
    from .unpack import unpack_checkpoint

    Destination(output, overwrite=overwrite)  # refuse an existing output first
    path = unpack_checkpoint(dst, output, overwrite=overwrite)
    (console or Console(quiet)).info(f"wrote {path}")
    return path


def convert(
    src: str,
    dst: str | None = None,
    algo: str = "FP8_PB_WO",
    exclude=(),
    recipe: str | None = None,
    layout: str = "plain",
    device: str = "auto",
    kv_cache_dtype: str | None = None,
    max_shard_size: str | int = "5GB",
    memory_budget: str | int = "4GB",
    resume: bool = False,
    dry_run: bool = False,
    overwrite: bool = False,
    report: str | None = None,
    revision: str | None = None,
    quiet: bool = False,
    verify: bool = False,
    low_disk: bool = False,
    console: Console | None = None,
    scale_search: str = "none",
    calib_data: str | None = None,
    calib_samples: int | None = None,
    calib_seq_len: int | None = None,
    act_scales: str | None = None,
    push_to_hub: str | None = None,
    private: bool = False,
    revision_out: str | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    format: str = "modelopt",
    algo_for=(),
    kernels: str = "auto",
) -> ConvertResult:
    """Convert checkpoint `src` into a ModelOpt checkpoint at `dst` (see ``docs/cli.md``).

    The keywords make a :class:`~quantize_cli.plan.options.ConvertOptions` (the CLI builds the same
    value from its flags) and :func:`run` runs it. Raises :class:`QuantizeError` subclasses for
    every user-facing failure; DST only ever appears complete.
    """
    given = locals()  # exactly the keywords above: every one is a ConvertOptions field but the console
    return run(ConvertOptions(**{k: given[k] for k in ConvertOptions.names()}), console)


def run(opts: ConvertOptions, console: Console | None = None) -> ConvertResult:
    """``convert`` as the architecture reads: options -> plan -> validate -> execute -> write."""
    t0 = time.perf_counter()
    con = console or Console(opts.quiet)
    ok = check_options(opts)  # usage errors, in the first second, before anything is read
    _warm_device(ok.device)
    plan = make_plan(opts, ok, con)
    timings = {"plan_s": time.perf_counter() - t0}
    options = recorded_options(opts, ok, plan)
    if opts.dry_run:
        return ConvertResult(plan, None, dry_run(opts, plan, options, timings))
    validate(opts, plan, options, timings)
    if ok.finished:
        return _already_complete(plan, opts.dst, options, plan.source.root or plan.source.label, opts.report, timings, con)
    for w in plan.warnings:
        con.warn(w)
    try:
        dest, stats, verified = _write(opts, ok, plan, options, timings, t0, con)
    finally:
        prefetch.stop()  # never left warming after the call (a library caller goes on in-process)
    return _finish(opts, plan, options, dest, stats, verified, timings, con)


def _write(opts: ConvertOptions, ok: Checked, plan: Plan, options: dict, timings: dict, t0: float, con: Console):
    """Execute into DST's work folder, --verify it, write the card and publish DST (atomically).

    Returns ``(destination, run stats, verify result or None)``. On failure DST never appears:
    resumable failures keep the work folder, others remove it.
    """
    source_id = plan.source.root or plan.source.label
    dest = Destination(opts.dst, src_root=plan.source.root or None, overwrite=opts.overwrite)  # type: ignore[arg-type]
    stats = None
    try:
        if opts.executor == "ray":
            stats = _ray().execute(plan, dest, ok.ray_device, ok.budget, opts.resume, bool(opts.report), con, opts.kv_cache_dtype,
                                   options, ok.on_hub and (opts.src, opts.revision, opts.low_disk), opts.ray_address)
        else:
            stats = _execute(plan, dest, ok.device, ok.budget, opts.resume, bool(opts.report), con, opts.kv_cache_dtype, options,
                             opts.low_disk and (opts.src, plan.source.revision), source_id)
        for w in getattr(stats, "warnings", ()):
            con.warn(w)
        if getattr(stats, "peak_inflight", 0) > ok.budget:  # a single unit of work (one tensor's rows, one expert) is larger
            con.warn(f"--memory-budget {opts.memory_budget}: {human_bytes(stats.peak_inflight)} were in flight at the peak (the "
                     f"smallest units of work are larger than the budget); give at least that much to stay within it")
        timings["convert_s"] = time.perf_counter() - t0 - timings["plan_s"]
        timings["stages_s"] = getattr(stats, "stages", {})
        verified = None
        if opts.verify:
            # --low-disk dropped every source shard: compare with the source only when it is on disk
            on_disk = not (opts.low_disk or (opts.executor == "ray" and ok.on_hub))
            verified = _verify_before_publishing(dest, opts.src if on_disk else None, con)
            timings["verify_s"] = time.perf_counter() - t0 - timings["plan_s"] - timings["convert_s"]
        from .output.card import write_conversion_card  # README.md: how this output was made

        card = {k: getattr(opts, k) for k in opts.names() if k not in ("src", "dst")}  # the card's command line: every option that decides the output
        write_conversion_card(plan, dest.partial, verified, opts.src, opts.dst, opts.push_to_hub, card)
        timings["total_s"] = time.perf_counter() - t0
        dest.commit()
    except QuantizeError as exc:
        # Out of disk / write failures and failed downloads can be resumed; bad data or a changed source cannot.
        _keep_for_resume(dest, con, exc) if isinstance(exc, DestinationError) or getattr(exc, "resumable", False) else dest.discard()
        if opts.report:
            write_json(opts.report, run_report(plan, options, stats, timings, None, status="error", error=exc.message))
        raise
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM (signals.py): resumable
        _keep_for_resume(dest, con)
        raise
    except BaseException:
        dest.discard()
        raise
    return dest, stats, verified


def _finish(opts: ConvertOptions, plan: Plan, options: dict, dest: Destination, stats, verified, timings: dict,
            con: Console) -> ConvertResult:
    """The report, --push-to-hub (only now: DST is complete and verified) and the closing line."""
    doc = run_report(plan, options, stats, timings, dest.dst)
    if verified is not None:  # --verify's outcome, as the card states it
        from .output.card import verify_summary

        doc["verify"] = verify_summary(verified, lambda _m: plan.scheme.algo)
    if getattr(stats, "ray", None):
        doc["ray"] = stats.ray
    if opts.report:
        write_json(opts.report, doc)
    pushed = None
    if opts.push_to_hub:
        from .output.publish import push_after_convert

        pushed = push_after_convert(dest.dst, opts.push_to_hub, opts.private, opts.revision_out, opts.quiet, doc, opts.report)
    rate = plan.bytes_in / 1e9 / timings["total_s"] if timings["total_s"] else 0
    con.info(f"wrote {dest.dst}: {human_bytes(plan.source.total_bytes)} in -> {human_bytes(plan.bytes_out)} out "
             f"({plan.source.total_bytes / max(plan.bytes_out, 1):.2f}x smaller) in {len(plan.shard_names)} shard(s), "
             f"{timings['total_s']:.1f} s ({rate:.2f} GB/s of input)" + (f"; pushed to {pushed['url']}" if pushed else ""))
    return ConvertResult(plan, dest.dst, doc)


def calibrate(src: str, calib_data: str = "default", output: str | None = None, calib_samples: int | None = None,
              calib_seq_len: int | None = None, device: str = "auto", memory_budget: str | int = "4GB",
              revision: str | None = None, recipe: str | None = None, quiet: bool = False, console: Console | None = None):
    """``quantize calibrate``: measure activation amax of `src` on `calib_data`; write SCALES.json to `output`."""
    from .calibration import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN
    from .calibration.entry import run_calibration

    con = console or Console(quiet)
    if output:
        check_json_output(output, "-o", (src if os.path.isdir(src) else None,))
    dev = resolve_device(device)
    doc = run_calibration(src, calib_data, calib_samples or DEFAULT_SAMPLES, calib_seq_len or DEFAULT_SEQ_LEN, dev,
                          _size(memory_budget, "--memory-budget"), revision, quiet, recipe, con.info)
    if output:
        doc.save(output)
        con.info(f"wrote {output}")
    return doc


def _already_complete(plan: Plan, dst: str, options: dict, source_id: str, report, timings: dict, con: Console) -> ConvertResult:
    """--resume on a finished DST made the same way: checked by retry.py; succeed without writing."""
    from .formats import metadata_documents
    from .output.retry import confirm_finished

    kv = options.get("kv_cache_dtype")
    docs = metadata_documents(plan, _kv(kv)) or dict(zip(("hf_quant_config.json", "config.json"), metadata_docs(plan, kv, options)))
    path = confirm_finished(plan, dst, options, source_id, docs, con.info)
    doc = run_report(plan, options, None, timings, path, status="already-complete")
    if report:
        write_json(report, doc)
    return ConvertResult(plan, path, doc)


def _keep_for_resume(dest: Destination, con: Console, exc: BaseException | None = None) -> None:
    """After a failure or interruption keep the (hidden, never finished-looking) work folder.

    Said only when the folder is this run's (not another live run's, whose lock refused us)."""
    owned = dest.acquired
    dest.release()
    if owned and os.path.isdir(dest.partial) and not getattr(exc, "quiet_keep", False):
        con.warn(f"partial work kept in {dest.partial}; rerun with --resume to continue, or delete it")


def _verify_before_publishing(dest: Destination, src: str | None, con: Console):
    """convert --verify: run `verify` (with the source when given) on the finished work folder; refuse on errors.

    A refused output is kept beside DST (``DST.verify-failed``) for inspection, never published as DST.
    """
    from .errors import CheckFailed
    from .verify import verify_checkpoint

    res = verify_checkpoint(dest.partial, src)
    for f in res.warnings:
        con.warn(f"verify: {f.message}")
    if res.errors:
        kept = dest.set_aside("verify-failed")
        raise CheckFailed(f"--verify found {len(res.errors)} error(s) in the converted output; DST was not written; "
                          f"the output is kept in {kept} for inspection:", details=[f.message for f in res.errors])
    sqnr = [e["sqnr_db"] for e in res.errors_by_tensor.values()]
    detail = f", median SQNR {statistics.median(sqnr):.1f} dB" if sqnr else " (not compared with the --low-disk source)"
    con.info(f"verify: OK ({len(res.quantized)} quantized modules{detail})")
    return res


def _quantize_fn(dev: torch.device, con: Console, kernels: str = "auto", ct_format: bool = False):
    """--kernels: the Triton kernels (bit-identical to the references) or None, the torch reference (kernel_choice.py)."""
    from .run.kernel_choice import quantize_fn

    return quantize_fn(kernels, dev, con.warn, ct_format)


def _ray():
    """--executor ray lives in its own room (executors/); Ray itself is imported only there."""
    from .run import ray_executor

    return ray_executor


def executor_sizes(budget: int) -> dict:
    """How the executor splits `budget` (--memory-budget): chunk, held-group and in-flight bytes."""
    return dict(chunk_bytes=min(512 << 20, max(64 << 10, budget // 16)), hold_bytes=budget // 5, budget_bytes=budget)


def _execute(plan: Plan, dest: Destination, dev, budget: int, resume: bool, measure: bool, con: Console, kv, options: dict,
             hub=None, source_id: str = ""):
    from tqdm import tqdm

    from .output import resume as journal_mod
    from .checkpoint.writer import ShardWriter
    from .run.execute import Executor
    from .formats.ct_exclusions import is_ct  # compressed-tensors math runs as its torch reference on any device

    earlier = dest.acquire(resume=resume)
    writer = ShardWriter(dest.partial, plan.outputs, plan.shard_names)
    journal = executor = None
    try:  # a failure anywhere leaves no open shard file behind (library callers keep running)
        fp = journal_mod.fingerprint(plan, options)
        if earlier:
            writer.open(fresh=False)
            done, journal = journal_mod.resume(dest.partial, fp, plan, Executor.task_outputs, writer)
            skipped = sum(plan.tasks[i].bytes_in for i in done)
            con.info(f"resuming {dest.dst}: {len(done)} of {len(plan.tasks)} tasks verified complete ({human_bytes(skipped)} of input)")
        else:
            if resume:
                con.info(f"--resume: no earlier work for {dest.dst}; starting from the beginning")
            journal = journal_mod.start(dest.partial, fp)
            writer.open(fresh=True)
            done = set()
        sizes, resolver = executor_sizes(budget), None
        if hub:  # --low-disk: sidecars now, each source shard only while it is being read
            from .checkpoint.hub import LazyShards, hub_sidecars
            from .run.schedule import Schedule

            side = dest.path(".source-sidecars")
            source = replace(plan.source, root=side, sidecars=hub_sidecars(hub[0], hub[1], side))
            plan = replace(plan, source=source)  # a new plan: the caller's stays as planned
            reads = Schedule(plan, **sizes).reads(t for i, t in enumerate(plan.tasks) if i not in done)
            resolver = LazyShards(hub[0], hub[1], dest.path(".source-shards"), reads, plan.source.tensors)
        bar = tqdm(total=plan.bytes_in, unit="B", unit_scale=True, desc="quantize", disable=con.quiet or not sys.stderr.isatty())
        warmed = prefetch.stop()  # our own reads start now: the start-up warm-up (cli.convert) has done its part
        executor = Executor(plan, writer, dev, **sizes, quantize_fn=_quantize_fn(dev, con, options.get("kernels", "auto"), is_ct(plan.scheme)),
                            measure_error=measure, progress=bar.update, done=done, on_task_written=journal.append, resolver=resolver,
                            process_budget=budget)
        try:
            stats = executor.run()
            stats.warmed = warmed
        finally:
            bar.close()
            journal.close()
    except BaseException:
        if executor is None or executor.writer_stopped:  # never close a file a write is still using
            writer.abort()
            if journal is not None:
                journal.close()
        raise
    try:
        t = time.perf_counter()
        writer.close()
        stats.stages["final_fsync"] = round(time.perf_counter() - t, 3)
        _write_metadata(plan, dest.partial, kv, options)
    except OSError as exc:
        raise DestinationError(f"{dest.partial}: finishing the output failed ({exc.strerror or exc}); free disk space and rerun with --resume") from exc
    from .output.retry import run_record, seal

    seal(dest.partial, run_record(options, fp, source_id))  # the journal's CRCs + how DST was made, kept in DST
    for scratch in (".source-sidecars", ".source-shards"):
        shutil.rmtree(dest.path(scratch), ignore_errors=True)
    if hub:
        con.info(f"--low-disk: at most {resolver.peak_files} source shard(s) were on disk at once")
    return stats


def metadata_docs(plan: Plan, kv, options: dict) -> tuple[dict, dict]:
    """The (hf_quant_config.json, config.json) documents this run writes: a pure function of plan and options."""
    from .plan.recipe import recipe_record

    # The resolved recipe is recorded so unpack and verify read the fused table and expert names back.
    extra: dict = {"recipe": recipe_record(plan.recipe)}
    if plan.packing is not None:  # recorded so unpack can rebuild the identical plain checkpoint
        extra["layout"] = {**plan.packing.metadata(), "max_shard_size": options["max_shard_size"]}
    if plan.act_scales is not None:  # read back by `verify`: which input scales are calibrated, on what
        from .output.report import calibration_summary

        extra["calibration"] = calibration_summary(plan, full=False)
    nested = mixed_hf_quant_config(plan, _kv(kv)) if plan.mixed else hf_quant_config(plan.scheme, plan.exclude_modules, _kv(kv), extra)
    config = output_config(plan.source.config, nested)
    if "layout" in extra:
        config["quantization_config"]["layout"] = extra["layout"]
    return nested, config


def _write_metadata(plan: Plan, folder: str, kv, options: dict) -> None:
    from .formats import write_metadata

    if not write_metadata(plan, folder, _kv(kv)):  # a format other than ModelOpt writes its own documents
        nested, config = metadata_docs(plan, kv, options)
        write_config_files(folder, nested, config)
    _copy_sidecars(plan, folder)


def _copy_sidecars(plan: Plan, folder: str) -> None:
    for name in plan.source.sidecars:
        try:
            copy_durable(os.path.join(plan.source.root, name), os.path.join(folder, name))
        except OSError as exc:
            raise DestinationError(f"{name}: cannot copy sidecar file ({exc.strerror}); check space and permissions") from exc


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
         min_top1: float | None = None, weights_only: bool = False, quiet: bool = False, console: Console | None = None):
    """``quantize eval``: measure `dst` as served (vs `source`); raise CheckFailed when a gate fails.

    The result is printed (the last line: verdict and key numbers) and written to `json` either way."""
    from .errors import CheckFailed
    from .eval import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN, run_eval
    from .eval.progress import layer_bar

    con = console or Console(quiet)
    if json:
        check_json_output(json, "--json", (dst if os.path.isdir(dst) else None, source if source and os.path.isdir(source) else None))
    with layer_bar(quiet) as bar:
        result = run_eval(dst, source=source, data=data, samples=samples or DEFAULT_SAMPLES, seq_len=seq_len or DEFAULT_SEQ_LEN,
                          device=device, weights_only=weights_only, max_ppl_increase=max_ppl_increase, max_kl=max_kl,
                          min_top1=min_top1, progress=bar)
    for w in result.warnings:
        con.warn(w)
    print(result.to_text(), flush=True)
    if json:
        write_json(json, result.to_json())
    if not result.passed:
        failed = "; ".join(g.text() for g in result.failed)
        raise CheckFailed(f"eval gate failed for {dst}: {failed}; the checkpoint loses more accuracy than allowed "
                          "(calibrate with --calib-data, exclude the layers with the largest own error, or use a finer algorithm)")
    return result
