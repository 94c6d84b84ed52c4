"""The ``quantize`` command line: parse, call the library with the flags' names, map errors.

Heavy modules (torch, the library) are imported inside the commands, so ``quantize --help`` is
instant and never touches Triton or CUDA. Exit codes: 0 success, 1 domain error (one line naming
the file/tensor, the rule and the fix), 2 usage error, 130 interrupted. Tracebacks only with --debug.
"""

from __future__ import annotations

import functools
import os
import sys

import click

from . import __version__
from .errors import QuantizeError, format_error
from .signals import stop_on_signals

ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "INT8", "MXFP8")
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _run(debug: bool, fn, *args, **kwargs):
    """Call the library; turn its errors into one-line messages and exit codes."""
    try:
        return stop_on_signals(fn)(*args, **kwargs)  # SIGTERM/SIGHUP like Ctrl-C: clean up, exit 130
    except QuantizeError as exc:
        if debug:
            raise
        click.echo(format_error(exc), err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        if debug:
            raise
        click.echo("error: interrupted; no finished output was written", err=True)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no traceback without --debug
        if debug:
            raise
        click.echo(f"error: internal error ({type(exc).__name__}: {exc}); rerun with --debug and report it", err=True)
        sys.exit(1)


def common(fn):
    """--quiet and --debug on every command."""

    @click.option("--quiet", "-q", is_flag=True, help="No progress bar or info messages (warnings still print).")
    @click.option("--debug", is_flag=True, help="Show tracebacks.")
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


class AlgoType(click.ParamType):
    """Case-insensitive algorithm name (``fp8_pb_wo`` works; ``W8A16`` means INT8)."""

    name = "ALGO"

    def convert(self, value, param, ctx):
        key = str(value).upper()
        key = "INT8" if key == "W8A16" else key
        if key not in ALGOS:
            self.fail(f"{value!r} is not one of {', '.join(ALGOS)} (case-insensitive)", param, ctx)
        return key


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="quantize")
def main():
    """Convert bf16 Hugging Face checkpoints to NVIDIA ModelOpt FP8 / NVFP4 / INT8 checkpoints."""


@main.command(context_settings=CONTEXT)
@click.argument("src")
@click.option("-o", "--output", "dst", metavar="DST", help="Output folder (written atomically).")
@click.option("--algo", type=AlgoType(), required=True, help=f"One of {', '.join(ALGOS)}.")
@click.option("--exclude", multiple=True, metavar="PATTERN", help="Keep matching modules unquantized (fnmatch, vLLM semantics). Repeatable.")
@click.option("--recipe", metavar="NAME|FILE", help="Recipe name or YAML file (default: by config.json model_type).")
@click.option("--layout", type=click.Choice(["plain", "marlin", "cutlass", "flashinfer"]), default="plain", show_default=True)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--kv-cache-dtype", type=click.Choice(["fp8"], case_sensitive=False), help="Mark the KV cache FP8 (no scale tensors).")
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest output shard (5GB, 500MB, ...).")
@click.option("--memory-budget", default="4GB", show_default=True, help="Host bytes in flight.")
@click.option("--resume", is_flag=True, help="Continue an interrupted conversion of the same DST.")
@click.option("--dry-run", is_flag=True, help="Print the plan and write nothing.")
@click.option("--overwrite", is_flag=True, help="Replace an existing DST (only once the new one is complete).")
@click.option("--report", metavar="FILE.json", help="Write a machine-readable report.")
@click.option("--revision", help="Hub revision (branch, tag or commit) when SRC is a repo id.")
@click.option("--verify", is_flag=True, help="Run `quantize verify --source SRC` on the output before publishing it.")
@click.option("--low-disk", is_flag=True, help="Hub SRC: fetch one source shard at a time and drop it when done.")
@click.option("--algo-for", "algo_for", multiple=True, metavar="PATTERN=ALGO",
              help="Another algorithm for matching modules (--exclude's pattern rules); writes MIXED_PRECISION. Repeatable.")
