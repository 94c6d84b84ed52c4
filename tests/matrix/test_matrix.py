"""Issue 23's feature-interaction matrix: a covering array (every pair of option values at least once;
cells.py, pairwise.py) over executor (local, Ray, ``--device cpu,cpu``), format, ``--algo-for``,
calibration (``--act-scales``, ``--calib-data``), layout, KV cache, scale search, lifecycle,
``--verify`` and ``--push-to-hub``, on ``example:tiny-llama`` in small shards. The scenarios a
single command line cannot show are in test_scenarios.py; the other algorithms, GPTQ, smoothing,
``--exclude``, ``--eval`` and MoE are the second array's (test_algorithms.py).

Every cell runs the real command line (in-process, CliRunner) and either

- is refused before the first byte: its exit code, one ``error:`` line naming both options, no DST,
  no work folder, nothing else touched; or
- writes output whose files equal the reference's byte for byte (the same bytes by another path:
  the local executor on one device, a fresh run, the plain layout, the scales from the other source;
  a packed layout is compared after ``quantize unpack``; cells.reference_options), that passes
  ``verify --source``, whose config files, card and ``--report`` describe those bytes (algorithm per
  module, format, layout, calibrated or not and the scale values, KV scales, verified, pushed), and
  whose lifecycle held (interrupted: exit 130 and no DST, then ``--resume``; finished: ``--resume``
  says already complete, writes nothing and still runs verify / push / report).

A cell that fails today because of a defect of issue 23 (or one found here) is a strict xfail naming
it (known.py), so it turns into an XPASS error the moment the fix lands.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from quantize_cli.api import unpack, verify
from quantize_cli.checkpoint.examples import example_path
from tests.hostile.helpers import assert_clean_failure, invoke, tree_state

from . import cells
from .support import interrupted_after
from .describe import (Output, algos_in_bytes, check_card, check_config, check_kept, check_scales, check_serve_lines, check_weight_scales, expected_algos,
                       same_files, section, straddling_groups)
from .known import marks_for, unmatched
from .scenarios import SCENARIOS
from .reports import check_report

RUN, REFUSED = cells.build()
FLAGS = {"format": "--format", "algo": "--algo", "algo_for": "--algo-for", "layout": "--layout", "scale_search": "--scale-search",
         "kv": "--kv-cache-dtype", "executor": "--executor", "calibration": "--act-scales"}  # a row's non-baseline value -> its flag
SEAL = ".quantize-checksums"  # every finished output records how it was made and its CRCs (output/workfolder.py)


def _param(cell):
    return pytest.param(cell, id=cell.id, marks=marks_for(cell))


@pytest.mark.parametrize("cell", [pytest.param(c, id=c.id) for c in REFUSED])
def test_refused_before_the_first_byte(cell, tmp_path, scales, hub):
    (rule,) = cell.refused  # what the converter's own checks say (cells.refusals)
    named = [f for k, f in FLAGS.items() if cell.o[k] != cells.BASE[k] and re.search(re.escape(f) + r"(?![\w-])", rule.message)]
    assert len(named) >= 2, f"the refusal names {named}, not both options that refuse each other: {rule.message}"
    before = tree_state(tmp_path)
    repo = _repo(cell)
    r = invoke(*cell.args(str(tmp_path / "out"), scales[0]), "--report", str(tmp_path / "report.json"), *_follow_ups(cell.o, repo))
    assert_clean_failure(r, rule.code, *rule.fragments)
    assert repo not in hub.repos
    after = {k: v for k, v in tree_state(tmp_path).items() if k != "report.json"}  # the report says why, nothing else appears
    assert after == before, f"files appeared: {sorted(set(after) - set(before))}"
    if os.path.exists(tmp_path / "report.json"):  # usage errors found while checking the options write none (docs/ci.md)
        assert json.load(open(tmp_path / "report.json"))["status"] == "error"


@pytest.mark.parametrize("cell", [_param(c) for c in RUN])
def test_cell(cell, tmp_path, scales, references, hub, request):
    o = cell.o
    if o["executor"] == "ray":
        request.getfixturevalue("ray_session")
    dst, report, repo = str(tmp_path / "out"), str(tmp_path / "report.json"), _repo(cell)
    args = cell.args(dst, scales[0])
    follow = ["--report", report, *_follow_ups(o, repo)]
    problems: list[str] = []
    status = _lifecycle(o["lifecycle"], args, follow, dst, tmp_path, problems)
    assert not problems, "\n".join(problems)  # a run that did not finish has nothing to describe
    ref = references.of(cell)  # the same bytes by another path (cells.reference_options)
    out = Output.read(dst)
    fmt = o["format"]
    want = expected_algos(o["algo"], cells.MIXED[o["algo"]] if o["algo_for"] == "mixed" else None)
    amax, kv_amax = (scales[1], scales[2]) if cells.calibrated(o) else (None, None)
    if algos_in_bytes(out) != want:
        problems.append(f"bytes: per-module algorithms {sorted(set(algos_in_bytes(out).items()) ^ set(want.items()))[:4]} differ from the options'")
    layout = cells.written_layout(o)  # an asked layout that does not pack the algorithm is written plain (a warning says so)
    check_config(out, fmt, o["kv"] == "fp8", layout, amax is not None, problems)
    check_scales(out, fmt, want, amax, kv_amax, o["kv"] == "fp8", problems)
    check_kept(out, fmt, cells.SRC.partition(":")[2], problems)
    if layout == "plain":  # a packed layout's tensors are the kernel's (docs/layouts.md); unpack gives these back
        check_weight_scales(out, fmt, cells.SRC.partition(":")[2], problems)
    check_card(out, fmt, o["kv"] == "fp8", layout, amax is not None, cell.byte_flags(scales[0]), problems)
    verified = section(out.card, "Verification").startswith("`quantize verify` passed")
    if o["lifecycle"] != "finished" and verified != (o["verify"] == "on"):  # finished: the card is the first run's
        problems.append(f"card: verification section {section(out.card, 'Verification')[:80]!r} with --verify {o['verify']}")
    check_serve_lines(out.card, repo if o["push"] == "on" else dst, o["kv"] == "fp8", layout, problems)
    check_report(json.load(open(report)), out, o, fmt, status, problems)  # its options: as asked
    _verify_source(dst, layout, ref, tmp_path, problems)
    _published(hub, repo, dst, o["push"] == "on", problems)
    _finished_folder(dst, problems)
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems)


def _repo(cell) -> str:
    """A Hub repo id of the cell's own (letters, digits, '-'; at most 96 characters, no '-' at either end)."""
    return "me/" + re.sub(r"[^A-Za-z0-9-]+", "-", cell.id)[:90].strip("-")


