"""Issue 35: GPTQ (``--rounding gptq``) and smoothing (``--smooth``) inside the one run lifecycle.

Each test reproduces one of the issue's items with the embedded examples and a tiny calibration
(`CAL`), as the issue did on the CPU."""

from __future__ import annotations

import glob
import os

import pytest
from click.testing import CliRunner
from safetensors import safe_open

from quantize_cli.cli import main
from tests.test_resume import interrupt_after

CAL = ["--calib-data", "default", "--calib-samples", "4", "--calib-seq-len", "32", "--device", "cpu"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _input_scales(dst) -> dict[str, float]:
    out = {}
    for path in glob.glob(os.path.join(dst, "*.safetensors")):
        with safe_open(path, "pt") as f:
            out.update({k: float(f.get_tensor(k).float().max()) for k in f.keys() if k.endswith(".input_scale")})
    return out


def test_item1_gptq_with_algo_for_keeps_the_rules_calibrated_input_scales(tmp_path):
    """Item 1: --rounding gptq + --algo-for '*mlp*=NVFP4' (static input scales) under a W4A16_NVFP4
    --algo: the mlp input_scales are calibrated (as without --rounding gptq), not the constant 1/6."""
    args = ["--algo", "W4A16_NVFP4", "--algo-for", "*mlp*=NVFP4", *CAL, "-q"]
    plain = invoke("convert", "example:tiny-llama", "-o", tmp_path / "plain", *args)
    assert plain.exit_code == 0, plain.output
    gptq = invoke("convert", "example:tiny-llama", "-o", tmp_path / "gptq", *args, "--rounding", "gptq")
    assert gptq.exit_code == 0, gptq.output
    want, got = _input_scales(tmp_path / "plain"), _input_scales(tmp_path / "gptq")
    assert want and set(got) == set(want) and all("mlp" in k for k in got)
    assert all(abs(v - 1 / 6) > 1e-4 for v in got.values()), got  # not the uncalibrated constant 1/6
    assert all(v < 0.01 for v in got.values()), got  # calibrated amax of the tiny model: ~1e-3
    assert "no calibration data" not in gptq.output


def test_item18_no_clock_times_in_hf_quant_config_and_a_finished_calibrated_output_resumes(tmp_path):
    """Item 18: two identical calibrated runs write identical hf_quant_config.json (the calibration's
    seconds go to the report only), and --resume of the finished output exits 0."""
    import json

    args = ["--algo", "FP8", *CAL, "-q"]
    for name in ("a", "b"):
        r = invoke("convert", "example:tiny-llama", "-o", tmp_path / name, *args, "--report", tmp_path / f"{name}.json")
        assert r.exit_code == 0, r.output
    config = [(tmp_path / n / "hf_quant_config.json").read_bytes() for n in ("a", "b")]
    assert b"seconds" not in config[0]
    assert config[0] == config[1]
    report = json.loads((tmp_path / "a.json").read_text())
    assert "forward_seconds" in json.dumps(report)  # the timing is kept, in the report
    again = invoke("convert", "example:tiny-llama", "-o", tmp_path / "a", *args, "--resume")
    assert again.exit_code == 0, again.output


@pytest.fixture(scope="module")
def gptq_scales(tmp_path_factory):
    """S.json (and S.weights/) made by `calibrate --rounding gptq --algo W4A16_NVFP4` on example:tiny-llama."""
    path = tmp_path_factory.mktemp("gptq-scales") / "S.json"
    r = invoke("calibrate", "example:tiny-llama", "-o", path, "--rounding", "gptq", "--algo", "W4A16_NVFP4", *CAL, "-q")
    assert r.exit_code == 0, r.output
    return path


def test_item10_gptq_act_scales_without_rounding_gptq_is_refused_naming_the_option(gptq_scales, tmp_path):
    """Item 10: --act-scales from a GPTQ calibrate, converted without --rounding gptq: refused (not
    "ignored" with the GPTQ weights dropped), naming --rounding gptq."""
    r = invoke("convert", "example:tiny-llama", "-o", tmp_path / "out", "--algo", "W4A16_NVFP4", "--act-scales", gptq_scales, "-q")
    assert r.exit_code == 2, r.output
    assert "--rounding gptq" in r.output and str(gptq_scales) in r.output and "ignored" not in r.output
    assert not (tmp_path / "out").exists()


def test_item11_smooth_mismatch_names_smooth_and_both_values(gptq_scales, tmp_path):
    """Item 11: the same file with --rounding gptq --smooth awq: refused naming --smooth, none and awq."""
    r = invoke("convert", "example:tiny-llama", "-o", tmp_path / "out", "--algo", "W4A16_NVFP4", "--act-scales", gptq_scales,
               "--rounding", "gptq", "--smooth", "awq", "-q")
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert '--smooth "none", this conversion has "awq"' in text, text
    assert "--rounding" not in text.split("made with")[1].split(";")[0]  # rounding agrees: not named as a difference


def test_item7_verify_on_a_finished_resume_checks_as_the_fresh_run_did(tmp_path):
    """Item 7: --verify of a finished GPTQ compressed-tensors output on --resume reports the same check
    as the fresh run: compared with the source (without the round-to-nearest floors), the method given
    to the verifier by convert in both (session 10; before, neither compared: the card that records the
    rounding is written after --verify)."""
    args = ["convert", "example:tiny-llama", "-o", tmp_path / "out", "--algo", "W4A16_NVFP4", "--format", "compressed-tensors",
            "--rounding", "gptq", "--verify", *CAL]
    lines = []
    for extra in ([], ["--resume"]):
        r = invoke(*args, *extra)
        assert r.exit_code == 0, r.output
        lines.append([line for line in r.output.splitlines() if line.startswith("verify:")])
    assert lines[1] and lines[1] == lines[0], lines
    assert "median SQNR" in lines[1][0], lines


def test_item8_a_compressed_tensors_output_without_its_seal_is_not_accepted_as_complete(tmp_path):
    """Item 8: without .quantize-checksums, a calibrated compressed-tensors output (whose config records
    no calibration) resumed without the calibration is refused naming the seal and --overwrite."""
    dst = tmp_path / "out"
    made = invoke("convert", "example:tiny-llama", "-o", dst, "--algo", "FP8", "--format", "compressed-tensors", *CAL, "-q")
    assert made.exit_code == 0, made.output
    os.unlink(dst / ".quantize-checksums")
    r = invoke("convert", "example:tiny-llama", "-o", dst, "--algo", "FP8", "--format", "compressed-tensors", "--resume")
    assert r.exit_code == 1, r.output
    text = " ".join(r.output.split())
    assert ".quantize-checksums" in text and "--overwrite" in text and "already complete" not in text


# --- items 2, 3, 5, 12, 13: the GPTQ / smoothing stage inside the work folder (calibration/stage.py) ---

def _ids_file(path, shift: int = 0) -> str:
    """A calibration .jsonl of token ids (example:tiny-llama's vocabulary is 512); `shift` changes its content."""
    import json

    rows = [[(7 * i + j + shift) % 500 + 1 for j in range(24)] for i in range(4)]
    path.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in rows))
    return str(path)


