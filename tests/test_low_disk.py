"""--low-disk: a Hub source converted one source shard at a time, same bytes, bounded disk."""

import fnmatch
import os
import shutil
from types import SimpleNamespace

import huggingface_hub
import pytest

from tests.conftest import convert
from quantize_cli.checkpoint.safetensors_io import read_header
from quantize_cli.errors import UsageError
from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors


@pytest.fixture
def fake_hub(make_checkpoint, monkeypatch):
    """A 'repo' served from a local folder: remote headers, per-file downloads, sidecar snapshot."""
    cfg = llama_config(layers=4)
    local = make_checkpoint(llama_tensors(cfg, seed=9), cfg, shards=4, name="repo")
    state = {"on_disk": set(), "peak": 0, "weights_downloaded": 0}

    def metadata(repo, revision=None):
        files = {}
        for f in sorted(os.listdir(local)):
            if f.endswith(".safetensors"):
                h = read_header(os.path.join(local, f))
                files[f] = SimpleNamespace(tensors={n: SimpleNamespace(dtype=t.dtype, shape=list(t.shape),
                                                     data_offsets=[t.offset - h.data_start, t.offset - h.data_start + t.nbytes])
                                                     for n, t in h.tensors.items()})
        return SimpleNamespace(files_metadata=files)

    def download(repo, filename, revision=None, local_dir=None):
        if local_dir is None:
            return os.path.join(local, filename)
        os.makedirs(local_dir, exist_ok=True)
        dst = os.path.join(local_dir, filename)
        shutil.copyfile(os.path.join(local, filename), dst)
        if filename.endswith(".safetensors"):
            state["weights_downloaded"] += 1
            state["on_disk"].add(dst)
            state["peak"] = max(state["peak"], sum(os.path.exists(p) for p in state["on_disk"]))
        return dst

    def snapshot(repo, revision=None, allow_patterns=None, local_dir=None):
        os.makedirs(local_dir, exist_ok=True)
        for f in os.listdir(local):
            if any(fnmatch.fnmatch(f, p) for p in allow_patterns) and not f.endswith(".safetensors"):
                shutil.copyfile(os.path.join(local, f), os.path.join(local_dir, f))
        return local_dir

    def model_info(repo, revision=None):
        state.setdefault("resolved", []).append(revision)
        return SimpleNamespace(sha=state.get("sha", "a" * 40))

    monkeypatch.setattr(huggingface_hub, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", metadata)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    return local, state


@pytest.mark.parametrize("algo", ["NVFP4", "FP8_PB_WO"])
def test_low_disk_gives_the_same_bytes_with_at_most_two_shards_on_disk(fake_hub, tmp_path, algo):
    local, state = fake_hub
    convert(local, str(tmp_path / "ref"), algo=algo, quiet=True)
    convert("someone/tiny-llama", str(tmp_path / "out"), algo=algo, quiet=True, low_disk=True)
    ref, out = tmp_path / "ref", tmp_path / "out"
    # hidden: bookkeeping (how each was made); README.md: the model card names its own source and DST
    listing = sorted(f for f in os.listdir(ref) if not f.startswith(".") and f != "README.md")
    assert listing == sorted(f for f in os.listdir(out) if not f.startswith(".") and f != "README.md")
    for f in listing:
        assert (ref / f).read_bytes() == (out / f).read_bytes(), f
    assert state["weights_downloaded"] == 4 and 1 <= state["peak"] <= 2
    assert not any(os.path.exists(p) for p in state["on_disk"])  # every shard dropped after use


def test_low_disk_needs_a_hub_source(tiny_llama, tmp_path):
    with pytest.raises(UsageError, match="only for Hub repo ids"):
        convert(tiny_llama, str(tmp_path / "o"), algo="FP8", low_disk=True, quiet=True)


def test_low_disk_verify_checks_the_output_without_downloading_the_source_again(fake_hub, tmp_path):
    local, state = fake_hub
    convert("someone/tiny-llama", str(tmp_path / "out"), algo="NVFP4", quiet=True, low_disk=True, verify=True)
    assert state["weights_downloaded"] == 4  # each shard once, for the conversion only


def test_dry_run_on_a_hub_id_reads_headers_only(fake_hub, tmp_path):
    """--dry-run plans a Hub model from its safetensors headers and sidecars: no weight is downloaded,
    and the plan (every output tensor, shard and offset) is the one the local copy gives."""
    local, state = fake_hub
    hub = convert("someone/tiny-llama", str(tmp_path / "out"), algo="NVFP4", quiet=True, dry_run=True)
    ref = convert(local, str(tmp_path / "ref"), algo="NVFP4", quiet=True, dry_run=True)
    assert state["weights_downloaded"] == 0
    assert not (tmp_path / "out").exists()
    assert hub.plan.outputs == ref.plan.outputs and hub.plan.shard_names == ref.plan.shard_names
