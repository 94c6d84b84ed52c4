"""Library entry points. Every CLI flag is a keyword of the same name.

``convert`` reads like the architecture: resolve -> plan -> validate -> execute -> metadata ->
publish. Everything that can fail on user input fails before the first tensor is read.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from .checkpoint.destination import Destination
from .checkpoint.metadata import hf_quant_config, mixed_hf_quant_config, output_config, write_config_files
from .checkpoint.source import open_source
from .checkpoint.writer import ShardWriter
from .errors import DestinationError, PlanError, QuantizeError, UsageError
from .execute import Executor
from .mixed import parse_algo_for
from .plan import Plan, build_plan, parse_size
from .recipe import load_recipe
from .report import human_bytes, run_report, write_json
from .schemes import get_scheme


class Console:
    """Messages for humans on stderr: info (silenced by quiet), warnings (always)."""

    def __init__(self, quiet: bool = False, stream=None):
        self.quiet = quiet
        self.stream = stream or sys.stderr

    def info(self, msg: str) -> None:
        if not self.quiet:
            print(msg, file=self.stream, flush=True)

    def warn(self, msg: str) -> None:
        print(f"warning: {msg}", file=self.stream, flush=True)


@dataclass
class ConvertResult:
    """What :func:`convert` did: the plan, the destination (None for a dry run) and the report."""

    plan: Plan
    dst: str | None
    report: dict


def resolve_device(device: str) -> torch.device:
    """``auto`` -> the first CUDA GPU when present, else CPU; ``cpu``, ``cuda``, ``cuda:N`` as given."""
    device = (device or "auto").lower()
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise UsageError(f"--device {device!r} is not a device; use auto, cpu, cuda or cuda:N") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {device}: no CUDA GPU is available here; use --device cpu or auto")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"--device {device}: only {torch.cuda.device_count()} GPU(s) present")
    elif dev.type != "cpu":
        raise UsageError(f"--device {device!r}: only cpu and cuda devices are supported")
    return dev


def _check_writable(path: str, flag: str) -> None:
    """Fail in the first second, not after the conversion, when a report cannot be written."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise UsageError(f"{flag} {path}: folder {folder} does not exist or is not writable; create it or choose another path")


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
            layout: str = "plain", headers_only: bool = False, algo_for=()) -> Plan:
    """Resolve SRC, load the recipe and build the plan (no tensor data is read).

    `headers_only`: a Hub repo id planned from its remote headers (nothing downloaded yet).
    """
    from .checkpoint.hub import open_hub_headers

    scheme = get_scheme(algo)
    source = open_hub_headers(src, revision) if headers_only else open_source(src, revision=revision, quiet=quiet)
    rec = load_recipe(recipe, source.config.get("model_type"))
    return build_plan(source, scheme, rec, list(exclude), _size(max_shard_size, "--max-shard-size"), _kv(kv_cache_dtype),
                      layout=layout, algo_for=parse_algo_for(algo_for))


def check(src: str, algo: str, exclude=(), recipe: str | None = None, tp: int = 1, json: str | None = None,
          strict: bool = False, revision: str | None = None, quiet: bool = False, console: Console | None = None, algo_for=()):
    """``quantize check``: plan from headers only and report every finding; raise CheckFailed on errors.

    For a Hub repo id only config.json and the safetensors headers are fetched.
    """
    from .check import run_check
    from .checkpoint.hub import open_hub_headers
    from .checkpoint.source import _REPO_ID
    from .errors import CheckFailed

    scheme = get_scheme(algo)
    rules = parse_algo_for(algo_for)
    if tp < 1:
        raise UsageError(f"--tp {tp}: must be a positive number of tensor-parallel ranks")
    local = src.startswith("example:") or os.path.isdir(src) or not _REPO_ID.match(src)
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


def verify(dst: str, source: str | None = None, json: str | None = None, strict: bool = False, quiet: bool = False):
    """``quantize verify``: check a converted checkpoint as a loader would; raise CheckFailed on errors."""
    from .errors import CheckFailed
    from .verify import verify_checkpoint

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