def _follow_ups(o: dict, repo: str) -> list[str]:
    return (["--verify"] if o["verify"] == "on" else []) + (["--push-to-hub", repo] if o["push"] == "on" else [])


def _lifecycle(lifecycle: str, args: list, follow: list, dst: str, tmp_path, problems: list) -> str:
    """Run the cell's command through its lifecycle; returns the report status the last run must write."""
    partial = tmp_path / f".{os.path.basename(dst)}.partial"
    if lifecycle == "interrupted":
        with interrupted_after(3) as journaled:
            first = invoke(*args, *follow)
        if first.exit_code != 130 or os.path.exists(dst) or not partial.is_dir() or journaled[0] < 3:
            problems.append(f"interrupted run: exit {first.exit_code}, DST exists {os.path.exists(dst)}, work folder "
                            f"{partial.is_dir()}, {journaled[0]} unit(s) journaled: {first.stderr[-300:]}")
            return "ok"
        args = [*args, "--resume"]
    elif lifecycle == "finished":
        first = invoke(*args)
        if first.exit_code != 0:
            problems.append(f"first run: exit {first.exit_code}: {first.stderr[-300:]}")
            return "already-complete"
        before = {f: os.stat(os.path.join(dst, f)).st_mtime_ns for f in os.listdir(dst) if f.endswith(".safetensors")}
        result = invoke(*args, *follow, "--resume")
        after = {f: os.stat(os.path.join(dst, f)).st_mtime_ns for f in os.listdir(dst) if f.endswith(".safetensors")}
        if result.exit_code != 0 or after != before:  # "already complete" itself: the report's status (-q says nothing)
            problems.append(f"--resume of a finished DST: exit {result.exit_code}, shards rewritten {after != before}: "
                            f"{(result.stderr or result.output)[-300:]}")
        return "already-complete"
    result = invoke(*args, *follow)
    if result.exit_code != 0:
        problems.append(f"run: exit {result.exit_code}: {(result.stderr or result.output)[-400:]}")
    return "ok"


