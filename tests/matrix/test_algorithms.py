"""Issue 35's second covering array (algo_cells.py): every algorithm the first array lacks, with
``--rounding gptq``, ``--smooth awq``, ``--exclude``, ``--eval`` (a gate that passes, one that fails),
a dense and an MoE model, both formats, the plain and the Marlin layout, along three paths (``quantize calibrate`` then
``--act-scales``; an interrupted ``--calib-data`` run then ``--resume``; ``--device cpu,cpu``).

Every cell runs the real command lines (in-process, CliRunner) and either

- is refused before the first byte, as the converter's own checks say (algo_cells.refusals): its exit
  code, one ``error:`` line, nothing written; or
- writes output (with a failing ``--eval`` gate: exit 1, no DST, the output kept as
  ``DST.eval-failed``; a packed one in the asked layout, read in its plain form after ``quantize unpack``) whose files equal the reference's byte for byte (one fresh ``convert
  --calib-data`` on one device, without ``--eval``: another path), whose bytes hold the asked algorithm
  on every Linear but the excluded ones (read from the tensors: describe.py), with each algorithm's
  shapes and the fused groups' shared scales, whose kept modules are the source's bytes and are named
  by every exclusion list and the card, that passes ``verify --source``, and whose config files, card
  and ``--report`` (options, per-tensor scheme, the ``eval`` result and its gate) describe those bytes.

A cell that fails because of a known defect is a strict xfail (known.py).
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from quantize_cli.algorithms import ALGOS
from quantize_cli.api import unpack, verify
from quantize_cli.checkpoint.examples import example_path
from tests.hostile.helpers import assert_clean_failure, invoke, tree_state

from . import algo_cells, cells, pairwise
from .algo_cells import EXCLUDE, REFERENCE_PATH, transform
from .describe import (Output, algos_in_bytes, card_rows, check_card, check_config, check_kept, check_scales, check_serve_lines,
                       check_weight_scales, expected_algos, same_files)
from .known import marks_for_options
from .reports import check_report
from .support import interrupted_after

RUN, REFUSED = algo_cells.build()
# Refusals that hold three options together (pairs alone never meet them): FP8_PER_CHANNEL_PER_TOKEN experts
# in the ModelOpt format, which vLLM's ModelOpt MoE path does not serve (a plan problem, read from the headers)
THREE_WAY = ({**algo_cells.BASE, "algo": "FP8_PER_CHANNEL_PER_TOKEN", "model": "tiny-qwen3-moe", "path": "devices"},)
REFUSED = REFUSED + [algo_cells.Cell(tuple((k, r[k]) for k in algo_cells.FACTORS)) for r in THREE_WAY]


@pytest.mark.parametrize("cell", [pytest.param(c, id=c.id) for c in REFUSED])
def test_refused_before_the_first_byte(cell, tmp_path):
    (rule,) = cell.refused  # what the converter's own checks say (algo_cells.refusals)
    named = [f for f in ("--algo", "--format", "--layout", "--exclude", "--rounding", "--smooth", "--device") if f in rule.message]
    assert len(named) >= 2, f"the refusal names {named}, not the options that refuse each other: {rule.message}"
    scales = str(tmp_path / "scales.json")
    if cell.o["path"] == "calibrate":  # the row's first command: calibrate refuses a transform's options itself
        r = invoke(*cell.calibrate_args(scales))
        if transform(cell.o):
            assert_clean_failure(r, rule.code, *rule.fragments)
            assert not os.listdir(tmp_path)
            return
        assert r.exit_code == 0, r.stderr
    before = tree_state(tmp_path)
    r = invoke(*cell.args(str(tmp_path / "out"), scales), "--report", str(tmp_path / "report.json"))
    assert_clean_failure(r, rule.code, *rule.fragments)
    after = {k: v for k, v in tree_state(tmp_path).items() if k != "report.json"}
    assert after == before, f"files appeared: {sorted(set(after) - set(before))}"


@pytest.mark.parametrize("cell", [pytest.param(c, id=c.id, marks=marks_for_options(c.o)) for c in RUN])
def test_cell(cell, tmp_path, algo_references):
    o, problems = cell.o, []
    dst, report, scales = str(tmp_path / "out"), str(tmp_path / "report.json"), str(tmp_path / "scales.json")
    if o["path"] == "calibrate":
        r = invoke(*cell.calibrate_args(scales))
        assert r.exit_code == 0, f"calibrate: {r.stderr or r.output}"
    args = [*cell.args(dst, scales), "--report", report]
    if o["path"] == "interrupted":
        # >= 2: the interrupt is raised in the journaling thread; another writer may journal one more unit first
        with interrupted_after(2) as journaled:
            first = invoke(*args)
        assert first.exit_code == 130 and not os.path.exists(dst) and (tmp_path / ".out.partial").is_dir() and journaled[0] >= 2, \
            f"interrupted run: exit {first.exit_code}, DST {os.path.exists(dst)}, {journaled[0]} journaled: {first.stderr[-300:]}"
        args.append("--resume")
    r = invoke(*args)
    folder = dst
    if o["eval"] == "fail":  # the gate refuses the run: no DST, the output kept beside it for inspection
        assert_clean_failure(r, 1, "--max-kl", f"{dst}.eval-failed")
        assert not os.path.exists(dst)
        folder = f"{dst}.eval-failed"
    else:
        assert r.exit_code == 0, f"exit {r.exit_code}: {(r.stderr or r.output)[-400:]}"
    left = [f for f in os.listdir(tmp_path) if f in (".out.partial", ".out.lock")]
    assert not left, f"left beside DST: {left}"
    if o["layout"] != "plain":  # packed: the kernel's tensors, said so; its plain form (``quantize unpack``) is checked below
        _check_packed(Output.read(folder), o, dst, problems)
        unpack(folder, str(tmp_path / "unpacked"), quiet=True)
        folder = str(tmp_path / "unpacked")
    out, fmt, model = Output.read(folder), o["format"], o["model"]
    want = expected_algos(o["algo"], None, model, EXCLUDE.get(o["exclude"]))
    if algos_in_bytes(out) != want:
        problems.append(f"bytes: per-module algorithms {sorted(set(algos_in_bytes(out).items()) ^ set(want.items()))[:4]} differ from the options'")
    check_weight_scales(out, fmt, model, problems)
    check_kept(out, fmt, model, problems)
    check_config(out, fmt, False, "plain", False, problems, source=model)
    check_scales(out, fmt, want, None, None, False, problems)  # no static input scale, no KV scale
    words = " ".join((["GPTQ"] if o["rounding"] == "gptq" else []) + ([o["smooth"]] if o["smooth"] != "none" else []))
    # the card is written before --eval: DST.eval-failed (a failed gate) has it too
    check_card(out, fmt, False, "plain", False, cell.card_flags(scales), problems, transform=words or None)
    if o["layout"] == "plain":
        check_serve_lines(out.card, dst, False, "plain", problems)
    doc = json.load(open(report))
    as_first = {**o, "kv": "none", "scale_search": "none", "algo_for": "none", "verify": "off", "push": "off",
                "calibration": "act-scales" if o["path"] == "calibrate" else "calib-data"}  # the first array's names (reports.py)
    check_report(doc, out, as_first, fmt, "error" if o["eval"] == "fail" else "ok", problems)
    _check_report_options(doc.get("options") or {}, o, problems)
    _check_eval(doc.get("eval"), out, o, problems)
    same_files(folder, algo_references.of(cell), problems)  # the same bytes by another path
    _verify_source(folder, model, o, problems)
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems)


def _check_packed(packed: Output, o: dict, dst: str, problems: list) -> None:
    """A packed output: its tensors in the asked layout (every algorithm here packs), config.json and the card say so,
    and the card's serve lines say to unpack it first."""
    layout = o["layout"]
    suffixed = [n for n in packed.tensors if n.endswith(f"_{layout}")]
    said = ((packed.config.get("quantization_config") or {}).get("layout") or {}).get("name")
    if not suffixed or said != layout:
        problems.append(f"layout: {len(suffixed)} {layout} tensor(s), config.json layout {said!r}, asked --layout {layout}")
    if packed.card:
        if (card_rows(packed.card).get("layout") or [""])[0].split(" ")[0] != layout:
            problems.append(f"card: layout row {card_rows(packed.card).get('layout')} for --layout {layout}")
        check_serve_lines(packed.card, dst, False, layout, problems)


