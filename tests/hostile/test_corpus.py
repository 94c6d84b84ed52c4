"""A corpus of broken and hostile checkpoints: each is refused with exit 1 (2 for usage), one
``error:`` line naming the file/tensor and the fix, no traceback, no DST, nothing touched."""

from __future__ import annotations

import json
import os
import struct
import tracemalloc

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantize_cli.checkpoint.safetensors_io import MAX_HEADER_BYTES
from tests.conftest import golden_checkpoint

from .helpers import (
    CFG,
    INDEX,
    SHARD1,
    SHARD2,
    assert_clean_failure,
    assert_refused,
    convert,
    first_tensor,
    make_src,
    pack,
    rewrite,
    split_file,
    tensors,
    tree_state,
)


@pytest.fixture
def src(tmp_path):
    return make_src(tmp_path / "src")


def shard(src, name=SHARD1):
    return os.path.join(src, name)


# -- the safetensors files themselves ----------------------------------------------------------------
def test_truncated_shard(tmp_path, src):
    raw = open(shard(src, SHARD2), "rb").read()
    open(shard(src, SHARD2), "wb").write(raw[:-100])
    assert_refused(tmp_path, src, SHARD2, "truncated", "re-download")


@pytest.mark.parametrize("cut", [0, 5, 8, 20])
def test_file_cut_inside_the_header(tmp_path, src, cut):
    raw = open(shard(src), "rb").read()
    open(shard(src), "wb").write(raw[:cut])
    assert_refused(tmp_path, src, SHARD1, "re-download")


def test_header_length_past_end_of_file(tmp_path, src):
    raw = bytearray(open(shard(src), "rb").read())
    raw[:8] = struct.pack("<Q", len(raw))
    open(shard(src), "wb").write(raw)
    assert_refused(tmp_path, src, SHARD1, "header length", "truncated or not safetensors")


@pytest.mark.parametrize("n", [MAX_HEADER_BYTES + 1, 2**40, 2**64 - 1])
def test_absurd_header_length_is_refused_without_allocating_it(tmp_path, src, n):
    raw = bytearray(open(shard(src), "rb").read())
    raw[:8] = struct.pack("<Q", n)
    open(shard(src), "wb").write(raw)
    tracemalloc.start()
    try:
        assert_refused(tmp_path, src, SHARD1, f"header length {n}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"peak traced allocation {peak} bytes"


def _replace_header(path, text: bytes):
    _, data = split_file(path)
    open(path, "wb").write(pack(text, data))


@pytest.mark.parametrize(
    "text, fragment",
    [
        (b"{not json", "not valid JSON"),
        (b'{"a": \xff\xfe}', "not UTF-8"),
        (b"[1, 2, 3]", "must be a JSON object"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"x": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}, "x": {"dtype": "BF16", "shape": [1], "data_offsets": [2, 4]}}', "duplicate key"),
        (b'{"__metadata__": {"format": 1}}', "__metadata__"),
        (b'{"w": {"dtype": "BF16", "shape": [1]}}', "exactly dtype, shape and data_offsets"),
        (b'{"w": {"dtype": "BF16", "shape": [-1], "data_offsets": [0, 2]}}', "invalid shape"),
        (b'{"w": {"dtype": "BF16", "shape": [1], "data_offsets": [4, 2]}}', "invalid data_offsets"),
        (b'{"w": {"dtype": ["BF16"], "shape": [1], "data_offsets": [0, 2]}}', "unknown dtype"),
        (b'{"w": {"dtype": "BF16", "shape": [' + b"1," * 70 + b'1], "data_offsets": [0, 2]}}', "dimensions"),
        (b'{"w": {"dtype": "BF16", "shape": [1], "data_offsets": [0, ' + b"9" * 5000 + b"]}}", "not valid JSON"),
    ],
    ids=["not-json", "not-utf8", "array", "deep-nesting", "duplicate-key", "bad-metadata", "missing-field",
         "negative-dim", "reversed-offsets", "dtype-not-string", "rank-71", "5000-digit-int"],
)
def test_malformed_header(tmp_path, src, text, fragment):
    _replace_header(shard(src), text)
    assert_refused(tmp_path, src, SHARD1, fragment)


