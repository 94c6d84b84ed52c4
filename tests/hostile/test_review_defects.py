"""Defects found by code review (round 2); each test failed before its fix."""

from __future__ import annotations

import json
import os
import threading

import huggingface_hub
import pytest

from tests.conftest import output_files
import torch

import quantize_cli.output.workfolder as workfolder_mod
from quantize_cli.api import unpack
from tests.conftest import convert
from quantize_cli.output.destination import Destination
from quantize_cli.checkpoint.safetensors_io import read_header
from quantize_cli.errors import CheckFailed, DestinationError, NumericsError, SourceError
from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors, write_checkpoint
from tests.test_low_disk import fake_hub  # noqa: F401  (fixture)

from .helpers import interrupt_after_tasks, invoke, make_src


@pytest.fixture
def src(tmp_path):
    return make_src(tmp_path / "src")


def _open_fds() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


def _writer_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("quantize-")]


# -- --low-disk ----------------------------------------------------------------------------------------
def test_low_disk_download_failure_keeps_the_work_folder_and_resume_finishes(fake_hub, tmp_path):  # noqa: F811
    local, state = fake_hub
    real = huggingface_hub.hf_hub_download

    def flaky(repo, filename, revision=None, local_dir=None):
        if filename.endswith("00003-of-00004.safetensors") and local_dir:
            raise ConnectionError("network down")
        return real(repo, filename, revision=revision, local_dir=local_dir)

    huggingface_hub.hf_hub_download = flaky
    try:
        with pytest.raises(SourceError, match="download failed .*rerun with --resume"):
            convert("someone/tiny-llama", str(tmp_path / "out"), algo="NVFP4", quiet=True, low_disk=True)
    finally:
        huggingface_hub.hf_hub_download = real
    partial = tmp_path / ".out.partial"
    assert partial.is_dir() and (partial / ".quantize-journal").read_text().strip()  # the advice can be followed
    convert("someone/tiny-llama", str(tmp_path / "out"), algo="NVFP4", quiet=True, low_disk=True, resume=True)
    convert(local, str(tmp_path / "ref"), algo="NVFP4", quiet=True)
    assert output_files(tmp_path / "out") == output_files(tmp_path / "ref")


def test_low_disk_nan_names_the_tensor(fake_hub, tmp_path):  # noqa: F811
    local, _ = fake_hub
    name = "model.layers.2.mlp.up_proj.weight"
    shard = next(f for f in os.listdir(local) if f.endswith(".safetensors") and name in read_header(os.path.join(local, f)).tensors)
    info = read_header(os.path.join(local, shard)).tensors[name]
    with open(os.path.join(local, shard), "r+b") as f:  # one bf16 NaN (0x7fc0) in row 3
        f.seek(info.offset + 2 * (3 * info.shape[1] + 5))
        f.write(b"\xc0\x7f")
    with pytest.raises(NumericsError) as err:
        convert("someone/tiny-llama", str(tmp_path / "out"), algo="FP8", quiet=True, low_disk=True)
    assert name in err.value.message and "[3, 5]" in err.value.message and "cannot open" not in err.value.message
    assert not (tmp_path / "out").exists()


def test_low_disk_pins_the_revision_once(fake_hub, tmp_path, monkeypatch):  # noqa: F811
    local, state = fake_hub
    state["sha"] = "b" * 40
    seen = []
    real = huggingface_hub.hf_hub_download
    monkeypatch.setattr(huggingface_hub, "hf_hub_download",
                        lambda repo, f, revision=None, local_dir=None: seen.append(revision) or real(repo, f, revision, local_dir))
    convert("someone/tiny-llama", str(tmp_path / "out"), algo="FP8", quiet=True, low_disk=True, revision="main")
    assert state["resolved"] == ["main"] and set(seen) == {"b" * 40}


