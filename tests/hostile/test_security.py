"""Security: only safetensors are read (no pickle, no torch.load, no remote code), Hub tokens never
leak into messages or reports, and files copied from SRC are regular files inside SRC."""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import pickle
import sys

import pytest

import quantize_cli
from quantize_cli.checkpoint.source import HUB_PATTERNS

from .helpers import SHARD1, assert_clean_failure, assert_refused, convert, make_src, tree_state

PACKAGE = os.path.dirname(quantize_cli.__file__)
TOKEN = "hf_" + "Zq8WbT3xKpL0vN7mRyC5sD2fGhJ9aE4uIo"  # planted, shaped like a real one


# -- an audit hook records what the process opens, imports and unpickles ----------------------------
_EVENTS: list | None = None


def _audit(event, args):
    if _EVENTS is not None and event in ("open", "import", "pickle.find_class", "exec", "compile", "marshal.loads"):
        first = args[0] if args else None
        _EVENTS.append((event, first if isinstance(first, (str, bytes, int)) or first is None else repr(first)[:200]))


sys.addaudithook(_audit)  # audit hooks cannot be removed; this one records only while _EVENTS is a list


class _Recording:
    def __enter__(self):
        global _EVENTS
        _EVENTS = []
        return _EVENTS

    def __exit__(self, *exc):
        global _EVENTS
        _EVENTS = None