def _api(dst, data, **kw):
    from quantize_cli import api
    from quantize_cli.plan.options import ConvertOptions

    opts = dict(algo="W4A16_NVFP4", calib_data=str(data), calib_samples=4, calib_seq_len=24, device="cpu", quiet=True,
                rounding="gptq")
    opts.update(kw)
    return api.convert(ConvertOptions("example:tiny-llama", str(dst), **opts))


def _shards(folder) -> dict[str, bytes]:
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder)) if n.endswith(".safetensors")}


def _hidden_beside(folder) -> list[str]:
    """What a run leaves beside DST but the lock file (.NAME.lock, kept: flock needs a stable inode)."""
    return sorted(n for n in os.listdir(folder.parent) if n.startswith(".") and not n.endswith(".lock"))


def _count_forwards(monkeypatch) -> list:
    """Every calibration forward run from here on (weights_entry.run), as a list that grows."""
    from quantize_cli.calibration import weights_entry

    calls, real = [], weights_entry.run

    def run(*a, **kw):
        calls.append(a[-1] if a else None)
        return real(*a, **kw)

    monkeypatch.setattr(weights_entry, "run", run)
    return calls


@pytest.mark.parametrize("extra", [["--rounding", "gptq"], ["--smooth", "awq"]])
def test_item2_resume_of_a_finished_gptq_or_smooth_output_runs_no_forward_and_leaves_nothing(tmp_path, monkeypatch, extra):
    """Item 2: --resume of a finished --smooth (was exit 1, "source files that changed") or GPTQ (was a
    whole forward again) output: exit 0 "already complete", no forward, nothing left beside DST."""
    dst = tmp_path / "out"
    args = ["convert", "example:tiny-llama", "-o", dst, "--algo", "W4A16_NVFP4", *CAL, *extra]
    made = invoke(*args, "-q")
    assert made.exit_code == 0, made.output
    before = _shards(dst)
    forwards = _count_forwards(monkeypatch)
    again = invoke(*args, "--resume")
    assert again.exit_code == 0, again.output
    assert "already complete" in again.output and not forwards, again.output
    assert _shards(dst) == before and _hidden_beside(dst) == []