def _check_report_options(opts: dict, o: dict, problems: list) -> None:
    """The report records the transform and the exclusion as asked, and the transform's inputs (``weights``)."""
    want = {"rounding": o["rounding"], "smooth": o["smooth"], "exclude": [EXCLUDE[o["exclude"]]] if o["exclude"] != "none" else [],
            "weights": transform(o)}
    got = {"rounding": opts.get("rounding"), "smooth": opts.get("smooth"), "exclude": opts.get("exclude"),
           "weights": opts.get("weights") is not None}  # the stage's identity, or the digest of --act-scales' weights
    if got != want:
        problems.append(f"report: options {got}, the run used {want}")


def _check_eval(ev, out: Output, o: dict, problems: list) -> None:
    """``--eval``'s result in the report: present exactly with --eval, its gate's verdict, and the checkpoint it
    measured as the bytes hold it (the algorithm and count of every quantized Linear)."""
    if o["eval"] == "off":
        if ev is not None:
            problems.append(f"report: an eval entry without --eval: {str(ev)[:80]}")
        return
    if not isinstance(ev, dict):
        problems.append(f"report: no eval entry with --eval and a gate that {o['eval']}s: {ev!r}")
        return
    gates = ev.get("gates") or []
    passed = o["eval"] == "pass"
    if ev.get("ok") is not passed or [(g.get("option"), g.get("ok")) for g in gates] != [("--max-kl", passed)]:
        problems.append(f"report: eval ok {ev.get('ok')!r}, gates {gates}, the gate should {o['eval']}")
    served = Counter({s.get("algo"): s.get("count") for s in (ev.get("checkpoint") or {}).get("served", [])})
    in_bytes = Counter(algos_in_bytes(out).values())
    if served != in_bytes:
        problems.append(f"report: eval measured {dict(served)}, the bytes hold {dict(in_bytes)}")
    data = ev.get("data") or {}
    if (data.get("samples"), data.get("seq_len")) != (2, 16) or not (ev.get("metrics") or {}).get("positions"):
        problems.append(f"report: eval data {data.get('samples')} x {data.get('seq_len')}, positions {(ev.get('metrics') or {}).get('positions')}")


