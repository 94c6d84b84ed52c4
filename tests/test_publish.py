"""Publishing to a fake Hub on 127.0.0.1 (tests/fakehub.py): files, card, private flag, branch,
resume after a dropped connection, the token never shown, and no upload unless the conversion succeeded."""

import hashlib
import json
import os
import subprocess
import sys
import time

import huggingface_hub
import pytest
import torch
from click.testing import CliRunner
from huggingface_hub import constants as hf_constants

from quantize_cli.api import push
from tests.conftest import convert
from quantize_cli.cli import main
from quantize_cli.errors import NumericsError, PublishError, UsageError
from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors

from .fakehub import FakeHub, register_pending

TOKEN = "hf_" + "Q7" * 17  # shaped like a real token, so the shape-based redaction is exercised too


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A running fake Hub; huggingface_hub points at it and holds TOKEN (never a login file)."""
    server = FakeHub().start()
    monkeypatch.setattr(hf_constants, "ENDPOINT", server.url)
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "no-login-token"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    yield server
    server.stop()


@pytest.fixture
def no_xet(monkeypatch):
    """The LFS path (hf_xet absent): safetensors go through the LFS batch API and single PUTs."""
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", True)


def uploads(hub):
    """The requests that change something (everything but the access checks made before converting)."""
    return [r for r in hub.requests if not (r["method"] == "GET" and r["path"].startswith(("/api/whoami-v2", "/api/models/")))]


def local_files(folder):
    return {f: open(os.path.join(folder, f), "rb").read() for f in os.listdir(folder) if not f.startswith(".")}


def test_convert_verify_push_publishes_the_verified_checkpoint_and_its_card(hub, no_xet, tiny_llama, tmp_path):
    dst, report = str(tmp_path / "model-FP8"), str(tmp_path / "report.json")
    convert(tiny_llama, dst, algo="FP8_PB_WO", verify=True, push_to_hub="me/model-FP8", private=True, report=report, quiet=True)
    assert hub.files("me/model-FP8") == local_files(dst)  # every file, byte for byte
    assert set(local_files(dst)) >= {"README.md", "config.json", "hf_quant_config.json", "model.safetensors"}
    assert hub.repos["me/model-FP8"]["private"] is True
    assert hashlib.sha256(local_files(dst)["model.safetensors"]).hexdigest() in hub.lfs  # weights went through LFS
    assert {r["auth"] for r in hub.requests if r["method"] == "POST"} == {f"Bearer {TOKEN}"}
    card = hub.files("me/model-FP8")["README.md"].decode()
    assert "quantize convert ./src -o me/model-FP8 --algo FP8_PB_WO" in card and str(tmp_path) not in card
    assert "vllm serve me/model-FP8" in card and "| `FP8_PB_WO` | 14 |" in card  # verify's SQNR row
    assert hub.validated_yaml and hub.validated_yaml[-1] == card  # the Hub's card metadata check saw it
    doc = json.load(open(report))
    assert doc["publish"]["status"] == "ok" and doc["publish"]["repo_id"] == "me/model-FP8"
    assert doc["publish"]["commit"] and doc["publish"]["files"] == len(local_files(dst))
    assert doc["verify"]["errors"] == 0 and doc["verify"]["sqnr_db"]["FP8_PB_WO"]["tensors"] == 14


def test_default_pipeline_and_revision_out_commit_to_a_new_branch(hub, tiny_llama, tmp_path):
    """huggingface_hub 2.x's streamed uploader (hf_xet present); files committed inline by this server."""
    hub.lfs_paths = ()  # the fake server speaks no Xet storage protocol
    dst = str(tmp_path / "out")
    convert(tiny_llama, dst, algo="NVFP4", quiet=True)
    record = push(dst, "me/m", revision_out="nvfp4", quiet=True)
    assert hub.files("me/m", "nvfp4") == local_files(dst) and hub.files("me/m", "main") == {}
    assert record["revision"] == "nvfp4" and record["schema_version"] == 1 and record["private"] is False
    assert hub.repos["me/m"]["private"] is False


def test_a_rerun_resumes_after_a_dropped_connection(hub, no_xet, tiny_llama, tmp_path, monkeypatch):
    dst = str(tmp_path / "out")
    convert(tiny_llama, dst, algo="FP8", max_shard_size="1MB", quiet=True)
    shards = sorted(f for f in os.listdir(dst) if f.endswith(".safetensors"))
    assert len(shards) >= 2
    register_pending(hub, dst)
    hub.drop_puts = {shards[-1]}  # the connection drops on every try of the last shard
    monkeypatch.setattr(time, "sleep", lambda s: None)  # huggingface_hub's retry back-off, not the test's time
    with pytest.raises(PublishError) as err:
        push(dst, "me/m", quiet=True)
    msg = str(err.value)
    assert "\n" not in msg and f"rerun `quantize push {dst} me/m` to resume" in msg and "uploading failed" in msg
    assert hub.files("me/m") == {}  # nothing committed: the repo never shows a half upload
    assert shards[-1] not in hub.puts and set(shards[:-1]) <= set(hub.puts)
    hub.drop_puts = set()
    push(dst, "me/m", quiet=True)
    assert hub.files("me/m") == local_files(dst)
    assert sorted(hub.puts) == sorted(shards)  # each shard sent once in all: the rerun skipped what had arrived


