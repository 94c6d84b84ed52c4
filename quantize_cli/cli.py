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
from .algorithms import ALGOS, ALIAS_FORMAT, canonical_algo
from .errors import QuantizeError, format_error
from .signals import exit_quietly_on_repeat, stop_on_signals

FORMAT = click.Choice(["modelopt", "compressed-tensors"], case_sensitive=False)
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
        exit_quietly_on_repeat()  # a second Ctrl-C during the exit: no atexit traceback
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
    """Case-insensitive algorithm name (``fp8_pb_wo`` works; ``W8A16`` means INT8, ``W4A16`` INT4)."""

    name = "ALGO"

    def convert(self, value, param, ctx):
        key = canonical_algo(value)
        if key is None:
            self.fail(f"{value!r} is not one of {', '.join(ALGOS)} (case-insensitive)", param, ctx)
        # W8A16 / W8A8 name what one format writes: kept, so that the other format refuses them (ALIAS_FORMAT)
        return str(value).upper() if str(value).upper() in ALIAS_FORMAT else key


def weight_options(fn):
    """--rounding and --smooth (convert and calibrate; docs/accuracy.md)."""
    fn = click.option("--smooth", type=click.Choice(["none", "awq", "smoothquant"], case_sensitive=False), default="none",
                      show_default=True, help="Fold per-channel activation scales into the norms and weights before quantizing "
                      "(needs calibration data: --calib-data, or convert's --act-scales): awq searches them per layer against the served output error, smoothquant "
                      "takes alpha 0.5. The output format is unchanged.")(fn)
    return click.option("--rounding", type=click.Choice(["nearest", "gptq"], case_sensitive=False), default="nearest",
                        show_default=True, help="gptq: keep the written scales, round the values column by column against "
                        "the calibration inputs' Hessian (needs calibration data: --calib-data, or convert's --act-scales); nearest: round to nearest (ModelOpt's bytes).")(fn)


def calib_options(fn):
    """--calib-data, --calib-samples, --calib-seq-len (convert and calibrate; docs/calibration.md)."""
    fn = click.option("--calib-seq-len", type=int, metavar="L", help="Tokens per calibration sample (default 512).")(fn)
    fn = click.option("--calib-samples", type=int, metavar="N", help="Calibration samples (default 128).")(fn)
    return click.option("--calib-data", metavar="DATA", help="Calibrate static activation scales on DATA: default, FILE.jsonl, FILE.txt or a cached dataset id.")(fn)


def gate_options(fn):
    """--max-ppl-increase, --max-kl, --min-top1 (a causal LM), --min-cosine, --min-sample-cosine (an
    encoder): eval's gates (eval and convert --eval; eval/report.py)."""
    fn = click.option("--min-sample-cosine", type=float, metavar="C",
                      help="Encoder gate: exit 1 if any sample's embedding cosine to SRC's is below C.")(fn)
    fn = click.option("--min-cosine", type=float, metavar="C",
                      help="Encoder gate: exit 1 if the mean embedding cosine to SRC's is below C.")(fn)
    fn = click.option("--min-top1", type=float, metavar="F", help="Gate: exit 1 if the top-1 agreement with SRC is below F (0..1).")(fn)
    fn = click.option("--max-kl", type=float, metavar="X", help="Gate: exit 1 if the mean KL divergence from SRC exceeds X (nats).")(fn)
    return click.option("--max-ppl-increase", type=float, metavar="PCT",
                        help="Gate: exit 1 if perplexity rises more than PCT percent over SRC.")(fn)