def test_tensor_offsets_out_of_bounds(tmp_path, src):
    def mutate(h):
        t = h[first_tensor(h)]
        b, e = t["data_offsets"]
        t["data_offsets"] = [b + 10**9, e + 10**9]

    rewrite(shard(src), mutate)
    assert_refused(tmp_path, src, SHARD1, "truncated")


def test_tensors_overlap(tmp_path, src):
    def mutate(h):
        names = [k for k in h if k != "__metadata__"]
        a, b = h[names[0]], h[names[1]]
        # b keeps its size but starts inside a
        size = b["data_offsets"][1] - b["data_offsets"][0]
        b["data_offsets"] = [a["data_offsets"][0] + 2, a["data_offsets"][0] + 2 + size]

    rewrite(shard(src), mutate)
    assert_refused(tmp_path, src, SHARD1, "overlap", "corrupt")


def test_offsets_disagree_with_dtype_and_shape(tmp_path, src):
    def mutate(h):
        t = h["model.layers.0.self_attn.q_proj.weight"]
        t["shape"] = [128, 64]  # half the bytes the offsets span

    rewrite(shard(src), mutate)
    assert_refused(tmp_path, src, SHARD1, "model.layers.0.self_attn.q_proj.weight", "needs 16384")


@pytest.mark.parametrize("dtype", ["F4", "Q4_K", "bf16", ""])
def test_unknown_dtype(tmp_path, src, dtype):
    rewrite(shard(src), lambda h: h["model.layers.0.self_attn.q_proj.weight"].update(dtype=dtype))
    assert_refused(tmp_path, src, SHARD1, "q_proj.weight", "unknown dtype", "standard dtype")


def test_shard_is_a_folder(tmp_path, src):
    os.unlink(shard(src))
    os.mkdir(shard(src))
    assert_refused(tmp_path, src, SHARD1, "not a regular file")


def test_shard_is_a_fifo_does_not_hang(tmp_path, src):
    os.unlink(shard(src))
    os.mkfifo(shard(src))
    assert_refused(tmp_path, src, SHARD1, "not a regular file")


# -- the index ----------------------------------------------------------------------------------------
def _edit_index(src, fn):
    path = os.path.join(src, INDEX)
    doc = json.load(open(path))
    fn(doc)
    json.dump(doc, open(path, "w"))


@pytest.mark.parametrize("target", ["../outside.safetensors", "sub/../../outside.safetensors", "/etc/passwd.safetensors"])
def test_index_names_a_file_outside_the_checkpoint(tmp_path, src, target):
    # the file really exists outside, so only the rule stops it
    outside = tmp_path / "outside.safetensors"
    save_file({"x": torch.zeros(2)}, str(outside))
    _edit_index(src, lambda d: d["weight_map"].update({"model.norm.weight": target}))
    assert_refused(tmp_path, src, INDEX, "outside the checkpoint", "fix model.safetensors.index.json")


def test_index_names_a_non_safetensors_file(tmp_path, src):
    open(os.path.join(src, "pytorch_model.bin"), "wb").write(b"\x80\x04K\x01.")
    _edit_index(src, lambda d: d["weight_map"].update({"model.norm.weight": "pytorch_model.bin"}))
    assert_refused(tmp_path, src, "pytorch_model.bin", "only safetensors are read")


def test_shard_symlink_leading_out_of_the_source(tmp_path, src):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.rename(shard(src), outside / SHARD1)
    os.symlink(outside / SHARD1, shard(src))
    assert_refused(tmp_path, src, SHARD1, "outside the checkpoint", "copy the file into SRC")


def test_shard_symlink_inside_the_source_is_fine(tmp_path, src):
    os.mkdir(os.path.join(src, "store"))
    os.rename(shard(src), os.path.join(src, "store", SHARD1))
    os.symlink(os.path.join("store", SHARD1), shard(src))
    r = convert(src, tmp_path / "out")
    assert r.exit_code == 0, r.output