def test_a_failed_conversion_never_uploads(hub, make_checkpoint, tmp_path):
    cfg = llama_config()
    tensors = llama_tensors(cfg)
    tensors["model.layers.1.mlp.down_proj.weight"][3, 5] = float("nan")
    src = make_checkpoint(tensors, cfg)
    with pytest.raises(NumericsError):
        convert(src, str(tmp_path / "o"), algo="FP8", push_to_hub="me/m", quiet=True)
    assert uploads(hub) == [] and not os.path.exists(tmp_path / "o")


def test_publishing_flags_are_checked_before_anything_runs(hub, tiny_llama, tmp_path):
    for kwargs, text in (({"push_to_hub": "not a repo"}, "--push-to-hub"), ({"private": True}, "--private needs --push-to-hub"),
                         ({"revision_out": "b"}, "--revision-out needs"), ({"push_to_hub": "me/m", "revision_out": "-x"}, "branch")):
        with pytest.raises(UsageError, match=text):
            convert(tiny_llama, str(tmp_path / "o"), algo="FP8", quiet=True, **kwargs)
    r = CliRunner().invoke(main, ["convert", tiny_llama, "-o", str(tmp_path / "o"), "--algo", "FP8", "--push-to-hub", "../x"])
    assert r.exit_code == 2 and "owner/name" in r.output
    assert hub.requests == [] and not os.path.exists(tmp_path / "o")


def test_push_refuses_unfinished_folders_and_a_missing_token(hub, tiny_llama, tmp_path, monkeypatch):
    dst = str(tmp_path / "out")
    convert(tiny_llama, dst, algo="FP8", quiet=True)
    open(os.path.join(dst, ".quantize-journal"), "w").close()
    with pytest.raises(PublishError, match="unfinished conversion"):
        push(dst, "me/m")
    os.remove(os.path.join(dst, ".quantize-journal"))
    with pytest.raises(PublishError, match="not a folder"):
        push(str(tmp_path / "nothing"), "me/m")
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(PublishError, match="no Hugging Face token; set HF_TOKEN"):
        push(dst, "me/m")
    assert hub.requests == []


def test_a_server_echoing_the_token_gets_a_redacted_one_line_error(hub, no_xet, tiny_llama, tmp_path, capfd):
    dst = str(tmp_path / "out")
    convert(tiny_llama, dst, algo="FP8", quiet=True)
    hub.echo_token_status = 401
    r = CliRunner().invoke(main, ["push", dst, "me/m"])
    out, err = capfd.readouterr()
    assert r.exit_code == 1
    assert r.output.startswith("error: me/m: creating the repo failed") and r.output.count("\n") == 1
    for text in (r.output, out, err):
        assert TOKEN not in text
    assert any(r["auth"] == f"Bearer {TOKEN}" for r in hub.requests)  # it was sent, and echoed back at us