def _verify_source(dst: str, layout: str, ref: str, tmp_path, problems: list) -> None:
    """DST (a packed one in its plain form, ``quantize unpack``) equals the reference and passes ``quantize verify --source``."""
    folder = dst
    if layout != "plain":
        folder = str(tmp_path / "unpacked")
        unpack(dst, folder, quiet=True)
    same_files(folder, ref, problems)
    try:
        res = verify(folder, source=example_path("tiny-llama"), quiet=True)
    except Exception as exc:  # noqa: BLE001 - CheckFailed: the findings are in the message
        problems.append(f"verify --source: {exc}")
        return
    if res.errors or not res.errors_by_tensor:
        problems.append(f"verify --source: {len(res.errors)} error(s), {len(res.errors_by_tensor)} tensor(s) compared")


def _published(hub, repo: str, dst: str, pushed: bool, problems: list) -> None:
    local = {f: open(os.path.join(dst, f), "rb").read() for f in os.listdir(dst) if not f.startswith(".") and os.path.isfile(os.path.join(dst, f))}
    if not pushed:
        if repo in hub.repos:
            problems.append(f"push: {repo} exists on the Hub without --push-to-hub")
        return
    if repo not in hub.repos:
        problems.append(f"push: nothing on the Hub for {repo}")
        return
    remote = hub.files(repo)
    if remote != local:
        problems.append(f"push: the Hub's files differ from DST's: {sorted(f for f in set(remote) | set(local) if remote.get(f) != local.get(f))}")


def _finished_folder(dst: str, problems: list) -> None:
    """A finished output: sealed (how it was made and its CRCs), no work folder or lock left beside it."""
    parent, name = os.path.split(dst)
    left = [f for f in os.listdir(parent) if f in (f".{name}.partial", f".{name}.lock")]
    if left or not os.path.isfile(os.path.join(dst, SEAL)):
        problems.append(f"lifecycle: left beside DST {left}; {SEAL} in DST: {os.path.isfile(os.path.join(dst, SEAL))}")


def test_the_matrix_covers_every_pair_and_the_references_straddle_shards(references):
    """The covering array holds every pair of values; the small shards split fused groups (the Ray defect's trigger)."""
    from .pairwise import uncovered

    assert not uncovered(cells.FACTORS, [c.o for c in RUN + REFUSED])
    assert all(not c.refused for c in RUN) and all(len(c.refused) == 1 for c in REFUSED)
    mixed = references.of(cells.Cell(tuple((k, cells.SEEDS[0][k]) for k in cells.FACTORS)))
    assert straddling_groups(Output.read(mixed)), "no fused group straddles an output shard: lower cells.SHARD"


def test_no_cell_is_compared_with_its_own_command():
    """Every running cell's reference reaches the bytes by another path (executor, lifecycle, layout + unpack or
    the scales' source); a row whose reference would be its own command is never a cell."""
    same = [c.id for c in RUN if cells.path(c.reference.o) == cells.path(c.o)]
    assert not same, f"compared with their own command: {same}"
    plain = {**cells.BASE, "algo": "FP8"}  # the row that was its own reference before issue 35
    assert cells.same_path(plain) and not cells.allowed(plain)
    assert all(cells.allowed(c.o) for c in RUN)
    from . import algo_cells  # the second array: no cell takes its reference's path (test_algorithms.py checks the command lines)

    assert not [c.id for c in algo_cells.build()[0] if c.o["path"] == algo_cells.REFERENCE_PATH]


def test_every_known_defect_still_marks_a_cell_or_a_scenario():
    """known.py's strict xfails are live: an entry that matches no cell (of either array) and no scenario is stale
    (delete it)."""
    from . import algo_cells

    assert not unmatched([c.o for c in RUN] + [c.o for c in algo_cells.build()[0]] + list(SCENARIOS))


def test_the_matrix_runs_in_minutes():
    """Guard on the matrix's size: a few minutes of CPU (each cell converts the tiny example a few times)."""
    assert len(RUN) <= 24 and len(REFUSED) <= 10, (len(RUN), len(REFUSED))  # a refused cell takes ~0.05 s