def _fake_hub_cache(tmp_path, src, outside_link=None) -> str:
    """``models--org--tiny/{blobs,refs,snapshots/<rev>}`` with every file a link into blobs/, as
    huggingface_hub lays out its cache. Returns the snapshot folder."""
    repo = tmp_path / "hub" / "models--org--tiny"
    rev = "0123456789abcdef0123456789abcdef01234567"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    for i, name in enumerate(sorted(os.listdir(src))):
        blob = repo / "blobs" / f"{i:040x}"
        os.rename(os.path.join(src, name), blob)
        os.symlink(os.path.join("..", "..", "blobs", blob.name), snap / name)
    if outside_link:
        os.unlink(snap / outside_link)
        target = tmp_path / "evil.safetensors"
        save_file({"x": torch.zeros(2)}, str(target))
        os.symlink(target, snap / outside_link)
    return str(snap)


def test_hub_cache_links_into_blobs_are_fine(tmp_path, src):
    snap = _fake_hub_cache(tmp_path, src)
    r = convert(snap, tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert sorted(f for f in os.listdir(tmp_path / "out") if not f.startswith(".")) == [
        "README.md",  # the model card (card.py)
        "config.json", "generation_config.json", "hf_quant_config.json", "model.safetensors", "tokenizer_config.json"]
    assert not any(os.path.islink(tmp_path / "out" / f) for f in os.listdir(tmp_path / "out"))


def test_hub_cache_link_leading_out_of_the_cache_is_refused(tmp_path, src):
    snap = _fake_hub_cache(tmp_path, src, outside_link=SHARD2)
    assert_refused(tmp_path, snap, SHARD2, "outside the checkpoint")


def test_hub_download_path_uses_the_same_rules(tmp_path, src, monkeypatch):
    """SRC as a repo id: huggingface_hub returns a cache snapshot (simulated: no network)."""
    import huggingface_hub

    snap = _fake_hub_cache(tmp_path, src)
    calls = []

    def fake_download(repo_id, revision=None, allow_patterns=None, **kw):
        calls.append((repo_id, revision, tuple(allow_patterns)))
        return snap

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    r = convert("org/tiny", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert calls and not any(p.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt")) for p in calls[0][2])


def test_shard_missing(tmp_path, src):
    os.unlink(shard(src, SHARD2))
    assert_refused(tmp_path, src, SHARD2, "missing", "re-download")


def test_tensor_in_the_index_but_not_in_its_shard(tmp_path, src):
    _edit_index(src, lambda d: d["weight_map"].update({"model.layers.0.mlp.ghost_proj.weight": SHARD1}))
    assert_refused(tmp_path, src, INDEX, "ghost_proj", "in no shard", "fix the index")


def test_tensor_indexed_to_the_wrong_shard(tmp_path, src):
    _edit_index(src, lambda d: d["weight_map"].update({"lm_head.weight": SHARD1}))
    assert_refused(tmp_path, src, "lm_head.weight", f"indexed to {SHARD1}", f"in {SHARD2}")


def test_tensor_in_two_shards(tmp_path):
    t = tensors()
    src = make_src(tmp_path / "src", tensors_=t)
    part = load_file(os.path.join(src, SHARD1))
    assert "lm_head.weight" not in part
    part["lm_head.weight"] = t["lm_head.weight"]  # already in shard 2: now in both
    save_file(part, os.path.join(src, SHARD1))
    assert_refused(tmp_path, src, "lm_head.weight", "in both", SHARD1, SHARD2)


@pytest.mark.parametrize(
    "weight_map, fragment",
    [({}, "weight_map"), ([1, 2], "weight_map"), ({"a": 3}, "weight_map"), ({"a": ""}, "not a *.safetensors"),
     ({"a": "x\u0000.safetensors"}, "outside the checkpoint"), ({"a": "./" + SHARD1}, "not a plain relative path")],
    ids=["empty", "list", "non-string", "empty-name", "nul-byte", "not-normalized"],
)
def test_bad_weight_map(tmp_path, src, weight_map, fragment):
    json.dump({"weight_map": weight_map}, open(os.path.join(src, INDEX), "w"))
    assert_refused(tmp_path, src, INDEX, fragment)


# -- config and empty checkpoints -----------------------------------------------------------------------
def test_empty_folder(tmp_path):
    (tmp_path / "src").mkdir()
    assert_refused(tmp_path, tmp_path / "src", "not a Hugging Face checkpoint")


def test_config_but_no_weights(tmp_path):
    (tmp_path / "src").mkdir()
    json.dump(CFG, open(tmp_path / "src" / "config.json", "w"))
    assert_refused(tmp_path, tmp_path / "src", "no *.safetensors", "only safetensors")


def test_safetensors_with_no_tensors(tmp_path):
    (tmp_path / "src").mkdir()
    json.dump(CFG, open(tmp_path / "src" / "config.json", "w"))
    open(tmp_path / "src" / "model.safetensors", "wb").write(pack({"__metadata__": {"format": "pt"}}))
    assert_refused(tmp_path, tmp_path / "src", "holds no tensors")


def test_config_missing(tmp_path, src):
    os.unlink(os.path.join(src, "config.json"))
    assert_refused(tmp_path, src, "config.json", "missing")


@pytest.mark.parametrize(
    "content, fragment",
    [(b"", "not valid JSON"), (b"{garbage", "not valid JSON"), (b"\xff\xfe\x00", "not UTF-8"), (b"[1]", "JSON object"),
     (b"[" * 50_000, "nested too deeply"), (b'{"model_type": ["llama"]}', "'model_type'"),
     (b'{"model_type": "llama", "num_hidden_layers": "2"}', "'num_hidden_layers'"),
     (b'{"model_type": "llama", "text_config": [1]}', "'text_config'"), (b'{"n": 1' + b"0" * 5000 + b"}", "not valid JSON")],
    ids=["empty", "garbage", "not-utf8", "array", "deep", "model-type-list", "layers-string", "text-config-list", "huge-int"],
)
def test_config_garbage(tmp_path, src, content, fragment):
    open(os.path.join(src, "config.json"), "wb").write(content)
    assert_refused(tmp_path, src, "config.json", fragment)


def test_config_too_large_is_not_read(tmp_path, src):
    path = os.path.join(src, "config.json")
    with open(path, "r+b") as f:
        f.truncate(65 * 1024 * 1024)  # sparse: costs no disk
    assert_refused(tmp_path, src, "config.json", "more than the", "fix or re-download")


def test_hostile_tensor_name_cannot_forge_output_lines(tmp_path, src):
    evil = "x\nerror: all good\r\n\x1b[2J"
    rewrite(shard(src), lambda h: h.update({evil: {"dtype": "F4", "shape": [1], "data_offsets": [0, 1]}}))
    line = assert_refused(tmp_path, src, "unknown dtype", "\\n")
    assert "\x1b" not in line


def test_config_is_a_fifo_does_not_hang(tmp_path, src):
    os.unlink(os.path.join(src, "config.json"))
    os.mkfifo(os.path.join(src, "config.json"))
    assert_refused(tmp_path, src, "config.json", "not a regular file")


def test_src_is_a_file_or_missing(tmp_path, src):
    assert_refused(tmp_path, shard(src), "is a file")
    assert_refused(tmp_path, tmp_path / "nope", "no such folder")


# -- values, quantized inputs, shapes ------------------------------------------------------------------
@pytest.mark.parametrize(
    "algo, value",
    [("FP8_PB_WO", float("nan")), ("FP8_PB_WO", float("inf")), ("FP8_PB_WO", float("-inf")), ("FP8", float("nan")),
     ("FP8_PER_CHANNEL_PER_TOKEN", float("inf")), ("NVFP4", float("nan")), ("W4A16_NVFP4", float("-inf")), ("INT8", float("nan")),
     ("MXFP8", float("nan")), ("MXFP8", float("-inf"))],
)
def test_nan_or_inf_weight_is_reported_and_no_scale_written(tmp_path, algo, value):
    t = tensors()
    t["model.layers.0.mlp.up_proj.weight"][7, 9] = value
    src = make_src(tmp_path / "src", tensors_=t)
    assert_refused(tmp_path, src, "model.layers.0.mlp.up_proj.weight", "NaN or Inf", "[7, 9]", "--exclude", algo=algo)


def test_nan_with_overwrite_keeps_the_old_destination(tmp_path):
    t = tensors()
    t["model.layers.0.self_attn.o_proj.weight"][0, 0] = float("nan")
    src = make_src(tmp_path / "src", tensors_=t)
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "model.safetensors").write_bytes(b"the old output")
    assert_refused(tmp_path, src, "o_proj.weight", "NaN", extra=("--overwrite",))


@pytest.mark.parametrize("how", ["config-block", "hf_quant_config", "fp8-weight", "scale-tensor", "our-own-output"])
def test_already_quantized(tmp_path, how):
    t = tensors()
    cfg = dict(CFG)
    if how == "config-block":
        cfg["quantization_config"] = {"quant_method": "fp8"}
    elif how == "fp8-weight":
        t["model.layers.0.self_attn.q_proj.weight"] = t["model.layers.0.self_attn.q_proj.weight"].to(torch.float8_e4m3fn)
    elif how == "scale-tensor":
        t["model.layers.0.self_attn.q_proj.weight_scale_inv"] = torch.ones(1, 1)
    src = make_src(tmp_path / "src", tensors_=t, config=cfg)
    if how == "hf_quant_config":
        json.dump({"quantization": {"quant_algo": "FP8"}}, open(os.path.join(src, "hf_quant_config.json"), "w"))
    if how == "our-own-output":
        src = golden_checkpoint("tiny-llama-FP8_PB_WO")
    assert_refused(tmp_path, src, "already", "original")


def test_every_untakeable_shape_is_reported_at_once(tmp_path):
    t = tensors()
    t["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(100, 128, dtype=torch.bfloat16)
    t["model.layers.0.mlp.down_proj.weight"] = torch.zeros(128, 200, dtype=torch.bfloat16)
    src = make_src(tmp_path / "src", tensors_=t)
    line = assert_refused(tmp_path, src, "q_proj.weight [100, 128]", "down_proj.weight [128, 200]", "divisible by 128", "--exclude")
    assert line.startswith("error: 2 problem(s)")


# -- source and destination overlap; existing DST -----------------------------------------------------
def test_dst_equal_to_src(tmp_path, src):
    # the overlap is named first: suggesting --overwrite here would be misleading advice
    assert_refused(tmp_path, src, "is the source checkpoint", dst=src)
    assert_refused(tmp_path, src, "is the source checkpoint", dst=src, extra=("--overwrite",))


def test_dst_inside_src(tmp_path, src):
    assert_refused(tmp_path, src, "inside the source checkpoint", dst=os.path.join(src, "out"))


def test_dst_containing_src(tmp_path, src):
    assert_refused(tmp_path, src, "contains the source checkpoint", dst=tmp_path)
    assert_refused(tmp_path, src, "contains the source checkpoint", dst=tmp_path, extra=("--overwrite",))


def test_dst_is_a_link_to_src(tmp_path, src):
    os.symlink(src, tmp_path / "link")
    assert_refused(tmp_path, src, "is the source checkpoint", dst=tmp_path / "link", extra=("--overwrite",))


def test_existing_dst_without_overwrite_is_untouched(tmp_path, src):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "model.safetensors").write_bytes(b"precious")
    assert_refused(tmp_path, src, "already exists", "--overwrite", dst=dst)


def test_existing_dst_file_with_overwrite(tmp_path, src):
    (tmp_path / "out").write_bytes(b"a file")
    assert_refused(tmp_path, src, "not a folder", extra=("--overwrite",))


# -- usage errors: exit 2 ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, fragment",
    [(["--max-shard-size", "banana"], "--max-shard-size"), (["--memory-budget", "0"], "--memory-budget"),
     (["--device", "tpu"], "--device"), (["--device", "cuda:99"], "--device cuda:99")],
)
def test_usage_errors(tmp_path, src, args, fragment):
    before = tree_state(tmp_path)
    r = convert(src, tmp_path / "out", *args)
    assert_clean_failure(r, 2, fragment)
    assert tree_state(tmp_path) == before


def test_click_usage_errors_exit_2(tmp_path, src):
    before = tree_state(tmp_path)
    r = convert(src, tmp_path / "out", algo="FP9")
    assert r.exit_code == 2 and "Traceback" not in r.output and "FP9" in r.output
    assert tree_state(tmp_path) == before