def _verify_source(folder: str, model: str, o: dict, problems: list) -> None:
    """``verify --source`` passes. Weights chosen against the calibration data differ from the source's by design:
    verify says so (its note) and holds GPTQ's weights to no SQNR floor, compares no smoothed weight."""
    try:
        res = verify(folder, source=example_path(model), quiet=True)
    except Exception as exc:  # noqa: BLE001 - CheckFailed: the findings are in the message
        problems.append(f"verify --source: {exc}")
        return
    if res.errors or (not res.errors_by_tensor and o["smooth"] == "none") or (res.errors_by_tensor and o["smooth"] != "none"):
        problems.append(f"verify --source: {len(res.errors)} error(s), {len(res.errors_by_tensor)} tensor(s) compared (--smooth {o['smooth']})")
    if transform(o) != bool(res.source_note):
        problems.append(f"verify --source: note {res.source_note!r} on weights made with --rounding {o['rounding']} --smooth {o['smooth']}")


def test_the_second_array_covers_every_pair_and_every_algorithm_is_in_one_array():
    """Every pair of the second array's values is in a cell (running, or refused by the converter's checks), and
    the two arrays together hold every algorithm of ALGORITHMS."""
    assert not pairwise.uncovered(algo_cells.FACTORS, [c.o for c in RUN + REFUSED])
    assert all(not c.refused for c in RUN) and all(len(c.refused) == 1 for c in REFUSED)
    assert set(algo_cells.FACTORS["algo"]) | set(cells.FACTORS["algo"]) == set(ALGOS)
    for factor, value in (("rounding", "gptq"), ("smooth", "awq"), ("exclude", "attn0"), ("model", "tiny-qwen3-moe")):
        assert any(c.o[factor] == value and c.o["eval"] != "fail" for c in RUN), f"no cell writes DST with {factor}={value}"


def test_no_cell_of_the_second_array_is_compared_with_its_own_command():
    """Each cell's path differs from its reference's (``--calib-data`` in one fresh run on one device): calibrate
    then ``--act-scales`` and two devices are other command lines; an interrupted cell is the reference's command
    (with ``--layout`` where packed: compared after unpack) stopped after two journaled tasks and resumed."""
    for c in RUN:
        assert c.o["path"] in ("calibrate", "interrupted", "devices") and c.o["path"] != REFERENCE_PATH
        mine = c.args("DST", "S.json")
        mine = mine[: mine.index("--eval-samples")] if "--eval" in mine else mine
        ref = c.args("DST", "S.json", path=REFERENCE_PATH)
        assert (mine == ref) == (c.o["path"] == "interrupted" and c.o["layout"] == "plain"), c.id  # packed: + --layout


def test_the_second_array_runs_in_minutes():
    """Guard on its size: each running cell converts a tiny example two or three times (~3 s on 2 cores)."""
    assert len(RUN) <= 22 and len(REFUSED) <= 4, (len(RUN), len(REFUSED))