@common
def convert(src, dst, algo, exclude, recipe, layout, device, kv_cache_dtype, max_shard_size, memory_budget, resume,
            dry_run, overwrite, report, revision, verify, low_disk, quiet, debug, algo_for=()):
    """Quantize checkpoint SRC (folder, Hub repo id or example:tiny-llama) into DST."""
    if not dst and not dry_run:
        raise click.UsageError("missing -o DST (or use --dry-run)")

    def go():
        from .api import convert as run

        return run(src, dst, algo=algo, exclude=exclude, recipe=recipe, layout=layout, device=device, kv_cache_dtype=kv_cache_dtype,
            max_shard_size=max_shard_size, memory_budget=memory_budget, resume=resume, dry_run=dry_run,
            overwrite=overwrite, report=report, revision=revision, quiet=quiet, verify=verify, low_disk=low_disk,
            algo_for=algo_for)

    _run(debug, go)
    _fast_exit()


def _fast_exit() -> None:
    """Leave at once after a successful run: every output is written, fsynced and renamed, and
    tearing down a CUDA context and gigabytes of pinned host memory takes seconds for nothing."""
    if "torch" in sys.modules and getattr(sys.modules["torch"], "cuda", None) and sys.modules["torch"].cuda.is_initialized():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@main.command(context_settings=CONTEXT)
@click.argument("src")
@click.option("--algo", type=AlgoType(), required=True, help=f"One of {', '.join(ALGOS)}.")
@click.option("--exclude", multiple=True, metavar="PATTERN", help="Exclude pattern to analyse (as convert takes it). Repeatable.")
@click.option("--recipe", metavar="NAME|FILE", help="Recipe name or YAML file (default: by config.json model_type).")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor-parallel ranks to check shapes for.")
@click.option("--json", "json_path", metavar="FILE", help="Write the findings as JSON (docs/check.md).")
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@click.option("--revision", help="Hub revision when SRC is a repo id.")
@click.option("--algo-for", "algo_for", multiple=True, metavar="PATTERN=ALGO",
              help="Another algorithm for matching modules (--exclude's pattern rules); writes MIXED_PRECISION. Repeatable.")
@common
def check(src, algo, exclude, recipe, tp, json_path, strict, revision, quiet, debug, algo_for=()):
    """Report what converting SRC would do and what would break at serve time (headers only)."""

    def go():
        from .api import check as run

        run(src, algo, exclude=exclude, recipe=recipe, tp=tp, json=json_path, strict=strict, revision=revision, quiet=quiet,
            algo_for=algo_for)

    _run(debug, go)


@main.command(context_settings=CONTEXT)
@click.argument("dst")
@click.option("--source", metavar="SRC", help="The original checkpoint: also report per-tensor error (SQNR).")
@click.option("--json", "json_path", metavar="FILE", help="Write the findings as JSON (docs/verify.md).")
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@common
def verify(dst, source, json_path, strict, quiet, debug):
    """Check converted checkpoint DST as vLLM / TensorRT-LLM would load it."""

    def go():
        from .api import verify as run

        run(dst, source=source, json=json_path, strict=strict, quiet=quiet)

    _run(debug, go)


@main.command(context_settings=CONTEXT)
@click.argument("dst")
@click.option("-o", "--output", required=True, metavar="PLAIN", help="Where to write the plain checkpoint.")
@click.option("--overwrite", is_flag=True, help="Replace an existing PLAIN (only once the new one is complete).")
@common
def unpack(dst, output, overwrite, quiet, debug):
    """Turn packed checkpoint DST (--layout marlin/cutlass/flashinfer) back into the plain one."""

    def go():
        from .api import unpack as run

        run(dst, output, overwrite=overwrite, quiet=quiet)

    _run(debug, go)


@main.command(context_settings=CONTEXT)
@click.argument("path")
@common
def inspect(path, quiet, debug):
    """A short summary of checkpoint folder PATH (headers only): dtypes, sizes, quantization."""

    def go():
        from .inspect_checkpoint import inspect_checkpoint

        click.echo(inspect_checkpoint(path))

    _run(debug, go)


@main.group(context_settings=CONTEXT, invoke_without_command=True)
@click.pass_context
def recipes(ctx):
    """List the shipped recipes, or show one."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(recipes_list)


@recipes.command("list")
def recipes_list():
    """One line per shipped recipe: name, model types, description."""
    from .recipe import builtin_names, load_recipe

    for name in builtin_names():
        r = load_recipe(name)
        click.echo(f"{name:<14} {','.join(r.model_types) or '-':<28} {r.description}")


@recipes.command("show")
@click.argument("name")
@common
def recipes_show(name, quiet, debug):
    """Print recipe NAME resolved (after extends) as YAML."""

    def go():
        from .recipe import describe

        click.echo(describe(name))

    _run(debug, go)


if __name__ == "__main__":  # pragma: no cover
    main()