def examples(*lines: str) -> str:
    """A help epilog listing example command lines (``\b`` keeps click from re-wrapping them)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


@click.group(context_settings=CONTEXT, epilog=examples(
    "quantize convert example:tiny-llama -o /tmp/tiny-fp8 --algo FP8_PB_WO",
    "quantize check meta-llama/Llama-3.1-8B-Instruct --algo NVFP4 --tp 2",
    "quantize convert ./my-model -o out --algo NVFP4 --format compressed-tensors --calib-data default",
    "quantize verify out --source ./my-model",
    "",
    "Getting started: docs/getting-started.md; every option: docs/cli.md.",
))
@click.version_option(__version__, prog_name="quantize")
def main():
    """Convert Hugging Face checkpoints (bf16 / fp16 / fp32 safetensors) into FP8, NVFP4, MXFP8, INT8 or INT4
    checkpoints in the NVIDIA ModelOpt format (vLLM, TensorRT-LLM, SGLang) or the compressed-tensors
    format (vLLM, transformers), streaming with bounded memory."""


@main.command(context_settings=CONTEXT, short_help="Quantize checkpoint SRC into DST.", epilog=examples(
    "quantize convert example:tiny-llama -o /tmp/tiny-fp8 --algo FP8_PB_WO",
    "quantize convert ./my-model -o my-model-nvfp4 --algo NVFP4 --calib-data default",
    "quantize convert ./bge-small -o bge-fp8 --algo FP8_PB_WO --format compressed-tensors   # transformers loads it",
    "quantize convert ./my-model --algo FP8_PB_WO --exclude 'model.layers.0.*' --dry-run --strict"))
@click.argument("src")
@click.option("-o", "--output", "dst", metavar="DST", help="Output folder (written atomically).")
@click.option("--algo", type=AlgoType(), required=True, help=f"One of {', '.join(ALGOS)}.")
@click.option("--exclude", multiple=True, metavar="PATTERN", help="Keep matching modules unquantized (fnmatch, vLLM semantics). Repeatable.")
@click.option("--recipe", metavar="NAME|FILE", help="Recipe name or YAML file (default: by config.json model_type).")
@click.option("--layout", type=click.Choice(["plain", "marlin", "cutlass", "flashinfer"]), default="plain", show_default=True,
              help="plain: what every loader reads; marlin / cutlass / flashinfer: the weights pre-packed as that kernel "
                   "reads them (no stock loader reads these; docs/layouts.md).")
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
@click.option("--eval", "eval", is_flag=True, help="Run `quantize eval DST --source SRC` on the output before publishing it (calib extra).")
@gate_options
@click.option("--eval-data", metavar="DATA", help="--eval's text: default (held-out, shipped), FILE.txt, FILE.jsonl or a cached dataset id.")
@click.option("--eval-samples", type=click.IntRange(min=1), metavar="N", help="--eval's samples (default 64).")
@click.option("--eval-seq-len", type=click.IntRange(min=2), metavar="L", help="--eval's tokens per sample (default 512).")
@click.option("--low-disk", is_flag=True, help="Hub SRC: fetch one source shard at a time and drop it when done.")
@click.option("--scale-search", type=click.Choice(["none", "mse"], case_sensitive=False), default="none", show_default=True,
              help="mse: per group, the candidate scale with the least squared error, weighted by the activations with "
                   "--calib-data / --act-scales (docs/accuracy.md); none: ModelOpt's bytes.")
@calib_options
@weight_options
@click.option("--act-scales", metavar="SCALES.json", help="Reuse activation scales made by `quantize calibrate` from this SRC.")
@click.option("--push-to-hub", metavar="REPO_ID", help="After success (and --verify), upload DST to this Hub repo (docs/publish.md).")
@click.option("--private", is_flag=True, help="With --push-to-hub: create the repo private.")
@click.option("--revision-out", metavar="BRANCH", help="With --push-to-hub: commit to this branch (created if missing).")
@click.option("--base-model", metavar="REPO_ID", help="The Hub repo the source was downloaded from, for the model card (a Hub SRC names itself).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="ray: output shards written by Ray tasks across processes, GPUs and machines (docs/scale-out.md).")
@click.option("--ray-address", metavar="ADDR", help="Ray cluster to join (default: RAY_ADDRESS, else start a local instance).")
@click.option("--format", "format", type=FORMAT, default="modelopt", show_default=True, help="Output format (docs/formats.md).")
@click.option("--algo-for", "algo_for", multiple=True, metavar="PATTERN=ALGO",
              help="Another algorithm for matching modules (--exclude's pattern rules); writes MIXED_PRECISION (compressed-tensors: one config group per algorithm). Repeatable.")
@click.option("--kernels", type=click.Choice(["auto", "triton", "torch"], case_sensitive=False), default="auto", show_default=True,
              help="auto: Triton on a GPU, the torch reference on the CPU; torch: the reference everywhere; triton: require Triton.")
@click.option("--strict", is_flag=True, help="Warnings are errors: refuse (exit 1) before the first byte, as `check --strict`.")
@click.option("--allow", multiple=True, metavar="CODE", help="With --strict: accept warnings with this code (e.g. calib-ignored), as `check --allow`. Repeatable.")
@common
def convert(src, dst, quiet, debug, **options):
    """Quantize checkpoint SRC (folder, Hub repo id or example:tiny-llama) into DST."""
    # Every option's name is the library keyword of the same name (api.convert).
    if not dst and not options["dry_run"]:
        raise click.UsageError("missing -o DST (or use --dry-run)")

    def go():
        if not options["dry_run"]:  # before torch is imported: how pinned host buffers are made (host_memory.py)
            from .run.host_memory import configure_pinned_allocator

            configure_pinned_allocator()
        if not (options["dry_run"] or options["resume"]) and options["executor"] == "local":
            from .run import prefetch

            # The disk reads ahead while torch imports (prefetch.py); api stops it. Not on --resume
            # (the first bytes are likely done) nor for Ray (its workers read, maybe elsewhere).
            prefetch.start(src)
        from .api import convert as run
        from .plan.options import ConvertOptions

        return run(ConvertOptions(src=src, dst=dst, quiet=quiet, **options))

    _run(debug, go)
    _fast_exit()


def _fast_exit() -> None:
    """Leave at once after a successful run: every output is written, fsynced and renamed, and
    tearing down a CUDA context and gigabytes of pinned host memory takes seconds for nothing."""
    if "torch" in sys.modules and getattr(sys.modules["torch"], "cuda", None) and sys.modules["torch"].cuda.is_initialized():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@main.command(context_settings=CONTEXT, short_help="What converting SRC would do and break (headers only).", epilog=examples(
    "quantize check meta-llama/Llama-3.1-8B-Instruct --algo FP8_PB_WO --tp 4",
    "quantize check ./my-model --algo NVFP4 --exclude '*.k_proj' --json check.json --strict"))
@click.argument("src")
@click.option("--algo", type=AlgoType(), required=True, help=f"One of {', '.join(ALGOS)}.")
@click.option("--exclude", multiple=True, metavar="PATTERN", help="Exclude pattern to analyse (as convert takes it). Repeatable.")
@click.option("--recipe", metavar="NAME|FILE", help="Recipe name or YAML file (default: by config.json model_type).")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor-parallel ranks to check shapes for.")
@click.option("--json", "json_path", metavar="FILE", help="Write the findings as JSON (docs/check.md).")
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@click.option("--revision", help="Hub revision when SRC is a repo id.")
@click.option("--format", "fmt", type=FORMAT, default="modelopt", show_default=True, help="Output format to check for.")
@click.option("--algo-for", "algo_for", multiple=True, metavar="PATTERN=ALGO",
              help="Another algorithm for matching modules (--exclude's pattern rules): checks the MIXED_PRECISION checkpoint convert would write (compressed-tensors: one config group per algorithm). Repeatable.")
@click.option("--calib-data", metavar="DATA", help="The conversion will calibrate on DATA (not run here): no [uncalibrated] warning.")
@click.option("--act-scales", metavar="SCALES.json", help="The conversion will reuse this scales file: no [uncalibrated] warning.")
@click.option("--allow", multiple=True, metavar="CODE", help="With --strict: accept warnings with this code (e.g. int8-vllm). Repeatable.")
@common
def check(src, algo, exclude, recipe, tp, json_path, strict, revision, quiet, debug, fmt="modelopt", algo_for=(), calib_data=None,
          act_scales=None, allow=()):
    """Report what converting SRC would do and what would break at serve time (headers only)."""

    def go():
        from .api import check as run

        run(src, algo, exclude=exclude, recipe=recipe, tp=tp, json=json_path, strict=strict, revision=revision, quiet=quiet,
            format=fmt, algo_for=algo_for, calib_data=calib_data, act_scales=act_scales, allow=allow)

    _run(debug, go)


@main.command(context_settings=CONTEXT, short_help="Check DST as vLLM / TensorRT-LLM would load it.", epilog=examples(
    "quantize verify my-model-fp8",
    "quantize verify my-model-fp8 --source ./my-model --json verify.json --strict"))
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


@main.command("eval", context_settings=CONTEXT, short_help="Accuracy of DST as served, from its own bytes (a CI gate).", epilog=examples(
    "quantize eval my-model-fp8 --source ./my-model",
    "quantize eval my-model-nvfp4 --source ./my-model --max-ppl-increase 3 --min-top1 0.9 --json eval.json"))
@click.argument("dst")
@click.option("--source", metavar="SRC", help="The unquantized checkpoint: compare with it in the same pass (needed for the gates).")
@click.option("--data", default="default", show_default=True, metavar="DATA",
              help="default (held-out text shipped with the tool), FILE.txt, FILE.jsonl or a cached dataset id.")
@click.option("--samples", type=click.IntRange(min=1), metavar="N", help="Eval samples (default 64).")
@click.option("--seq-len", type=click.IntRange(min=2), metavar="L", help="Tokens per sample (default 512).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--json", "json_path", metavar="FILE", help="Write the result as JSON (docs/accuracy.md, docs/ci.md).")
@gate_options
@click.option("--weights-only", is_flag=True, help="Activations and KV cache unquantized (weight-only kernels, e.g. NVFP4 on Hopper).")
@common
def eval_command(dst, source, data, samples, seq_len, device, json_path, max_ppl_increase, max_kl, min_top1, min_cosine,
                 min_sample_cosine, weights_only, quiet, debug):
    """Measure converted checkpoint DST as the serving engine computes it (perplexity, KL, top-1 vs SRC)."""

    def go():
        from .api import eval as run

        run(dst, source=source, data=data, samples=samples, seq_len=seq_len, device=device, json=json_path,
            max_ppl_increase=max_ppl_increase, max_kl=max_kl, min_top1=min_top1, min_cosine=min_cosine,
            min_sample_cosine=min_sample_cosine, weights_only=weights_only, quiet=quiet)

    _run(debug, go)
    _fast_exit()


@main.command(context_settings=CONTEXT, short_help="A packed-layout checkpoint back to the plain one.", epilog=examples(
    "quantize unpack my-model-marlin -o my-model-plain && quantize verify my-model-plain"))
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


@main.command(context_settings=CONTEXT, short_help="A short summary of a checkpoint (headers only).", epilog=examples(
    "quantize inspect example:tiny-llama", "quantize inspect my-model-fp8", "quantize inspect Qwen/Qwen3-8B"))
@click.argument("path")
@common
@click.option("--revision", help="Hub revision when PATH is a repo id.")
def inspect(path, quiet, debug, revision=None):
    """A short summary of checkpoint PATH, a folder, Hub repo id or example:NAME (headers only): dtypes, sizes, quantization."""

    def go():
        from .inspect_checkpoint import inspect_checkpoint

        click.echo(inspect_checkpoint(path, revision=revision))

    _run(debug, go)


@main.command(context_settings=CONTEXT, short_help="Upload finished DST to a Hub repo (resumable).", epilog=examples(
    "quantize push my-model-fp8 me/my-model-FP8", "quantize push my-model-fp8 me/my-model-FP8 --private --revision-out v1"))
@click.argument("dst")
@click.argument("repo_id")
@click.option("--private", is_flag=True, help="Create the repo private.")
@click.option("--revision-out", metavar="BRANCH", help="Commit to this branch (created if missing).")
@click.option("--json", "json_path", metavar="FILE", help="Write the publish record as JSON (docs/ci.md).")
@common
def push(dst, repo_id, private, revision_out, json_path, quiet, debug):
    """Upload finished checkpoint DST to Hub repo REPO_ID (created if missing; a rerun resumes)."""

    def go():
        from .api import push as run

        run(dst, repo_id, private=private, revision_out=revision_out, json=json_path, quiet=quiet)

    _run(debug, go)


@main.group(context_settings=CONTEXT, invoke_without_command=True, short_help="List the shipped recipes, or show one.",
            epilog=examples("quantize recipes list", "quantize recipes show qwen3_moe"))
@click.pass_context
def recipes(ctx):
    """List the shipped recipes, or show one."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(recipes_list)


