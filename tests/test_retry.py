"""Idempotent retries: ``convert --resume`` on a finished DST (a CI loop rerunning after kill -9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.hostile.helpers import assert_clean_failure, convert, make_src, tree_state

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILL_AFTER_RENAME = textwrap.dedent(
    """
    # Test hook (tests/test_retry.py): SIGKILL this process right after DST is renamed into place.
    import os, signal
    import quantize_cli.output.destination as _d
    _commit = _d.Destination.commit
    def _commit_then_die(self):
        _commit(self)
        os.kill(os.getpid(), signal.SIGKILL)
    _d.Destination.commit = _commit_then_die
    """
)


@pytest.fixture
def src(tmp_path):
    return make_src(tmp_path / "src")


def test_kill_after_the_final_rename_then_resume_says_complete_and_exits_0(tmp_path, src):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_AFTER_RENAME)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hook), REPO]))
    dst = tmp_path / "out"
    cmd = [sys.executable, "-m", "quantize_cli", "convert", str(src), "-o", str(dst), "--algo", "FP8_PB_WO", "-q", "--resume"]
    killed = subprocess.run(cmd, env=env, capture_output=True, timeout=120)
    assert killed.returncode == -9 and dst.is_dir()
    before = tree_state(tmp_path)
    r = convert(src, dst, "--resume")
    assert r.exit_code == 0, r.output
    assert "already complete" not in r.stderr  # -q: silent
    r = convert(src, dst, "--resume", "--algo", "FP8_PB_WO")
    assert r.exit_code == 0, r.output
    assert tree_state(tmp_path) == before  # nothing rewritten


def test_resume_on_a_finished_dst_verifies_the_checksums(tmp_path, src):
    dst = tmp_path / "out"
    assert convert(src, dst).exit_code == 0
    from click.testing import CliRunner

    from quantize_cli.cli import main

    r = CliRunner().invoke(main, ["convert", str(src), "-o", str(dst), "--algo", "FP8_PB_WO", "--resume"])
    assert r.exit_code == 0, r.output
    assert "already complete" in r.stderr and "task checksum(s) verified" in r.stderr


def test_without_the_checksums_file_headers_sizes_and_index_are_checked(tmp_path, src):
    dst = tmp_path / "out"
    assert convert(src, dst).exit_code == 0
    os.unlink(dst / ".quantize-checksums")
    from click.testing import CliRunner

    from quantize_cli.cli import main

    r = CliRunner().invoke(main, ["convert", str(src), "-o", str(dst), "--algo", "FP8_PB_WO", "--resume"])
    assert r.exit_code == 0 and "headers, sizes and index verified" in r.stderr, r.output
    # ... and without the record, other options are still caught through the config files
    r = convert(src, dst, "--resume", "--exclude", "model.layers.0.mlp.*")
    assert_clean_failure(r, 1, "already exists", "hf_quant_config.json", "exclude_modules", "--overwrite")


@pytest.mark.parametrize("extra, named", [
    (("--algo", "NVFP4"), "--algo FP8_PB_WO, this run asks for NVFP4"),
    (("--exclude", "model.layers.0.mlp.*"), "--exclude (none), this run asks for model.layers.0.mlp.*"),
    (("--kv-cache-dtype", "fp8"), "--kv-cache-dtype (none), this run asks for fp8"),
    (("--max-shard-size", "100KB"), "--max-shard-size 5GB, this run asks for 100KB"),
    (("--layout", "marlin"), "--layout plain, this run asks for marlin"),
    (("--format", "compressed-tensors"), "--format modelopt, this run asks for compressed-tensors"),
    (("--algo-for", "*self_attn*=NVFP4"), "--algo-for (none), this run asks for *self_attn*=NVFP4"),
    (("--scale-search", "mse"), "--scale-search none, this run asks for mse"),
], ids=["algo", "exclude", "kv", "shard-size", "layout", "format", "algo-for", "scale-search"])
def test_resume_with_other_options_names_the_difference(tmp_path, src, extra, named):
    dst = tmp_path / "out"
    assert convert(src, dst).exit_code == 0
    before = tree_state(tmp_path)
    args = list(extra)
    algo = "FP8_PB_WO"
    if args[0] == "--algo":
        algo, args = args[1], []
    r = convert(src, dst, "--resume", *args, algo=algo)
    assert_clean_failure(r, 1, str(dst), "already exists", named, "--overwrite")
    assert tree_state(tmp_path) == before


def test_resume_from_another_source_is_refused(tmp_path, src):
    other = make_src(tmp_path / "other", seed=3)
    dst = tmp_path / "out"
    assert convert(src, dst).exit_code == 0
    assert_clean_failure(convert(other, dst, "--resume"), 1, "made with the source", "other", "--overwrite")


def test_resume_after_the_source_changed_is_refused(tmp_path, src):
    dst = tmp_path / "out"
    assert convert(src, dst).exit_code == 0
    os.utime(os.path.join(src, "model-00001-of-00002.safetensors"), ns=(1, 1))
    assert_clean_failure(convert(src, dst, "--resume"), 1, "source files", "changed", "--overwrite")


@pytest.mark.parametrize("damage", ["flip-a-byte", "truncate", "drop-config", "edit-index", "drop-shard"])
def test_a_damaged_finished_dst_is_not_called_complete(tmp_path, src, damage):
    dst = tmp_path / "out"
    assert convert(src, dst, "--max-shard-size", "100KB").exit_code == 0
    shards = sorted(f for f in os.listdir(dst) if f.endswith(".safetensors"))
    assert len(shards) >= 2 and (dst / "model.safetensors.index.json").exists()
    shard = dst / shards[-1]
    if damage == "flip-a-byte":
        raw = bytearray(shard.read_bytes())
        raw[-3] ^= 0xFF
        shard.write_bytes(bytes(raw))
    elif damage == "truncate":
        os.truncate(shard, shard.stat().st_size - 10)
    elif damage == "drop-config":
        os.unlink(dst / "config.json")
    elif damage == "edit-index":
        doc = json.loads((dst / "model.safetensors.index.json").read_text())
        doc["weight_map"].popitem()
        (dst / "model.safetensors.index.json").write_text(json.dumps(doc))
    else:
        os.unlink(shard)
    r = convert(src, dst, "--resume", "--max-shard-size", "100KB")
    assert_clean_failure(r, 1, str(dst), "already exists, but", "--overwrite")


def test_overwrite_still_rebuilds(tmp_path, src):
    dst = tmp_path / "out"
    assert convert(src, dst).exit_code == 0
    (dst / "model-00001-of-00002.safetensors").write_bytes(b"junk")
    r = convert(src, dst, "--resume", "--overwrite")
    assert r.exit_code == 0, r.output
    assert convert(src, dst, "--resume").exit_code == 0


def test_library_resume_returns_the_finished_destination(tmp_path, src):
    from tests.conftest import convert as lib

    first = lib(src, str(tmp_path / "out"), algo="NVFP4", quiet=True)
    again = lib(src, str(tmp_path / "out"), algo="NVFP4", quiet=True, resume=True)
    assert again.dst == first.dst and again.report["status"] == "already-complete"


def test_resume_on_a_finished_compressed_tensors_dst_is_idempotent_too(tmp_path, src):
    """compressed-tensors writes config.json alone (no hf_quant_config.json): still recognised as finished."""
    dst = tmp_path / "out"
    assert convert(src, dst, "--format", "compressed-tensors").exit_code == 0
    before = tree_state(tmp_path)
    from click.testing import CliRunner

    from quantize_cli.cli import main

    r = CliRunner().invoke(main, ["convert", str(src), "-o", str(dst), "--algo", "FP8_PB_WO", "--format", "compressed-tensors", "--resume"])
    assert r.exit_code == 0, r.output
    assert "already complete" in r.stderr and "task checksum(s) verified" in r.stderr
    assert tree_state(tmp_path) == before
    r = convert(src, dst, "--resume")  # the same DST asked for as ModelOpt: named, not rebuilt
    assert_clean_failure(r, 1, str(dst), "already exists", "--format compressed-tensors, this run asks for modelopt", "--overwrite")
    assert tree_state(tmp_path) == before
