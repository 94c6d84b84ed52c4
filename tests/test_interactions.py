"""Where two features meet (issue 23): each defect of the issue reproduced as it describes it, through the
command line and the files written, plus the defects the feature-interaction matrix found (M1-M3,
tests/matrix/known.py).

Each was written first as a strict xfail naming its defect and failed; the redesign fixed them all,
so none is marked now: a regression fails here. The source is ``example:tiny-llama``; SCALES.json is made once per session
(``example_scales``, tests/conftest.py)."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from tests.conftest import load_all, output_files
from tests.hostile.helpers import assert_clean_failure, invoke, tree_state
from tests.matrix.support import fake_hub, interrupted_after, local_ray

EX = "example:tiny-llama"
SHARD = "100KB"  # small output shards: fused groups straddle them
CPU = ("--device", "cpu")


@pytest.fixture(scope="module")
def ray_cluster():
    with local_ray() as ray:
        yield ray


@pytest.fixture
def hub(tmp_path):
    with fake_hub(str(tmp_path)) as server:
        yield server


def ok(*args):
    r = invoke(*args)
    assert r.exit_code == 0, f"exit {r.exit_code}: {r.stderr or r.output}"
    return r


def public_files(folder) -> dict[str, bytes]:
    return {f: open(os.path.join(folder, f), "rb").read() for f in os.listdir(folder)
            if not f.startswith(".") and os.path.isfile(os.path.join(folder, f))}


def f32_over(amax: float, by: float) -> float:
    """ModelOpt's static scale: fp32(amax) / by, divided in fp32 (design.md §4.5)."""
    return float(torch.tensor(amax, dtype=torch.float32) / torch.tensor(by, dtype=torch.float32))


def card_section(card: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |^<!--)", card, re.S | re.M)
    return m.group(1).strip() if m else ""


# -- 1: Ray and mixed precision ------------------------------------------------------------------------------
def test_ray_mixed_precision_shares_the_nvfp4_global_scale_across_shards(ray_cluster, tmp_path):
    args = ("--algo", "FP8_PB_WO", "--algo-for", "*mlp*=NVFP4", "--max-shard-size", SHARD, *CPU, "-q")
    ok("convert", EX, "-o", tmp_path / "local", *args)
    ok("convert", EX, "-o", tmp_path / "ray", *args, "--executor", "ray")
    index = json.load(open(tmp_path / "ray" / "model.safetensors.index.json"))["weight_map"]
    mlp = [f"model.layers.{i}.mlp" for i in (0, 1)]
    assert any(index[f"{p}.gate_proj.weight"] != index[f"{p}.up_proj.weight"] for p in mlp)  # a group straddles shards
    t = load_all(tmp_path / "ray")
    for p in mlp:
        gate, up = t[f"{p}.gate_proj.weight_scale_2"], t[f"{p}.up_proj.weight_scale_2"]
        assert torch.equal(gate, up), f"{p}: gate {gate.item():.3g} / up {up.item():.3g} (vLLM keeps the max)"
    assert output_files(tmp_path / "ray") == output_files(tmp_path / "local")


# -- 2: --resume and --format ---------------------------------------------------------------------------------
def test_resume_refuses_to_continue_in_another_format(tmp_path):
    out = tmp_path / "out"
    base = ("convert", EX, "-o", out, "--algo", "MXFP8", *CPU, "-q")
    with interrupted_after(8):
        assert invoke(*base, "--format", "compressed-tensors").exit_code == 130
    r = invoke(*base, "--resume")  # --format left out: modelopt
    assert r.exit_code == 1 and "--format" in r.stderr, f"exit {r.exit_code}: {r.stderr}"
    assert not out.exists()


# -- 3: calibration with mixed precision and KV ---------------------------------------------------------------
def test_mixed_precision_takes_the_calibrated_input_scales(tmp_path, example_scales):
    path, amax, _ = example_scales
    r = ok("convert", EX, "-o", tmp_path / "out", "--algo", "FP8_PB_WO", "--algo-for", "*mlp*=NVFP4", "--act-scales", path, *CPU)
    t = load_all(tmp_path / "out")
    for i in (0, 1):
        p = f"model.layers.{i}.mlp"
        gate_up = max(amax[f"{p}.gate_proj"], amax[f"{p}.up_proj"])  # a fused group shares one input scale
        want = {"gate_proj": f32_over(gate_up, 2688), "up_proj": f32_over(gate_up, 2688), "down_proj": f32_over(amax[f"{p}.down_proj"], 2688)}
        got = {m: t[f"{p}.{m}.input_scale"].item() for m in want}
        assert got == want, f"{p}: {got} != calibrated {want}"
    assert not ("--act-scales is ignored" in r.stderr and "no calibration data was given" in r.stderr), r.stderr


