"""The matrix's second covering array (issue 35): what the first (cells.py) lacks.

Factors: every algorithm the first array does not hold (read from ``quantize_cli.algorithms.ALGORITHMS``:
INT4, INT4_ASYM, INT8, MXFP8, W4A16_NVFP4, FP8_PER_CHANNEL_PER_TOKEN), ``--rounding`` (nearest, gptq),
``--smooth`` (none, awq), ``--exclude`` (none, one layer's attention), ``--eval`` (off, a gate that
passes, a gate that fails), the model (``example:tiny-llama``, the MoE ``example:tiny-qwen3-moe``), the
format, and the path the bytes take (``path``):

- ``calibrate``: ``quantize calibrate`` (with the transform's options where one is asked) then
  ``convert --act-scales``;
- ``interrupted``: ``convert --calib-data`` stopped after a few journaled tasks, then ``--resume``;
- ``devices``: ``convert --calib-data --device cpu,cpu`` (two devices in one process).

Every cell is calibrated on the golden text (a transform needs the data; without one the algorithms
here ignore it, with a warning). Its reference is one fresh ``convert --calib-data`` on one device
without ``--eval``: a path no cell takes, so no cell is compared with its own command. Which rows the
converter refuses is asked of its own checks (``refusals``), as cells.py does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

from quantize_cli.algorithms import ALGORITHMS

from . import cells, pairwise
from .support import CALIB

NEW_ALGOS = tuple(a for a in ALGORITHMS if a not in cells.FACTORS["algo"])  # the algorithms the first array lacks
EXCLUDE = {"attn0": "model.layers.0.self_attn*"}  # a whole fused q/k/v group and o_proj: smoothing must skip them
EVAL = ["--eval-samples", "2", "--eval-seq-len", "16"]
GATE = {"pass": ["--max-kl", "10"], "fail": ["--max-kl", "0"]}  # KL of a quantized model is never exactly 0
FACTORS = {
    "algo": NEW_ALGOS,
    "rounding": ("nearest", "gptq"),
    "smooth": ("none", "awq"),
    "exclude": ("none", "attn0"),
    "eval": ("off", "pass", "fail"),
    "model": ("tiny-llama", "tiny-qwen3-moe"),
    "format": ("modelopt", "compressed-tensors"),
    "layout": ("plain", "marlin"),  # marlin packs every algorithm here on dense Linears, MXFP8's MoE stacks too
    "path": ("calibrate", "interrupted", "devices"),
}
REFERENCE_PATH = "run"  # fresh, one device, --calib-data inside the run: the path of every reference, of no cell
DEVICE = {"calibrate": "cpu", "interrupted": "cpu", "devices": "cpu,cpu", "run": "cpu"}
BASE = {"algo": NEW_ALGOS[0], "rounding": "nearest", "smooth": "none", "exclude": "none", "eval": "off", "model": "tiny-llama",
        "format": "modelopt", "layout": "plain", "path": "calibrate"}


def transform(o: dict) -> bool:
    """GPTQ or smoothing is asked: the calibration data decides the weights."""
    return o["rounding"] != "nearest" or o["smooth"] != "none"


def cost(o: dict) -> float:
    """Rough seconds on a 2-core CPU: a transform's forward (MoE: every expert), an eval forward, a resume."""
    return (2 * transform(o) * (1 + (o["model"] != "tiny-llama")) + 2 * (o["eval"] != "off")
            + (o["path"] == "interrupted") + (o["path"] == "calibrate") + (o["layout"] != "plain"))


def _options(o: dict):
    from quantize_cli.plan.options import ConvertOptions

    calib = {"act_scales": "SCALES.json"} if o["path"] == "calibrate" else {"calib_data": CALIB}
    return ConvertOptions(src=f"example:{o['model']}", dst="out", algo=o["algo"], format=o["format"], layout=o["layout"],
                          exclude=(EXCLUDE[o["exclude"]],) if o["exclude"] != "none" else (), rounding=o["rounding"],
                          smooth=o["smooth"], device=DEVICE[o["path"]], eval=o["eval"] != "off",
                          max_kl=float(GATE[o["eval"]][1]) if o["eval"] != "off" else None, **calib)


@functools.lru_cache(maxsize=None)
def _checked(opts) -> cells.Refusal | None:
    """The converter's refusal of `opts` before the first byte, asked of its torch-free checks in convert's
    order (plan/steps.check_options, run/options.check_run_options, the plan's problems from the headers)."""
    from quantize_cli.errors import QuantizeError
    from quantize_cli.formats import format_named
    from quantize_cli.plan.steps import check_options
    from quantize_cli.run.options import check_run_options

    try:
        check_options(opts)
        check_run_options(opts, format_named(opts.format))
        _plan_problems(opts.src, opts.algo, opts.exclude, opts.format, opts.layout)
    except QuantizeError as exc:
        return cells.Refusal(exc.exit_code, "\n".join([str(exc), *map(str, getattr(exc, "details", None) or [])]))
    return None


