"""The matrix's special scenarios (scenarios.py): ``--resume`` after a change of the calibration data, of
a byte-deciding option or of the converter's byte-deciding version, and two runs at once to the same
``-o``; each plain and with GPTQ (a side folder made in a calibration forward).

A resume across a change is refused before anything is written (exit 1, one line naming what changed,
the work folder untouched), never finished with mixed bytes; a GPTQ resume is refused before any
calibration forward. A second run to the same ``-o`` while the first is writing is refused by DST's
lock and touches nothing of the first, whose output equals a run alone. Known failures: known.py.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests.conftest import output_files
from tests.hostile.helpers import invoke

from .known import marks_for_options
from .scenarios import SCENARIOS, scenario_id
from .support import CALIB, forward_calls, interrupted_after, numerics_bumped, side_files


def _params():
    return [pytest.param(o, id=scenario_id(o), marks=marks_for_options(o)) for o in SCENARIOS]


def _args(o: dict, dst, data: str, *extra) -> list:
    """FP8 on example:tiny-llama calibrated on `data` (2 samples of 16 tokens), in small shards."""
    gptq = ["--rounding", "gptq"] if o["rounding"] == "gptq" else []
    gptq += ["--smooth", o["smooth"]] if o.get("smooth", "none") != "none" else []
    return ["convert", "example:tiny-llama", "-o", str(dst), "--algo", o["algo"], "--device", "cpu", "-q", "--max-shard-size", "100KB",
            "--calib-data", data, "--calib-samples", "2", "--calib-seq-len", "16", *gptq, *extra]


def _data(tmp_path) -> str:
    path = str(tmp_path / "calib.jsonl")
    shutil.copy(CALIB, path)
    return path


def _files(root) -> dict:
    """Every file under `root` with its size and mtime: what a refused resume must leave as it was."""
    out = {}
    for folder, _, files in os.walk(root):
        for f in files:
            st = os.stat(os.path.join(folder, f))
            out[os.path.join(folder, f)] = (st.st_size, st.st_mtime_ns)
    return out


def _interrupted(o: dict, dst, data: str) -> None:
    with interrupted_after(2):
        first = invoke(*_args(o, dst, data))
    assert first.exit_code == 130 and not os.path.exists(dst), f"exit {first.exit_code}: {first.stderr[-300:]}"


def _refused_resume(o: dict, tmp_path, change, *extra, names: tuple) -> None:
    """Interrupt a run, apply `change`, resume: refused (exit 1, one error line naming `names`), no forward,
    nothing under tmp_path touched, no DST."""
    dst, data = tmp_path / "out", _data(tmp_path)
    _interrupted(o, dst, data)
    with change(data):
        before = _files(tmp_path)
        with forward_calls() as forwards:
            r = invoke(*_args(o, dst, data, "--resume", *extra))
        after = _files(tmp_path)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.exit_code == 1, f"--resume after the change: exit {r.exit_code} (0: finished with bytes of two inputs): {r.stderr[-300:]}"
    assert len(errors) == 1 and all(n in errors[0] for n in names), f"want one error line naming {names}: {r.stderr[-400:]}"
    assert forwards[0] == 0, f"refused only after {forwards[0]} calibration forward(s)"
    assert after == before and not os.path.exists(dst), f"changed: {sorted(set(after) ^ set(before)) or 'mtimes'}"


class _Rewritten:
    """The calibration file with other token ids (its first sample dropped): other data, same path."""

    def __init__(self, data):
        lines = open(data).read().splitlines()
        open(data, "w").write("\n".join(lines[1:] + lines[:1]) + "\n")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Unchanged:
    def __init__(self, data):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("o", [p for p in _params() if p.values[0]["scenario"] == "changed-data"])
def test_resume_after_the_calibration_data_changed_is_refused(o, tmp_path):
    _refused_resume(o, tmp_path, _Rewritten, names=("--calib-data",))


@pytest.mark.parametrize("o", [p for p in _params() if p.values[0]["scenario"] == "changed-option"])
def test_resume_with_another_option_is_refused_naming_it(o, tmp_path):
    _refused_resume(o, tmp_path, _Unchanged, "--scale-search", "mse", names=("--scale-search", "none", "mse"))


@pytest.mark.parametrize("o", [p for p in _params() if p.values[0]["scenario"] == "changed-version"])
def test_resume_across_a_numerics_version_is_refused(o, tmp_path):
    import quantize_cli

    old = quantize_cli.CONVERTER
    bumped = lambda data: numerics_bumped()  # noqa: E731 - the change: this process is the next version
    _refused_resume(o, tmp_path, bumped, names=(old, f"numerics.{quantize_cli.NUMERICS_VERSION + 1}"))


@pytest.mark.parametrize("o", [p for p in _params() if p.values[0]["scenario"] == "two-runs"])
def test_a_second_run_to_the_same_output_is_refused_and_the_first_is_unaffected(o, tmp_path):
    from quantize_cli.output import journal

    dst, data = tmp_path / "out", _data(tmp_path)
    real, second = journal.Journal.append, []

    def append(self, *args, **kwargs):  # the first run has journaled a task: it holds the lock, mid-write
        real(self, *args, **kwargs)
        if not second:
            second.append(None)  # once: the second run's own journal (if it got that far) calls this too
            before = side_files(str(tmp_path))
            second[0] = invoke(*_args(o, dst, data)), before, side_files(str(tmp_path))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(journal.Journal, "append", append)
        first = invoke(*_args(o, dst, data))
    ((r, before, after),) = second
    assert r.exit_code == 1 and "another quantize run is writing it" in r.stderr, f"second run: exit {r.exit_code}: {r.stderr[-300:]}"
    assert after == before, f"the second run rewrote the first's side folder: {sorted(f for f in after if after[f] != before.get(f))[:3]}"
    assert first.exit_code == 0, f"first run: exit {first.exit_code}: {first.stderr[-300:]}"
    alone = invoke(*_args(o, tmp_path / "alone", data))
    assert alone.exit_code == 0, alone.stderr[-300:]
    assert output_files(dst) == output_files(tmp_path / "alone"), "the first run's bytes differ from the same run alone"


@pytest.mark.parametrize("o", [p for p in _params() if p.values[0]["scenario"] == "finished"])
def test_resume_of_a_finished_output_needs_no_forward_and_leaves_nothing_behind(o, tmp_path):
    dst, data = tmp_path / "out", _data(tmp_path)
    first = invoke(*_args(o, dst, data))
    assert first.exit_code == 0, f"first run: exit {first.exit_code}: {first.stderr[-300:]}"
    before = _files(dst)
    with forward_calls() as forwards:
        r = invoke(*_args(o, dst, data, "--resume"))
    assert r.exit_code == 0, f"--resume of the finished output: exit {r.exit_code}: {r.stderr[-300:]}"
    assert forwards[0] == 0, f"--resume of a finished output ran {forwards[0]} calibration forward(s)"
    assert _files(dst) == before, "--resume of a finished output rewrote DST"
    assert sorted(os.listdir(tmp_path)) == ["calib.jsonl", "out"], f"left beside DST: {sorted(os.listdir(tmp_path))}"