def test_calibrated_kv_scales_are_written_with_a_dynamic_algo(tmp_path, example_scales):
    path, _, kv = example_scales
    ok("convert", EX, "-o", tmp_path / "out", "--algo", "FP8_PB_WO", "--kv-cache-dtype", "fp8", "--act-scales", path, *CPU, "-q")
    t = load_all(tmp_path / "out")
    got = {n: v.item() for n, v in t.items() if n.endswith(("k_scale", "v_scale"))}
    want = {f"{a}.k_proj.k_scale": f32_over(e["k_amax"], 448) for a, e in kv.items()}
    want |= {f"{a}.v_proj.v_scale": f32_over(e["v_amax"], 448) for a, e in kv.items()}
    assert got == want


def test_report_gives_each_module_its_own_input_scale(tmp_path, example_scales):
    report = tmp_path / "report.json"
    ok("convert", EX, "-o", tmp_path / "out", "--algo", "FP8", "--algo-for", "*mlp*=NVFP4", "--act-scales", example_scales[0],
       "--report", report, *CPU, "-q")
    t = load_all(tmp_path / "out")
    per = json.load(open(report))["calibration"]["per_module"]
    written = {n.rpartition(".")[0]: v.item() for n, v in t.items() if n.endswith(".input_scale")}
    assert len(written) == 14
    wrong = {m: (per[m]["input_scale"], v) for m, v in written.items() if per[m]["input_scale"] != v}
    assert not wrong, f"report vs bytes: {dict(list(wrong.items())[:2])}"


# -- 4: follow-ups after "already complete" -------------------------------------------------------------------
def test_resume_of_a_finished_output_still_pushes(hub, tmp_path):
    out, report = tmp_path / "out", tmp_path / "report.json"
    cmd = ("convert", EX, "-o", out, "--algo", "FP8_PB_WO", *CPU, "-q", "--push-to-hub", "me/tiny", "--report", report)
    hub.commit_status = 503  # the access check passes, then the Hub fails the first push's commit
    first = invoke(*cmd)
    assert first.exit_code == 1 and "503" in first.stderr and out.is_dir(), first.stderr  # converted, not pushed
    assert "me/tiny" not in hub.repos or not hub.files("me/tiny")
    hub.commit_status = None
    ok(*cmd, "--resume")
    assert "me/tiny" in hub.repos and hub.files("me/tiny") == public_files(out)
    assert json.load(open(report)).get("publish", {}).get("status") == "ok"


def test_resume_of_a_finished_output_still_verifies(tmp_path):
    out, report = tmp_path / "out", tmp_path / "report.json"
    cmd = ("convert", EX, "-o", out, "--algo", "NVFP4", *CPU, "-q")
    ok(*cmd)
    ok(*cmd, "--resume", "--verify", "--report", report)
    doc = json.load(open(report))
    assert doc["status"] == "already-complete"
    assert isinstance(doc.get("verify"), dict) and doc["verify"]["errors"] == 0, doc.get("verify")


# -- 5: the card a push rewrites ------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", [("--format", "compressed-tensors", "--algo", "FP8"), ("--algo", "FP8_PB_WO", "--algo-for", "*mlp*=NVFP4")],
                         ids=["compressed-tensors", "mixed-precision"])
def test_a_pushed_card_still_says_how_to_serve_it(hub, tmp_path, algo):
    ok("convert", EX, "-o", tmp_path / "out", *algo, "--kv-cache-dtype", "fp8", *CPU, "-q", "--push-to-hub", "me/tiny")
    card = hub.files("me/tiny")["README.md"].decode()
    serve = re.search(r"## Serve it\s+```bash\n(.*?)\n```", card, re.S).group(1)
    assert "no stock loader" not in serve and "None" not in serve, serve
    assert "vllm serve me/tiny --kv-cache-dtype fp8" in serve, serve