def test_item3_and_13_a_gptq_resume_after_the_data_changed_is_refused_and_after_it_was_restored_continues(tmp_path, monkeypatch):
    """Item 3: an interrupted GPTQ run, the calibration file's content replaced, --resume: refused naming
    the weights' calibration tokens (it reused the old weights: wrong bytes). Item 13: the content
    restored, --resume continues with the interrupted run's weights (no second forward) to the bytes
    of an uninterrupted run (it exited 1: the weights were matched by the file's path)."""
    from quantize_cli.errors import DestinationError

    data = tmp_path / "calib.jsonl"
    _ids_file(data)
    fresh = _api(tmp_path / "fresh", data)
    interrupt_after(monkeypatch, 4)  # tests/test_resume.py's: the writer stops at the 4th task
    with pytest.raises(KeyboardInterrupt):
        _api(tmp_path / "out", data)
    monkeypatch.undo()
    stage_dir = tmp_path / ".out.partial" / ".weights"
    assert len(os.listdir(stage_dir)) == 1, "the stage's weights live in the work folder, one key"
    _ids_file(data, shift=3)
    with pytest.raises(DestinationError) as refused:
        _api(tmp_path / "out", data, resume=True)
    assert "calibration data whose token ids hash to" in refused.value.message and "nothing was changed" in refused.value.message
    _ids_file(data)
    forwards = _count_forwards(monkeypatch)
    _api(tmp_path / "out", data, resume=True)
    assert not forwards, "the interrupted run's weights were reused"
    assert _shards(tmp_path / "out") == _shards(fresh.dst)


def test_item3_the_same_tokens_from_another_path_are_the_same_weights(tmp_path, monkeypatch):
    """Content addressing: the same token ids read from a renamed file resume the interrupted run."""
    first, renamed = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _ids_file(first)
    _ids_file(renamed)
    interrupt_after(monkeypatch, 4)  # tests/test_resume.py's: the writer stops at the 4th task
    with pytest.raises(KeyboardInterrupt):
        _api(tmp_path / "out", first)
    monkeypatch.undo()
    forwards = _count_forwards(monkeypatch)
    _api(tmp_path / "out", renamed, resume=True)
    assert not forwards