class _Evil:
    """Unpickling this creates a marker file: proof that someone unpickled it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


@pytest.fixture
def booby_trapped(tmp_path):
    """A valid checkpoint with, beside its shards, pickles and remote code that announce their use."""
    src = make_src(tmp_path / "src")
    markers = tmp_path / "markers"
    pickle.dump(_Evil(str(markers / "pytorch_model.bin-was-unpickled")), open(os.path.join(src, "pytorch_model.bin"), "wb"))
    pickle.dump(_Evil(str(markers / "training_args-was-unpickled")), open(os.path.join(src, "training_args.bin"), "wb"))
    json.dump({"weight_map": {"lm_head.weight": "pytorch_model.bin"}}, open(os.path.join(src, "pytorch_model.bin.index.json"), "w"))
    code = f"import os\nos.makedirs({str(markers / 'remote-code-ran')!r}, exist_ok=True)\n"
    open(os.path.join(src, "modeling_evil.py"), "w").write(code)
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    json.dump(cfg, open(os.path.join(src, "config.json"), "w"))
    return src, markers


def test_pickles_and_remote_code_are_never_read_nor_run(tmp_path, booby_trapped):
    src, markers = booby_trapped
    with _Recording() as events:
        r = convert(src, tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert not markers.exists(), f"something was unpickled or executed: {os.listdir(markers)}"
    opened = {os.path.basename(str(a)) for e, a in events if e == "open" and isinstance(a, str) and a.startswith(src)}
    assert opened, "the audit hook saw nothing"
    assert not opened & {"pytorch_model.bin", "training_args.bin", "pytorch_model.bin.index.json"}
    assert not any(e == "pickle.find_class" for e, _ in events)
    assert not any(e == "import" and "modeling_evil" in str(a) for e, a in events)
    assert not any(e in ("exec", "compile") and "modeling_evil" in str(a) for e, a in events)
    out = set(os.listdir(tmp_path / "out"))
    assert not out & {"pytorch_model.bin", "training_args.bin", "pytorch_model.bin.index.json"}
    # remote code is copied as a file (vLLM's trust_remote_code needs it) but never imported here
    assert "modeling_evil.py" in out


def test_source_files_read_are_safetensors_config_and_sidecars_only(tmp_path, booby_trapped):
    src, _ = booby_trapped
    with _Recording() as events:
        assert convert(src, tmp_path / "out").exit_code == 0
    opened = {os.path.basename(str(a)) for e, a in events if e == "open" and isinstance(a, str) and a.startswith(src)}
    allowed = {"config.json", "model.safetensors.index.json", "generation_config.json", "tokenizer_config.json", "modeling_evil.py"}
    assert {f for f in opened if not f.endswith(".safetensors")} <= allowed


def test_no_unsafe_loaders_in_the_package():
    """No pickle/torch.load/eval/exec/trust_remote_code anywhere in quantize_cli (static check)."""
    offenders = []
    for dirpath, _, files in os.walk(PACKAGE):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            tree = ast.parse(open(path).read(), path)
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                    if any(n.split(".")[0] in ("pickle", "dill", "joblib", "cloudpickle", "marshal", "shelve") for n in names):
                        offenders.append(f"{path}:{node.lineno} imports {names}")
                elif isinstance(node, ast.Call):
                    fn = ast.unparse(node.func)
                    if fn in ("torch.load", "eval", "exec", "torch.jit.load", "numpy.load", "np.load", "pickle.load", "pickle.loads"):
                        offenders.append(f"{path}:{node.lineno} calls {fn}")
                    for kw in node.keywords:
                        if kw.arg == "trust_remote_code":
                            offenders.append(f"{path}:{node.lineno} passes trust_remote_code")
    assert offenders == []


def test_hub_downloads_only_safe_files():
    for name in ("pytorch_model.bin", "model.pt", "weights.pth", "x.pkl", "x.ckpt", "flax_model.msgpack", "x.gguf", "x.h5"):
        assert not any(fnmatch.fnmatch(name, p) for p in HUB_PATTERNS), name


# -- tokens ------------------------------------------------------------------------------------------
def test_token_never_in_output_or_report(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", TOKEN)
    src = make_src(tmp_path / "src")
    report = tmp_path / "report.json"
    r = convert(src, tmp_path / "out", "--report", report)
    assert r.exit_code == 0, r.output
    assert TOKEN not in r.output + r.stderr and TOKEN not in report.read_text()
    # a failing run writes an error report too
    open(os.path.join(src, SHARD1), "r+b").truncate(100)
    r = convert(src, tmp_path / "out2", "--report", report)
    assert r.exit_code == 1
    assert TOKEN not in r.output + r.stderr
    if report.exists():
        assert TOKEN not in report.read_text()


def test_token_in_a_hub_error_is_redacted(tmp_path, monkeypatch):
    """huggingface_hub errors can echo request details; whatever they say, the token is masked."""
    import huggingface_hub

    monkeypatch.setenv("HF_TOKEN", TOKEN)

    def leaky_download(repo_id, **kw):
        raise RuntimeError(f"401 Unauthorized for org/private: header 'Authorization: Bearer {TOKEN}'")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", leaky_download)
    before = tree_state(tmp_path)
    r = convert("org/private", tmp_path / "out")
    line = assert_clean_failure(r, 1, "org/private", "cannot fetch", "***")
    assert TOKEN not in r.output + r.stderr and TOKEN not in line
    assert tree_state(tmp_path) == before


def test_token_shaped_text_is_redacted_even_without_the_env(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    r = convert(tmp_path / TOKEN, tmp_path / "out")
    assert r.exit_code == 1 and TOKEN not in r.output + r.stderr and "***" in r.stderr


# -- sidecars ----------------------------------------------------------------------------------------
def test_sidecar_link_leading_out_of_src_is_refused(tmp_path):
    """Decision: refuse (not skip): a silently missing tokenizer makes an output that fails to load."""
    src = make_src(tmp_path / "src")
    secret = tmp_path / "secret.txt"
    secret.write_text("do not copy me")
    os.symlink(secret, os.path.join(src, "tokenizer.json"))
    assert_refused(tmp_path, src, "tokenizer.json", "outside the checkpoint", "copy the file into SRC")


def test_sidecar_link_inside_src_is_copied_as_a_regular_file(tmp_path):
    src = make_src(tmp_path / "src")
    os.mkdir(os.path.join(src, "tok"))
    open(os.path.join(src, "tok", "tokenizer.json"), "w").write('{"v": 1}')
    os.symlink(os.path.join("tok", "tokenizer.json"), os.path.join(src, "tokenizer.json"))
    r = convert(src, tmp_path / "out")
    assert r.exit_code == 0, r.output
    out = tmp_path / "out" / "tokenizer.json"
    assert out.is_file() and not out.is_symlink() and out.read_text() == '{"v": 1}'
    # sub-folders are copied too (docs/formats.md, "Files copied from the source"): as regular files
    copied = tmp_path / "out" / "tok" / "tokenizer.json"
    assert copied.is_file() and not copied.is_symlink() and copied.read_text() == '{"v": 1}'


def test_dangling_sidecar_link_and_fifo_are_skipped_with_a_warning(tmp_path):
    src = make_src(tmp_path / "src")
    os.symlink(os.path.join(src, "gone.json"), os.path.join(src, "tokenizer.json"))
    os.mkfifo(os.path.join(src, "special_tokens_map.json"))
    r = convert(src, tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "warning: " in r.stderr and "tokenizer.json: not a regular file" in r.stderr
    assert not {"tokenizer.json", "special_tokens_map.json"} & set(os.listdir(tmp_path / "out"))


def test_output_holds_only_regular_files(tmp_path, booby_trapped):
    src, _ = booby_trapped
    assert convert(src, tmp_path / "out").exit_code == 0
    for f in os.listdir(tmp_path / "out"):
        p = tmp_path / "out" / f
        assert p.is_file() and not p.is_symlink(), f