# -- 6: durability of the documents ---------------------------------------------------------------------------
def test_compressed_tensors_files_are_fsynced_before_the_rename(tmp_path, monkeypatch):
    from tests.conftest import convert
    from tests.hostile.helpers import spy_fsync_before_publish

    at_rename = spy_fsync_before_publish(monkeypatch)
    convert(EX, str(tmp_path / "out"), algo="FP8", format="compressed-tensors", quiet=True, max_shard_size=SHARD, device="cpu")
    files = set(os.listdir(tmp_path / "out"))
    assert "config.json" in files and at_rename
    assert files <= at_rename[0], f"not fsynced before the rename: {sorted(files - at_rename[0])}"


def test_push_replaces_the_card_atomically(hub, tmp_path):
    out = tmp_path / "out"
    ok("convert", EX, "-o", out, "--algo", "FP8_PB_WO", *CPU, "-q")
    card = out / "README.md"
    before_ino, before = card.stat().st_ino, card.read_bytes()
    ok("push", out, "me/tiny", "-q")
    assert card.read_bytes() == before or card.stat().st_ino != before_ino, "README.md rewritten in place, not replaced by a rename"


# -- 7: Ray's output lifecycle --------------------------------------------------------------------------------
def test_a_finished_ray_output_is_sealed(ray_cluster, tmp_path):
    out = tmp_path / "out"
    cmd = ("convert", EX, "-o", out, "--algo", "NVFP4", "--max-shard-size", SHARD, "--executor", "ray", *CPU, "-q")
    ok(*cmd)
    shard = sorted(out.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0xFF  # a bit of tensor data, not of the header
    shard.write_bytes(bytes(data))
    r = invoke(*cmd, "--resume")
    assert r.exit_code == 1 and "differ" in r.stderr, f"exit {r.exit_code}: damaged bytes accepted as already complete: {r.stderr}"


def test_ray_refused_resume_gives_one_advice(ray_cluster, tmp_path):
    base = ("convert", EX, "-o", tmp_path / "out", "--max-shard-size", SHARD, "--executor", "ray", *CPU, "-q")
    with interrupted_after(3):
        assert invoke(*base, "--algo", "FP8_PB_WO").exit_code == 130
    r = invoke(*base, "--algo", "NVFP4", "--resume")
    assert r.exit_code == 1
    assert not ("rerun with --resume" in r.stderr and "without --resume" in r.stderr), r.stderr


# -- 8: a refused --resume ------------------------------------------------------------------------------------
@pytest.mark.parametrize("shard", ["5GB", SHARD], ids=["one-shard", "many-shards"])
def test_a_refused_resume_touches_nothing_and_names_the_option(tmp_path, shard):
    out = tmp_path / "out"
    ok("convert", EX, "-o", tmp_path / "ref", "--max-shard-size", shard, *CPU, "--algo", "FP8_PB_WO", "-q")
    base = ("convert", EX, "-o", out, "--max-shard-size", shard, *CPU)
    with interrupted_after(15):
        assert invoke(*base, "--algo", "FP8_PB_WO", "-q").exit_code == 130
    before = tree_state(tmp_path)
    r = invoke(*base, "--algo", "NVFP4", "--resume", "-q")
    assert r.exit_code == 1, r.stderr
    after = tree_state(tmp_path)
    assert after == before, f"changed by the refusal: {sorted(k for k in set(after) | set(before) if after.get(k) != before.get(k))[:5]}"
    assert_clean_failure(r, 1, "--algo", "FP8_PB_WO", "NVFP4")  # the option that differs, and its two values
    r = ok(*base, "--algo", "FP8_PB_WO", "--resume")
    assert re.search(r"resuming .*: 15 of \d+ tasks verified complete", r.stderr), r.stderr
    assert output_files(out) == output_files(tmp_path / "ref")  # no stray shard of the refused plan in DST


# -- 9: the card's calibration facts --------------------------------------------------------------------------
def test_the_card_of_a_calibrated_output_says_calibrated(tmp_path, example_scales):
    report = tmp_path / "report.json"
    ok("convert", EX, "-o", tmp_path / "out", "--algo", "FP8", "--act-scales", example_scales[0], "--report", report, *CPU, "-q")
    assert json.load(open(report))["calibration"]["calibrated"] is True
    section = card_section((tmp_path / "out" / "README.md").read_text(), "Calibration")
    assert section.startswith("Calibrated on") and "Not calibrated" not in section, section


def test_the_card_states_calibrated_kv_scales(tmp_path, example_scales):
    ok("convert", EX, "-o", tmp_path / "out", "--algo", "FP8", "--kv-cache-dtype", "fp8", "--act-scales", example_scales[0], *CPU, "-q")
    assert any(n.endswith(".k_scale") for n in load_all(tmp_path / "out"))
    row = next(ln for ln in (tmp_path / "out" / "README.md").read_text().splitlines() if ln.startswith("| KV cache |"))
    assert "no scales" not in row, row


# -- found by the matrix ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["FP8_PB_WO", "FP8"])
def test_mixed_precision_card_and_report_state_each_layers_input_scale(tmp_path, algo):
    report = tmp_path / "report.json"
    ok("convert", EX, "-o", tmp_path / "out", "--algo", algo, "--algo-for", "*mlp*=NVFP4", "--report", report, *CPU, "-q")
    in_bytes = {n.rpartition(".")[0]: v.item() for n, v in load_all(tmp_path / "out").items() if n.endswith(".input_scale")}
    # FP8 everywhere but the MLPs (constant 1), NVFP4 on the MLPs (1/6); FP8_PB_WO is dynamic: no input scale
    want = {m: 1 / 6 if ".mlp." in m else 1.0 for m in in_bytes}
    assert {m.split(".")[-1] for m in in_bytes} == ({"down_proj", "gate_proj", "up_proj"} | (
        {"q_proj", "k_proj", "v_proj", "o_proj"} if algo == "FP8" else set())), sorted(in_bytes)
    assert all(abs(in_bytes[m] - want[m]) < 1e-7 for m in in_bytes), in_bytes
    section = card_section((tmp_path / "out" / "README.md").read_text(), "Calibration")
    stated = ("Not calibrated: the `input_scale` of each layer is its algorithm's constant, 1 (FP8) or 0.166667 (NVFP4), "
              if algo == "FP8" else "Not calibrated: every `input_scale` is 0.166667, ")
    assert section.startswith(stated + "the calibration-free constant ModelOpt writes"), section
    cal = json.load(open(report))["calibration"]
    assert cal["calibrated"] is False
    assert cal["input_scale"] == ({"FP8": 1.0, "NVFP4": 1 / 6} if algo == "FP8" else 1 / 6), cal["input_scale"]
    assert {m: e["input_scale"] for m, e in cal["per_module"].items()} == pytest.approx(want, rel=1e-7), cal["per_module"]


def test_verify_with_a_packed_layout_verifies_the_plain_form(tmp_path):
    """--verify reads a Marlin output through its plain form: exit 0, every quantized weight compared with SRC."""
    out, report = tmp_path / "out", tmp_path / "report.json"
    r = invoke("convert", EX, "-o", out, "--algo", "NVFP4", "--layout", "marlin", "--verify", "--report", report, *CPU, "-q")
    assert r.exit_code == 0, f"exit {r.exit_code}: {r.stderr}"
    assert any(n.endswith("_marlin") for n in load_all(out))  # DST holds the packed layout itself
    v = json.load(open(report))["verify"]
    assert (v["errors"], v["compared_with_source"], v["sqnr_db"]["NVFP4"]["tensors"]) == (0, True, 14), v
    assert card_section((out / "README.md").read_text(), "Verification").startswith("`quantize verify` passed")


def test_compressed_tensors_nvfp4_card_states_the_input_scale(tmp_path):
    report = tmp_path / "report.json"
    ok("convert", EX, "-o", tmp_path / "out", "--algo", "NVFP4", "--format", "compressed-tensors", "--report", report, *CPU, "-q")
    globals_ = {v.item() for n, v in load_all(tmp_path / "out").items() if n.endswith(".input_global_scale")}
    assert globals_ == {6.0}  # 1 / input_scale: the input scale is 1/6
    section = card_section((tmp_path / "out" / "README.md").read_text(), "Calibration")
    assert "`input_scale` is 6" not in section, section
    assert abs(json.load(open(report))["calibration"]["input_scale"] - 1 / 6) < 1e-6