def test_item5_a_second_run_to_the_same_dst_is_refused_before_its_forward(tmp_path, monkeypatch):
    """Item 5: while a GPTQ run is in its forward, a second run to the same -o is refused by DST's lock
    before it writes anything (it rewrote `.DST.weights` under the first); the first's bytes equal a
    run alone."""
    from quantize_cli.calibration import stage
    from quantize_cli.errors import DestinationError

    data = tmp_path / "calib.jsonl"
    _ids_file(data)
    alone = _api(tmp_path / "alone", data)
    real, seen = stage.produce, {}

    def produce(*a, **kw):
        with pytest.raises(DestinationError) as second:
            _api(tmp_path / "out", data)
        seen["error"] = second.value.message
        seen["listing"] = sorted(os.listdir(tmp_path))
        return real(*a, **kw)

    monkeypatch.setattr(stage, "produce", produce)
    _api(tmp_path / "out", data)
    assert "another" in seen["error"].lower() or "lock" in seen["error"].lower(), seen["error"]
    assert ".out.weights" not in seen["listing"]
    assert _shards(tmp_path / "out") == _shards(alone.dst)


def test_item12_resume_with_another_smooth_is_refused_before_any_forward(tmp_path, monkeypatch):
    """Item 12: after an interrupted GPTQ run, --resume --smooth awq (or another --scale-search) is
    refused naming the option before any forward, and the interrupted run's weights are untouched."""
    from quantize_cli.errors import DestinationError

    data = tmp_path / "calib.jsonl"
    _ids_file(data)
    interrupt_after(monkeypatch, 4)  # tests/test_resume.py's: the writer stops at the 4th task
    with pytest.raises(KeyboardInterrupt):
        _api(tmp_path / "out", data)
    monkeypatch.undo()
    stage_dir = tmp_path / ".out.partial" / ".weights"
    files = {str(p): (p.stat().st_mtime_ns, p.read_bytes()) for p in stage_dir.rglob("*") if p.is_file()}
    forwards = _count_forwards(monkeypatch)
    for extra in ({"smooth": "awq"}, {"scale_search": "mse"}):
        with pytest.raises(DestinationError) as refused:
            _api(tmp_path / "out", data, resume=True, **extra)
        flag = "--smooth" if "smooth" in extra else "--scale-search"
        assert flag in refused.value.message, refused.value.message
    assert not forwards
    assert {str(p): (p.stat().st_mtime_ns, p.read_bytes()) for p in stage_dir.rglob("*") if p.is_file()} == files


def test_an_interruption_inside_the_forward_is_redone_on_resume(tmp_path, monkeypatch):
    """Interrupted while the stage writes its blocks: the unfinished weights (no index) are computed
    again on --resume, and the output equals an uninterrupted run's."""
    from quantize_cli.calibration import weights_file

    data = tmp_path / "calib.jsonl"
    _ids_file(data)
    fresh = _api(tmp_path / "fresh", data)
    real, calls = weights_file.WeightsWriter.flush, {"n": 0}

    def flush(self):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(weights_file.WeightsWriter, "flush", flush)
    with pytest.raises(KeyboardInterrupt):
        _api(tmp_path / "out", data)
    monkeypatch.setattr(weights_file.WeightsWriter, "flush", real)
    forwards = _count_forwards(monkeypatch)
    _api(tmp_path / "out", data, resume=True)
    assert len(forwards) == 1
    assert _shards(tmp_path / "out") == _shards(fresh.dst) and _hidden_beside(tmp_path / "out") == []


def test_a_resume_refusal_names_the_part_of_the_gptq_request_that_differs():
    """The identity keeps the stage's request: a GPTQ output made on a GPU and retried on the CPU is
    refused naming the device type (GPU and CPU arithmetic differ), not two opaque digests."""
    from quantize_cli.calibration.stage import differences

    request = {"method": {"rounding": "gptq", "smooth": "none"}, "algo": "NVFP4", "format": "modelopt", "scale_search": "none",
               "targets_sha256": "t", "device": "cuda", "source": {"layout_sha256": "s"}, "data": {"ids_sha256": "d"},
               "converter": "0.1.0+numerics.2"}
    made = {"data_sha256": "d", "request_sha256": "k1", "request": request}
    want = {"data_sha256": "d", "request_sha256": "k2", "request": {**request, "device": "cpu"}}
    said = differences(made, want)
    assert "the device type" in said and '"cuda", this conversion has "cpu"' in said, said
    assert "token ids" in differences(made, {**want, "data_sha256": "e"})