def raise_problems(plan: Plan) -> None:
    """Refuse a plan with problems: all of them at once, before any tensor is read."""
    if plan.problems:
        n = len(plan.problems)
        raise PlanError(f"{n} problem(s) found before converting {plan.source.label}; nothing was written:", details=plan.problems)


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
    algo_for=(),
) -> ConvertResult:
    """Convert checkpoint `src` into a ModelOpt checkpoint at `dst` (see ``docs/cli.md``).

    Raises :class:`QuantizeError` subclasses for every user-facing failure; DST only ever appears
    complete.
    """
    t0 = time.perf_counter()
    con = console or Console(quiet)
    get_scheme(algo)  # usage errors first, in the first second
    parse_algo_for(algo_for)
    _kv(kv_cache_dtype)
    budget = _size(memory_budget, "--memory-budget")
    if layout not in ("plain", "marlin", "cutlass", "flashinfer"):
        raise UsageError(f"--layout {layout!r}: choose plain, marlin, cutlass or flashinfer")
    dev = resolve_device(device)
    if low_disk and (src.startswith("example:") or os.path.exists(src)):
        raise UsageError(f"--low-disk {src}: only for Hub repo ids (a local checkpoint is already on disk)")
    if not dry_run:
        if not dst:
            raise UsageError("convert needs -o DST (or --dry-run)")
        local = src if os.path.isdir(src) else None  # DST inside/equal to a local SRC: say so, not "--overwrite"
        Destination(dst, src_root=local, overwrite=overwrite)  # an existing DST fails before any download
    if report:
        _check_writable(report, "--report")
    plan = prepare(src, algo, exclude, recipe, kv_cache_dtype, max_shard_size, revision, quiet, layout, low_disk, algo_for)
    timings = {"plan_s": time.perf_counter() - t0}
    options = dict(algo=plan.scheme.algo, exclude=list(exclude), recipe=plan.recipe.name, layout=layout, device=str(dev),
                   kv_cache_dtype=kv_cache_dtype, max_shard_size=str(max_shard_size), memory_budget=str(memory_budget),
                   algo_for=list(algo_for))
    if dry_run:
        print(plan.to_text(), flush=True)
        raise_problems(plan)
        doc = run_report(plan, options, None, timings, None, status="dry-run")
        if report:
            write_json(report, doc)
        return ConvertResult(plan, None, doc)
    try:
        raise_problems(plan)
    except QuantizeError as exc:
        if report:
            write_json(report, run_report(plan, options, None, timings, None, status="error", error=exc.message))
        raise
    for w in plan.warnings:
        con.warn(w)
    dest = Destination(dst, src_root=plan.source.root or None, overwrite=overwrite)  # type: ignore[arg-type]
    stats = None
    try:
        stats = _execute(plan, dest, dev, budget, resume, bool(report), con, kv_cache_dtype, options, low_disk and (src, revision))
        timings["convert_s"] = time.perf_counter() - t0 - timings["plan_s"]
        timings["stages_s"] = getattr(stats, "stages", {})
        if verify:
            # --low-disk dropped every source shard: compare with the source only when it is on disk
            _verify_before_publishing(dest.partial, None if low_disk else src, con)
            timings["verify_s"] = time.perf_counter() - t0 - timings["plan_s"] - timings["convert_s"]
        timings["total_s"] = time.perf_counter() - t0
        dest.commit()
    except QuantizeError as exc:
        # Out of disk / write failures can be resumed; bad data or a changed source cannot.
        _keep_for_resume(dest, con) if isinstance(exc, DestinationError) else dest.discard()
        if report:
            write_json(report, run_report(plan, options, stats, timings, None, status="error", error=exc.message))
        raise
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM (signals.py): resumable
        _keep_for_resume(dest, con)
        raise
    except BaseException:
        dest.discard()
        raise
    doc = run_report(plan, options, stats, timings, dest.dst)
    if report:
        write_json(report, doc)
    rate = plan.bytes_in / 1e9 / timings["total_s"] if timings["total_s"] else 0
    con.info(f"wrote {dest.dst}: {human_bytes(plan.bytes_out)} in {len(plan.shard_names)} shard(s), "
             f"{timings['total_s']:.1f} s ({rate:.2f} GB/s of input)")
    return ConvertResult(plan, dest.dst, doc)


def _keep_for_resume(dest: Destination, con: Console) -> None:
    """After a failure or interruption keep the (hidden, never finished-looking) work folder."""
    dest.release()
    if os.path.isdir(dest.partial):
        con.warn(f"partial work kept in {dest.partial}; rerun with --resume to continue, or delete it")