def test_low_disk_resume_after_the_branch_moved_is_refused(fake_hub, tmp_path, monkeypatch):  # noqa: F811
    local, state = fake_hub
    restore = interrupt_after_tasks(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        convert("someone/tiny-llama", str(tmp_path / "out"), algo="FP8", quiet=True, low_disk=True)
    restore()
    state["sha"] = "c" * 40  # main now points at another commit
    with pytest.raises(DestinationError, match="the interrupted run there used the source"):
        convert("someone/tiny-llama", str(tmp_path / "out"), algo="FP8", quiet=True, low_disk=True, resume=True)


def test_low_disk_shard_that_changed_on_the_hub_is_refused(fake_hub, tmp_path, monkeypatch):  # noqa: F811
    local, state = fake_hub
    real = huggingface_hub.hf_hub_download

    def swapped(repo, filename, revision=None, local_dir=None):
        path = real(repo, filename, revision=revision, local_dir=local_dir)
        if local_dir and filename.endswith("00002-of-00004.safetensors"):  # another file under the same name
            t = {n: torch.zeros(4, 4, dtype=torch.bfloat16) for n in read_header(path).tensors}
            from safetensors.torch import save_file

            save_file(t, path)
        return path

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", swapped)
    with pytest.raises(SourceError, match="00002-of-00004.safetensors: the downloaded header differs from the one planned"):
        convert("someone/tiny-llama", str(tmp_path / "out"), algo="FP8", quiet=True, low_disk=True)
    assert not (tmp_path / "out").exists()


# -- the recipe is recorded in the output ----------------------------------------------------------------
def test_converted_with_recipe_unpacks_and_verifies(make_checkpoint, tmp_path):
    from quantize_cli.checkpoint.example_weights import qwen3_moe_config, qwen3_moe_tensors
    from quantize_cli.verify import verify_checkpoint

    cfg = qwen3_moe_config()
    t = qwen3_moe_tensors(cfg, seed=3)
    cfg = dict(cfg, model_type="in_house_moe")  # no shipped recipe knows this model type
    src = make_checkpoint(t, cfg)
    convert(src, str(tmp_path / "packed"), algo="NVFP4", layout="flashinfer", recipe="qwen3_moe", quiet=True)
    convert(src, str(tmp_path / "plain"), algo="NVFP4", recipe="qwen3_moe", quiet=True)
    rec = json.load(open(tmp_path / "plain" / "hf_quant_config.json"))["converter"]["recipe"]
    assert rec["name"] == "qwen3_moe" and rec["fused"] and rec["experts"]
    res = verify_checkpoint(str(tmp_path / "plain"), src)
    assert not res.errors, [f.message for f in res.errors][:3]
    unpack(str(tmp_path / "packed"), str(tmp_path / "unpacked"), quiet=True)
    assert output_files(tmp_path / "unpacked") == output_files(tmp_path / "plain")


# -- verify reads JSON that is not an object ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["hf_quant_config.json", "config.json"])
@pytest.mark.parametrize("doc", ["[]", "42", '"x"', "null"])
def test_verify_fails_config_files_that_are_not_objects(src, tmp_path, name, doc):
    convert(src, str(tmp_path / "out"), algo="FP8", quiet=True)
    (tmp_path / "out" / name).write_text(doc)
    r = invoke("verify", tmp_path / "out")
    assert r.exit_code == 1 and "must be a JSON object" in r.output and "Traceback" not in r.output


# -- a failed library call leaks nothing ------------------------------------------------------------------
def test_failed_convert_leaves_no_thread_and_no_open_file(tmp_path):
    cfg = llama_config(hidden=128, intermediate=256, layers=2, heads=2, kv_heads=2, vocab=256)
    t = llama_tensors(cfg)
    t["model.layers.1.mlp.down_proj.weight"][0, 0] = float("nan")  # late: earlier tasks are queued for writing
    src = write_checkpoint(str(tmp_path / "src"), t, cfg)
    fds, threads = _open_fds(), _writer_threads()
    with pytest.raises(NumericsError):
        convert(src, str(tmp_path / "out"), algo="FP8", quiet=True, memory_budget="64MB")
    assert _writer_threads() == threads
    leaked = {p for p in _open_fds() - fds if str(tmp_path) in p}
    assert not leaked, leaked


def test_failed_unpack_leaves_no_open_file(src, tmp_path, monkeypatch):
    import quantize_cli.layouts as layouts

    convert(src, str(tmp_path / "packed"), algo="NVFP4", layout="marlin", quiet=True)
    calls = [0]
    real = layouts.unpack

    def fail_late(*a, **k):
        calls[0] += 1
        if calls[0] > 10:  # the second pass: the output shards are open
            raise OSError(5, "Input/output error")
        return real(*a, **k)

    monkeypatch.setattr(layouts, "unpack", fail_late)
    fds = _open_fds()
    with pytest.raises(OSError):
        unpack(str(tmp_path / "packed"), str(tmp_path / "plain"), quiet=True)
    assert not {p for p in _open_fds() - fds if str(tmp_path) in p}
    assert not (tmp_path / "plain").exists()


# -- publishing: the lock is held through the final rename ----------------------------------------------
def test_a_second_run_cannot_take_the_lock_while_the_first_publishes(src, tmp_path, monkeypatch):
    import quantize_cli.output.destination as dmod

    dst = str(tmp_path / "out")
    real_rename = os.rename
    seen = []

    def rename(a, b):
        if str(a).endswith(".out.partial"):  # the first run is publishing: a second run starts now
            second = Destination(dst)
            try:
                second.acquire()
                seen.append("second run took the lock")
            except DestinationError as exc:
                seen.append(exc.message)
        return real_rename(a, b)

    monkeypatch.setattr(dmod.os, "rename", rename)
    convert(src, dst, algo="FP8", quiet=True)
    monkeypatch.setattr(dmod.os, "rename", real_rename)
    assert len(seen) == 1 and "another quantize run is writing it" in seen[0]
    shards = [f for f in os.listdir(dst) if f.endswith(".safetensors")]
    assert shards and all(os.path.getsize(os.path.join(dst, f)) > 1000 for f in shards)
    assert not os.path.exists(tmp_path / ".out.lock")  # released and removed after publishing


# -- durability ---------------------------------------------------------------------------------------------
def test_every_output_file_is_fsynced_before_the_rename(src, tmp_path, monkeypatch):
    from tests.hostile.helpers import spy_fsync_before_publish

    at_rename = spy_fsync_before_publish(monkeypatch)
    convert(src, str(tmp_path / "out"), algo="FP8", quiet=True, max_shard_size="100KB")
    files = {f for f in os.listdir(tmp_path / "out")}
    assert "model.safetensors.index.json" in files and "generation_config.json" in files
    assert at_rename and files <= at_rename[0], files - at_rename[0]


def test_resume_state_is_replaced_atomically(tmp_path, monkeypatch):
    """The work folder's identity record goes through the one atomic writer: a crash mid-write leaves
    the old state whole, a completed write replaces it whole."""
    from quantize_cli.checkpoint import durable
    from quantize_cli.api import prepare
    from quantize_cli.output.identity import RunIdentity
    from quantize_cli.plan.options import ConvertOptions

    src = "example:tiny-llama"
    plan = prepare(src, "FP8")
    identity = RunIdentity.of(ConvertOptions(src, str(tmp_path / "out"), algo="FP8"), plan)
    work = workfolder_mod.WorkFolder(str(tmp_path / "out"))
    state = os.path.join(work.partial, workfolder_mod.STATE)
    os.makedirs(work.partial)
    open(state, "w").write('{"run": "old"}')
    real_write = durable.os.fsync

    def torn(fd):  # the process dies while the new state is being written
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(durable.os, "fsync", torn)
    with pytest.raises(OSError):
        work.open(identity, plan, resume=False)
    work.dest.release()
    monkeypatch.setattr(durable.os, "fsync", real_write)
    assert not os.path.exists(state) or json.loads(open(state).read()) == {"run": "old"}  # never a torn file
    assert not [f for f in os.listdir(work.partial) if ".tmp-" in f]
    work.open(identity, plan, resume=False)
    assert json.loads(open(state).read())["run"] == identity.record()
    work.discard()


# -- --verify failing keeps the output for inspection ----------------------------------------------------------
def test_verify_failure_keeps_the_output_beside_dst(src, tmp_path, monkeypatch):
    import quantize_cli.verify as verify_mod
    from quantize_cli.problems import ERROR, Finding

    real = verify_mod.verify_checkpoint

    def failing(path, source=None, method=None):
        res = real(path, source, method)
        res.findings.append(Finding(ERROR, "test", "x", "x: injected"))
        return res

    monkeypatch.setattr(verify_mod, "verify_checkpoint", failing)
    with pytest.raises(CheckFailed) as err:
        convert(src, str(tmp_path / "out"), algo="FP8", quiet=True, verify=True)
    kept = tmp_path / "out.verify-failed"
    assert str(kept) in err.value.message and "for inspection" in err.value.message
    assert not (tmp_path / "out").exists() and (kept / "model.safetensors").is_file() and (kept / "config.json").is_file()
    assert not (tmp_path / ".out.partial").exists() and not (tmp_path / ".out.lock").exists()
    with pytest.raises(CheckFailed):  # a second failure does not overwrite the first kept output
        convert(src, str(tmp_path / "out"), algo="FP8", quiet=True, verify=True)
    assert (tmp_path / "out.verify-failed-2").is_dir() and kept.is_dir()


# -- check reports recipe patterns too ---------------------------------------------------------------------------
def test_check_reports_findings_of_recipe_patterns(src, tmp_path):
    from quantize_cli.api import check

    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: mine\nextends: llama\nexclude:\n  - '*.q_proj'\n")
    with pytest.raises(CheckFailed):
        res = check(src, "FP8", recipe=str(recipe))
    from quantize_cli.api import prepare
    from quantize_cli.plan.check import run_check

    res = run_check(prepare(src, "FP8", recipe=str(recipe)), [], 1)
    codes = [(f.code, f.subject) for f in res.findings]
    assert ("pattern-partial-group", "*.q_proj") in codes, codes


# -- MoE with --layout packs in slices within --memory-budget -------------------------------------------------
@pytest.mark.parametrize("layout,algo", [("flashinfer", "NVFP4"), ("cutlass", "FP8"), ("cutlass", "NVFP4"), ("flashinfer", "FP8")])
def test_moe_layout_packs_in_slices_within_the_budget_with_the_same_bytes(make_checkpoint, tmp_path, monkeypatch, layout, algo):
    import quantize_cli.layouts.packing as packing
    from quantize_cli.checkpoint.example_weights import qwen3_moe_config, qwen3_moe_tensors

    cfg = qwen3_moe_config()
    src = make_checkpoint(qwen3_moe_tensors(cfg, seed=3, fused_experts=True), cfg)
    sizes = []
    real = packing.Packing.pack_layer
    monkeypatch.setattr(packing.Packing, "pack_layer", lambda self, group, experts: sizes.append(len(experts)) or real(self, group, experts))
    convert(src, str(tmp_path / "big"), algo=algo, layout=layout, quiet=True)
    whole = max(sizes)
    sizes.clear()
    convert(src, str(tmp_path / "small"), algo=algo, layout=layout, quiet=True, memory_budget="200KB")
    assert whole > 1 and max(sizes) < whole, (whole, sizes)  # a layer no longer held whole
    assert output_files(tmp_path / "small") == output_files(tmp_path / "big")