def test_token_never_appears_in_output_report_or_card(tiny_llama, tmp_path, monkeypatch):
    """The whole CLI in a fresh process (HF_ENDPOINT read at import, real stdout/stderr, progress on)."""
    server = FakeHub().start()
    try:
        env = {**os.environ, "HF_ENDPOINT": server.url, "HF_TOKEN": TOKEN, "HF_HUB_DISABLE_XET": "1",
               "HF_HOME": str(tmp_path / "hf-home")}
        dst, report = tmp_path / "model-FP8", tmp_path / "report.json"
        proc = subprocess.run([sys.executable, "-m", "quantize_cli", "convert", tiny_llama, "-o", str(dst), "--algo", "FP8_PB_WO",
                               "--verify", "--push-to-hub", "me/model-FP8", "--report", str(report)],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert server.files("me/model-FP8") == local_files(dst)
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(f"wrote {dst}: ") and "x smaller" in last and f"pushed to {server.url}/me/model-FP8" in last
        assert any(r["auth"] == f"Bearer {TOKEN}" for r in server.requests)
        texts = [proc.stdout, proc.stderr, report.read_text()] + [p.read_bytes().decode("latin-1") for p in dst.rglob("*") if p.is_file()]
        assert not any(TOKEN in t for t in texts)
    finally:
        server.stop()


def test_quantize_push_cli_retargets_the_card_and_writes_its_json(hub, no_xet, tiny_llama, tmp_path):
    dst, out = str(tmp_path / "out"), str(tmp_path / "push.json")
    convert(tiny_llama, dst, algo="W4A16_NVFP4", quiet=True)
    assert "vllm serve ./out" in open(os.path.join(dst, "README.md")).read() and str(tmp_path) not in open(os.path.join(dst, "README.md")).read()
    r = CliRunner().invoke(main, ["push", dst, "org/tiny-W4A16", "--private", "--json", out])
    assert r.exit_code == 0, r.output
    assert r.output.strip().splitlines()[-1].startswith(f"pushed {dst} to {hub.url}/org/tiny-W4A16 (main, commit ")
    card = hub.files("org/tiny-W4A16")["README.md"].decode()
    assert "vllm serve org/tiny-W4A16" in card and "vllm serve ./out" not in card
    doc = json.load(open(out))
    assert doc["schema_version"] == 1 and doc["repo_id"] == "org/tiny-W4A16" and doc["private"] is True
    assert hub.repos["org/tiny-W4A16"]["private"] is True


def test_an_existing_repo_is_reused(hub, no_xet, tiny_llama, tmp_path):
    dst = str(tmp_path / "out")
    convert(tiny_llama, dst, algo="FP8", quiet=True)
    push(dst, "me/m", quiet=True)
    first = [r for r in hub.requests if r["path"] == "/api/repos/create"]
    push(dst, "me/m", quiet=True)  # create_repo answers 409; exist_ok goes on
    assert len([r for r in hub.requests if r["path"] == "/api/repos/create"]) == len(first) + 1
    assert hub.files("me/m") == local_files(dst)


def test_torch_is_not_needed_to_import_publish():
    """publish.py imports huggingface_hub and torch lazily (the CLI's --help stays instant)."""
    code = "import sys, quantize_cli.output.publish, quantize_cli.output.card; print('torch' in sys.modules, 'huggingface_hub' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.split()
    assert out == ["False", "False"]
    assert torch  # keeps the import used: this module itself needs torch for the fixtures
    assert huggingface_hub


def test_a_failed_verify_never_uploads(hub, tiny_llama, tmp_path, monkeypatch):
    import quantize_cli.verify as verify_mod
    from quantize_cli.errors import CheckFailed

    real = verify_mod.verify_checkpoint

    def failing(folder, source=None, method=None):
        res = real(folder, source, method)
        res.add("error", "tensors", "model.layers.0.mlp.up_proj.weight", "injected: a finding verify would raise")
        return res

    monkeypatch.setattr(verify_mod, "verify_checkpoint", failing)
    with pytest.raises(CheckFailed, match="--verify found 1 error"):
        convert(tiny_llama, str(tmp_path / "o"), algo="FP8_PB_WO", verify=True, push_to_hub="me/m", quiet=True)
    assert uploads(hub) == [] and not os.path.exists(tmp_path / "o")


# -- access checked before the first byte (issue 26) ------------------------------------------------


def test_access_is_checked_before_converting(hub, tiny_llama, tmp_path, monkeypatch):
    """No token, a token the Hub rejects, a read-only token, someone else's namespace, a repo this
    user may not write: each refused before anything is converted (DST never appears, nothing is
    uploaded), with a one-line, token-free message that says nothing was converted."""
    from quantize_cli.output.publish import check_push_access

    def refused(repo, words):
        with pytest.raises(PublishError) as exc:
            convert(tiny_llama, str(tmp_path / "o"), algo="FP8_PB_WO", push_to_hub=repo, quiet=True)
        assert words in exc.value.message and "nothing was converted" in exc.value.message, exc.value.message
        assert TOKEN not in exc.value.message and not os.path.exists(tmp_path / "o") and uploads(hub) == []

    assert check_push_access("me/new-model") == "me"  # a new repo in the user's namespace
    assert check_push_access("team/new-model") == "me"  # ... or in an organisation with the write role
    refused("someone-else/m", "me cannot create repos under 'someone-else'")
    hub.repos["someone-else/shared"] = {"private": False, "branches": {"main": {}}}
    hub.read_only.add("someone-else/shared")
    refused("someone-else/shared", "may not write to this repo")
    hub.whoami["orgs"] = [{"name": "team", "roleInOrg": "read"}]
    refused("team/m", "read role in the organisation 'team'")
    hub.whoami["auth"]["accessToken"] = {"role": "fineGrained", "fineGrained": {"scoped": [
        {"entity": {"type": "user", "name": "me"}, "permissions": ["repo.content.read"]}]}}
    refused("me/m", "no repo.write permission on 'me'")
    hub.whoami["auth"]["accessToken"]["fineGrained"]["scoped"][0]["permissions"].append("repo.write")
    assert check_push_access("me/m") == "me"
    hub.whoami["auth"]["accessToken"] = {"role": "read"}
    refused("me/m", "the token of me is read-only")
    hub.echo_token_status = 401
    refused("me/m", "the token is not valid")
    hub.echo_token_status = None
    monkeypatch.delenv("HF_TOKEN")
    refused("me/m", "no Hugging Face token; set HF_TOKEN")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    refused("me/m", "HF_HUB_OFFLINE is set")


def test_a_dry_run_checks_no_access(hub, tiny_llama):
    """A dry run publishes nothing, so it asks the Hub nothing (it works offline and without a token)."""
    convert(tiny_llama, None, algo="FP8_PB_WO", push_to_hub="someone-else/m", dry_run=True, quiet=True)
    assert hub.requests == []