@recipes.command("list")
def recipes_list():
    """One line per shipped recipe: name, model types, description."""
    from .modules.recipe import builtin_names, load_recipe

    rows = [(name, ", ".join(r.model_types) or "-", r.description) for name in builtin_names() for r in [load_recipe(name)]]
    widths = [max(len(row[i]) for row in rows + [("RECIPE", "MODEL TYPES", "")]) for i in (0, 1)]
    for name, types, description in [("RECIPE", "MODEL TYPES", "DESCRIPTION"), *rows]:
        click.echo(f"{name:<{widths[0]}}  {types:<{widths[1]}}  {description}")


@recipes.command("show")
@click.argument("name")
@common
def recipes_show(name, quiet, debug):
    """Print recipe NAME resolved (after extends) as YAML."""

    def go():
        from .modules.recipe import describe

        click.echo(describe(name))

    _run(debug, go)


if __name__ == "__main__":  # pragma: no cover
    main()


@main.command(context_settings=CONTEXT, short_help="Measure activation scales of SRC into SCALES.json.", epilog=examples(
    "quantize calibrate ./my-model -o scales.json --calib-data default",
    "quantize convert ./my-model -o out --algo NVFP4 --act-scales scales.json"))
@click.argument("src")
@click.option("--calib-data", default="default", show_default=True, metavar="DATA", help="default, FILE.jsonl, FILE.txt or a cached dataset id.")
@click.option("-o", "--output", metavar="SCALES.json", required=True, help="Where to write the measured amax and E[x^2] (docs/calibration.md).")
@click.option("--calib-samples", type=int, metavar="N", help="Calibration samples (default 128).")
@click.option("--calib-seq-len", type=int, metavar="L", help="Tokens per sample (default 512).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--memory-budget", default="4GB", show_default=True, help="Host bytes (CPU: the hidden states must fit).")
@click.option("--revision", help="Hub revision when SRC is a repo id.")
@click.option("--recipe", metavar="NAME|FILE", help="Recipe (per-expert module names), default by model_type.")
@weight_options
@click.option("--algo", type=AlgoType(), help="With --rounding gptq / --smooth: the algorithm the weights are made for.")
@click.option("--format", "format", type=FORMAT, default="modelopt", show_default=True, help="With --rounding / --smooth: the output format.")
@click.option("--scale-search", type=click.Choice(["none", "mse"], case_sensitive=False), default="none", show_default=True,
              help="With --rounding / --smooth: the scales the conversion will search.")
@click.option("--exclude", multiple=True, metavar="PATTERN", help="With --rounding / --smooth: modules the conversion keeps unquantized.")
@common
def calibrate(src, calib_data, output, calib_samples, calib_seq_len, device, memory_budget, revision, recipe, quiet, debug,
              rounding="nearest", smooth="none", algo=None, format="modelopt", scale_search="none", exclude=()):
    """Run SRC layer by layer on calibration data and write every Linear input amax and K/V amax.

    With --rounding gptq / --smooth it also writes the weights they choose for --algo (SCALES.weights/
    beside SCALES.json), which `convert --act-scales SCALES.json` with the same options reuses."""

    def go():
        from .run import prefetch

        prefetch.start(src)  # the source's first layers come off the disk while torch and transformers import
        from .api import calibrate as run

        run(src, calib_data=calib_data, output=output, calib_samples=calib_samples, calib_seq_len=calib_seq_len,
            device=device, memory_budget=memory_budget, revision=revision, recipe=recipe, quiet=quiet,
            rounding=rounding, smooth=smooth, algo=algo, format=format, scale_search=scale_search, exclude=exclude)

    _run(debug, go)
    _fast_exit()