def _verify_before_publishing(folder: str, src: str | None, con: Console) -> None:
    """convert --verify: run `verify` (with the source when given) on the finished work folder; refuse on errors."""
    from .errors import CheckFailed
    from .verify import verify_checkpoint

    res = verify_checkpoint(folder, src)
    for f in res.warnings:
        con.warn(f"verify: {f.message}")
    if res.errors:
        raise CheckFailed(f"--verify found {len(res.errors)} error(s) in the converted output; DST was not written:",
                          details=[f.message for f in res.errors])
    sqnr = [e["sqnr_db"] for e in res.errors_by_tensor.values()]
    detail = f", median SQNR {statistics.median(sqnr):.1f} dB" if sqnr else " (not compared with the --low-disk source)"
    con.info(f"verify: OK ({len(res.quantized)} quantized modules{detail})")


def _quantize_fn(dev: torch.device, con: Console):
    """The Triton kernels on a GPU (bit-identical to the references), the torch reference otherwise."""
    if dev.type != "cuda":
        return None
    from . import kernels

    if kernels.can_run(dev):
        return kernels.quantize
    con.warn("Triton is unavailable: quantizing with the torch reference on the GPU (same bytes, slower)")
    return None


def _execute(plan: Plan, dest: Destination, dev, budget: int, resume: bool, measure: bool, con: Console, kv, options: dict,
             hub=None):
    from tqdm import tqdm

    from . import resume as journal_mod

    earlier = dest.acquire(resume=resume)
    writer = ShardWriter(dest.partial, plan.outputs, plan.shard_names)
    fp = journal_mod.fingerprint(plan, options)
    executor = Executor(plan, writer, dev, chunk_bytes=min(512 << 20, max(64 << 10, budget // 16)), hold_bytes=budget // 5,
                        budget_bytes=budget, quantize_fn=_quantize_fn(dev, con), measure_error=measure)
    if earlier:
        writer.open(fresh=False)
        done, journal = journal_mod.resume(dest.partial, fp, plan, executor.task_outputs, writer)
        skipped = sum(plan.tasks[i].bytes_in for i in done)
        con.info(f"resuming {dest.dst}: {len(done)} of {len(plan.tasks)} tasks verified complete ({human_bytes(skipped)} of input)")
    else:
        if resume:
            con.info(f"--resume: no earlier work for {dest.dst}; starting from the beginning")
        journal = journal_mod.start(dest.partial, fp)
        writer.open(fresh=True)
        done = set()
    if hub:  # --low-disk: sidecars now, each source shard only while it is being read
        from .checkpoint.hub import LazyShards, hub_sidecars

        side = dest.path(".source-sidecars")
        plan.source.root, plan.source.sidecars = side, hub_sidecars(hub[0], hub[1], side)
        reads = [r for i, t in enumerate(plan.tasks) if i not in done for r in executor.reads(t)]
        executor.resolver = LazyShards(hub[0], hub[1], dest.path(".source-shards"), reads)
    bar = tqdm(total=plan.bytes_in, unit="B", unit_scale=True, desc="quantize", disable=con.quiet or not sys.stderr.isatty())
    executor.done, executor.on_task_written, executor.progress = done, journal.append, bar.update
    try:
        stats = executor.run()
    finally:
        bar.close()
        journal.close()
    try:
        t = time.perf_counter()
        writer.close()
        stats.stages["final_fsync"] = round(time.perf_counter() - t, 3)
        _write_metadata(plan, dest.partial, kv, options)
    except OSError as exc:
        raise DestinationError(f"{dest.partial}: finishing the output failed ({exc.strerror or exc}); free disk space and rerun with --resume") from exc
    journal_mod.remove_files(dest.partial)
    for scratch in (".source-sidecars", ".source-shards"):
        shutil.rmtree(dest.path(scratch), ignore_errors=True)
    if hub:
        con.info(f"--low-disk: at most {executor.resolver.peak_files} source shard(s) were on disk at once")
    return stats


def _write_metadata(plan: Plan, folder: str, kv, options: dict) -> None:
    extra = None
    if plan.packing is not None:  # recorded so unpack can rebuild the identical plain checkpoint
        extra = {"layout": {**plan.packing.metadata(), "max_shard_size": options["max_shard_size"]}}
    nested = mixed_hf_quant_config(plan, _kv(kv)) if plan.mixed else hf_quant_config(plan.scheme, plan.exclude_modules, _kv(kv), extra)
    config = output_config(plan.source.config, nested)
    if extra:
        config["quantization_config"]["layout"] = extra["layout"]
    write_config_files(folder, nested, config)
    for name in plan.source.sidecars:
        try:
            shutil.copyfile(os.path.join(plan.source.root, name), os.path.join(folder, name))
        except OSError as exc:
            raise DestinationError(f"{name}: cannot copy sidecar file ({exc.strerror}); check space and permissions") from exc
