"""The feature-interaction matrix: its factors, the rules by which options refuse each other, the
seed rows, the covering array built from them (pairwise.py) and, per cell, the command lines.

Factors (issue 23, grown in issue 35): executor (local, Ray, two devices in one process: ``--device
cpu,cpu``), format, base algorithm, ``--algo-for``, calibration (none, ``--act-scales`` from
``quantize calibrate``, ``--calib-data`` inside the run), layout, KV cache, scale search, lifecycle
(fresh / interrupted then ``--resume`` / finished then ``--resume``), ``--verify`` and a fake-Hub
``--push-to-hub``. Which rows the converter refuses is asked of its own checks (``refusals``), and
every cell is compared with a reference that reaches the same bytes by another path
(``reference_options``); a row that would be its own reference is never a cell. The source is ``example:tiny-llama``
written in small shards (SHARD) so that fused groups straddle output shards (the Ray defect hides
there; test_matrix.py checks that the references really do straddle).

The second covering array (algo_cells.py, test_algorithms.py) holds what this one does not: the other
algorithms of ``ALGORITHMS`` (INT4, INT4_ASYM, INT8, MXFP8, W4A16_NVFP4, FP8_PER_CHANNEL_PER_TOKEN),
``--rounding gptq``, ``--smooth awq``, ``--exclude``, ``--eval`` and the MoE ``example:tiny-qwen3-moe``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

from . import pairwise
from .support import CALIB

SRC = "example:tiny-llama"
SHARD = "100KB"  # small: fused q/k/v and gate/up groups land in different output shards
FACTORS = {
    "executor": ("local", "ray", "devices"),  # devices: --device cpu,cpu (two devices in one process)
    "format": ("modelopt", "compressed-tensors"),
    "algo": ("NVFP4", "FP8", "FP8_PB_WO"),  # static scales + shared amax, static per-tensor, 128x128 blocks
    "algo_for": ("none", "mixed"),
    "calibration": ("none", "act-scales", "calib-data"),  # calib-data: calibrated inside the run (the golden text)
    "layout": ("plain", "marlin", "cutlass", "flashinfer"),
    "kv": ("none", "fp8"),
    "scale_search": ("none", "mse"),
    "lifecycle": ("fresh", "interrupted", "finished"),
    "verify": ("off", "on"),
    "push": ("off", "on"),
}
# --algo-for per base algorithm: a second algorithm on part of the model (the README's examples)
MIXED = {"NVFP4": "*self_attn*=FP8_PB_WO", "FP8": "*mlp*=NVFP4", "FP8_PB_WO": "*mlp*=NVFP4"}
DEVICE = {"local": "cpu", "ray": "cpu", "devices": "cpu,cpu"}
# What each packed layout pre-packs on a dense model (docs/layouts.md); the others are written plain, with a warning
PACKS = {"plain": (), "marlin": ("NVFP4", "FP8", "FP8_PB_WO"), "cutlass": ("NVFP4",), "flashinfer": ("NVFP4",)}


def written_layout(o: dict) -> str:
    """The layout the bytes are in: the asked one where it packs the algorithm, else plain."""
    return o["layout"] if o["algo"] in PACKS[o["layout"]] else "plain"


def cost(o: dict) -> float:
    """Rough seconds a cell takes on a 2-core CPU (pairwise.build takes the cheapest of rows that cover as much)."""
    mse = o["scale_search"] == "mse"  # the search dominates: NVFP4's weighted by activations, or in Ray's workers, most
    return (8 * (o["executor"] == "ray") + mse * (6 + 20 * (o["algo"] == "NVFP4" and o["calibration"] != "none")
                                                  + 10 * (o["executor"] == "ray") + 3 * (o["lifecycle"] != "fresh"))
            + (o["lifecycle"] != "fresh") + (o["calibration"] == "calib-data") + (o["verify"] == "on"))


@dataclass(frozen=True)
class Refusal:
    """What the converter's own checks say of a row's options: the exit code and the message (with details)."""

    code: int
    message: str

    @property
    def fragments(self) -> tuple[str, ...]:
        return tuple(ln.strip() for ln in self.message.splitlines() if ln.strip())


def _options(row: dict):
    """The row as ``ConvertOptions`` (what the CLI would build from its flags; DST need not exist)."""
    from quantize_cli.plan.options import ConvertOptions

    calib = {"act-scales": {"act_scales": "SCALES.json"}, "calib-data": {"calib_data": "default"}}.get(row["calibration"], {})
    return ConvertOptions(src=SRC, dst="out", algo=row["algo"], format=row["format"], layout=row["layout"],
                          algo_for=(MIXED[row["algo"]],) if row["algo_for"] == "mixed" else (),
                          kv_cache_dtype="fp8" if row["kv"] == "fp8" else None, scale_search=row["scale_search"],
                          executor="ray" if row["executor"] == "ray" else "local", device=DEVICE[row["executor"]],
                          max_shard_size=SHARD, **calib)


@functools.lru_cache(maxsize=None)
def _checked(opts) -> Refusal | None:
    """The converter's refusal of `opts` before the first byte, asked of its torch-free checks in convert's
    order: the options (plan/steps.check_options), how it runs (run/options.check_run_options), the plan's
    problems (from the example's headers: a layout that takes one algorithm, ...)."""
    from quantize_cli.errors import QuantizeError
    from quantize_cli.plan.steps import check_options

    try:
        ok = check_options(opts)
        _run_problems(opts.executor, opts.device, opts.format)
        _plan_problems(opts.algo, opts.algo_for, opts.layout, opts.format, opts.kv_cache_dtype, opts.scale_search)
    except QuantizeError as exc:
        return Refusal(exc.exit_code, "\n".join([str(exc), *map(str, getattr(exc, "details", None) or [])]))
    return None


@functools.lru_cache(maxsize=None)
def _run_problems(executor, device, fmt) -> None:
    """run/options.check_run_options reads the executor, the device and the format's reference-math rule."""
    from quantize_cli.formats import format_named
    from quantize_cli.plan.options import ConvertOptions
    from quantize_cli.run.options import check_run_options

    check_run_options(ConvertOptions(src=SRC, executor=executor, device=device, format=fmt), format_named(fmt))


@functools.lru_cache(maxsize=None)
def _plan_problems(algo, algo_for, layout, fmt, kv, scale_search) -> None:
    from quantize_cli.plan.steps import prepare, raise_problems

    raise_problems(prepare(SRC, algo, layout=layout, scale_search=scale_search, format=fmt, algo_for=algo_for, kv_cache_dtype=kv))


CHECKED = ("executor", "format", "algo", "algo_for", "calibration", "layout", "kv", "scale_search")  # what the checks read


@functools.lru_cache(maxsize=None)
def _refusals(values: tuple) -> tuple:
    found = _checked(_options(dict(zip(CHECKED, values))))
    return (found,) if found else ()


def refusals(row: dict) -> list[Refusal]:
    """The converter's refusal of the row (none, or the first one its checks meet): asked of the code, never a table here."""
    return list(_refusals(tuple(row[k] for k in CHECKED)))


BASE = {"executor": "local", "format": "modelopt", "algo": "NVFP4", "algo_for": "none", "calibration": "none", "layout": "plain",
        "kv": "none", "scale_search": "none", "lifecycle": "fresh", "verify": "off", "push": "off"}
# Hot spots the issue names, taken whole before the greedy fills in the pairs (a pair alone would
# not force the third option that makes them fail): Ray with a mixed checkpoint whose --algo shares
# no amax (defect 1); calibrated mixed precision and calibrated KV with a dynamic --algo (defect 3).
SEEDS = (
    {**BASE, "executor": "ray", "algo": "FP8_PB_WO", "algo_for": "mixed"},
    {**BASE, "algo": "FP8_PB_WO", "algo_for": "mixed", "calibration": "act-scales", "kv": "fp8"},
)


# -- the reference: another path to the same bytes -------------------------------------------------------
OTHER_SOURCE = {"act-scales": "calib-data", "calib-data": "act-scales", "none": "none"}


def reference_options(o: dict) -> dict:
    """The options of the cell's reference: the same bytes by another path: the local executor on one device, a
    fresh run, the plain layout (a packed cell is compared after ``quantize unpack``), and the scales from the
    other source (``calibrate`` then ``--act-scales`` for a ``--calib-data`` cell, and the reverse)."""
    return {**o, "executor": "local", "lifecycle": "fresh", "layout": "plain", "calibration": OTHER_SOURCE[o["calibration"]],
            "verify": "off", "push": "off"}


def path(o: dict) -> tuple:
    """How a run reaches its bytes (not what they are): executor, lifecycle, layout written, where the scales come from."""
    return (o["executor"], o["lifecycle"], written_layout(o), o["calibration"])


def same_path(o: dict) -> bool:
    """The reference would be the cell's own command: such a row proves nothing and is never a cell."""
    return path(o) == path(reference_options(o))


def allowed(row: dict) -> bool:
    return not refusals(row) and not same_path(row)


STATIC_PART = {"FP8": "NVFP4", "FP8_PB_WO": "NVFP4", "NVFP4": None}  # the static algorithm MIXED adds, if any


def has_static_scales(o: dict) -> bool:
    """Some module of the output has a static input scale (FP8 or NVFP4)."""
    return o["algo"] in ("FP8", "NVFP4") or (o["algo_for"] == "mixed" and STATIC_PART[o["algo"]] is not None)


def calibrated(o: dict) -> bool:
    """Calibration decides bytes: static input scales or KV scales exist (else it is ignored, with a warning)."""
    return o["calibration"] != "none" and (has_static_scales(o) or o["kv"] == "fp8")


@dataclass(frozen=True)
class Row:
    """One row of a covering array (this one or algo_cells.py's); ``id`` names its algorithm and every
    other value that is not the array's baseline (``base``)."""

    row: tuple  # ((factor, value), ...) in the array's FACTORS order
    base: ClassVar[dict] = {}

    @property
    def o(self) -> dict:
        return dict(self.row)

    @property
    def id(self) -> str:
        o = self.o
        return "-".join([o["algo"]] + [f"{k}={v}" for k, v in o.items() if k != "algo" and v != self.base[k]])


@dataclass(frozen=True)
class Cell(Row):
    """One row of the matrix."""

    base: ClassVar[dict] = BASE

    @property
    def refused(self) -> list[Refusal]:
        return refusals(self.o)

    @property
    def reference(self) -> "Cell":
        """The reference cell: the same bytes by another path (reference_options)."""
        ref = reference_options(self.o)
        return Cell(tuple((k, ref[k]) for k in FACTORS))

    def bytes_key(self) -> tuple:
        """What decides the output bytes (the reference run is shared by cells with the same key)."""
        o = self.o
        return (o["format"], o["algo"], o["algo_for"], o["calibration"], o["layout"], o["kv"], o["scale_search"])

    def args(self, dst: str, scales: str | None) -> list[str]:
        """``quantize convert`` arguments of this cell (without --verify, --push-to-hub, --report, --resume)."""
        o = self.o
        args = ["convert", SRC, "-o", dst, "--algo", o["algo"], "--max-shard-size", SHARD, "--device", DEVICE[o["executor"]], "-q"]
        args += ["--format", o["format"]] if o["format"] != "modelopt" else []
        args += ["--algo-for", MIXED[o["algo"]]] if o["algo_for"] == "mixed" else []
        args += ["--act-scales", scales] if o["calibration"] == "act-scales" else []
        args += ["--calib-data", CALIB] if o["calibration"] == "calib-data" else []  # the data and defaults `scales` was made with
        args += ["--layout", o["layout"]] if o["layout"] != "plain" else []
        args += ["--kv-cache-dtype", "fp8"] if o["kv"] == "fp8" else []
        args += ["--scale-search", "mse"] if o["scale_search"] != "none" else []
        args += ["--executor", "ray"] if o["executor"] == "ray" else []
        return args

    def byte_flags(self, scales: str | None) -> dict[str, list[str]]:
        """The flags that decide the bytes, as the card's command line must repeat them."""
        o = self.o
        return {"--algo": [o["algo"]], "--max-shard-size": [SHARD],
                "--format": [o["format"]] if o["format"] != "modelopt" else [],
                "--algo-for": [MIXED[o["algo"]]] if o["algo_for"] == "mixed" else [],
                **({"--act-scales": [scales] if calibrated(o) and o["calibration"] == "act-scales" else [],
                    "--calib-data": [CALIB] if calibrated(o) and o["calibration"] == "calib-data" else []}
                   if calibrated(o) or o["calibration"] == "none" else {}),
                "--layout": [o["layout"]] if o["layout"] != "plain" else [],
                "--kv-cache-dtype": ["fp8"] if o["kv"] == "fp8" else [],
                "--scale-search": ["mse"] if o["scale_search"] != "none" else []}


def build() -> tuple[list[Cell], list[Cell]]:
    """(cells that must write output, cells that must be refused): every pair of values at least once,
    each by a cell that runs to the end where the options allow one."""
    ok, refused = pairwise.build(FACTORS, allowed, refusals, SEEDS, cost=cost)
    as_cell = lambda r: Cell(tuple((k, r[k]) for k in FACTORS))  # noqa: E731
    return [as_cell(r) for r in ok], [as_cell(r) for r in refused]