@functools.lru_cache(maxsize=None)
def _plan_problems(src, algo, exclude, fmt, layout) -> None:
    from quantize_cli.plan.steps import prepare, raise_problems

    raise_problems(prepare(src, algo, exclude=exclude, format=fmt, layout=layout))


def refusals(row: dict) -> list[cells.Refusal]:
    """The converter's refusal of the row (none, or the first its checks meet): asked of the code, never a table here."""
    found = _checked(_options(row))
    return [found] if found else []


def allowed(row: dict) -> bool:
    return not refusals(row)


@dataclass(frozen=True)
class Cell(cells.Row):
    """One row of the second array."""

    base: ClassVar[dict] = BASE

    @property
    def src(self) -> str:
        return f"example:{self.o['model']}"

    @property
    def refused(self) -> list[cells.Refusal]:
        return refusals(self.o)

    def bytes_key(self) -> tuple:
        """What decides the output bytes in their plain form (cells with the same key share one reference run; a
        packed cell is compared after ``quantize unpack``)."""
        o = self.o
        return (o["model"], o["format"], o["algo"], o["rounding"], o["smooth"], o["exclude"])

    def byte_options(self) -> list[str]:
        """The options that decide the weights, without the data's source (--calib-data or --act-scales) and the
        layout (what ``quantize calibrate`` takes with a transform)."""
        o = self.o
        args = ["--algo", o["algo"]] + (["--format", o["format"]] if o["format"] != "modelopt" else [])
        args += ["--exclude", EXCLUDE[o["exclude"]]] if o["exclude"] != "none" else []
        args += ["--rounding", o["rounding"]] if o["rounding"] != "nearest" else []
        return args + (["--smooth", o["smooth"]] if o["smooth"] != "none" else [])

    def calibrate_args(self, scales: str) -> list[str]:
        """``quantize calibrate`` for the ``calibrate`` path: the transform's options only where one is asked
        (they are usage errors without one)."""
        return ["calibrate", self.src, "--calib-data", CALIB, "-o", scales, "--device", "cpu", "-q",
                *(self.byte_options() if transform(self.o) else [])]

    def args(self, dst: str, scales: str | None, path: str | None = None) -> list[str]:
        """``quantize convert`` arguments along `path` (default: the cell's; ``run``: its reference's);
        without --report and --resume. A reference runs without --eval."""
        o, path = self.o, path or self.o["path"]
        data = ["--act-scales", scales] if path == "calibrate" else ["--calib-data", CALIB]
        args = ["convert", self.src, "-o", dst, *self.byte_options(), *data, "--device", DEVICE[path], "-q"]
        args += ["--layout", o["layout"]] if o["layout"] != "plain" and path != REFERENCE_PATH else []  # the reference: plain
        return args + ([*EVAL, "--eval", *GATE[o["eval"]]] if o["eval"] != "off" and path != REFERENCE_PATH else [])

    def card_flags(self, scales: str) -> dict[str, list[str]]:
        """The flags that decide the bytes, as the card's command line must repeat them (the data's source
        only where it decides bytes: an ignored --calib-data may be recorded or not)."""
        o = self.o
        flags = {"--algo": [o["algo"]], "--format": [o["format"]] if o["format"] != "modelopt" else [],
                 "--exclude": [EXCLUDE[o["exclude"]]] if o["exclude"] != "none" else [],
                 "--rounding": [o["rounding"]] if o["rounding"] != "nearest" else [],
                 "--smooth": [o["smooth"]] if o["smooth"] != "none" else [],
                 "--layout": [o["layout"]] if o["layout"] != "plain" else []}
        if transform(o):
            flags |= {"--act-scales": [scales] if o["path"] == "calibrate" else [],
                      "--calib-data": [CALIB] if o["path"] != "calibrate" else []}
        return flags


@functools.lru_cache(maxsize=None)
def build() -> tuple[list[Cell], list[Cell]]:
    """(cells that must write output, cells that must be refused): every pair of values at least once."""
    ok, refused = pairwise.build(FACTORS, allowed, refusals, cost=cost)
    as_cell = lambda r: Cell(tuple((k, r[k]) for k in FACTORS))  # noqa: E731
    return [as_cell(r) for r in ok], [as_cell(r) for r in refused]  # cached: callers copy before adding
