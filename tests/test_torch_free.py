"""`quantize check` and `convert --dry-run` read headers only, so they import neither torch, nor
Triton, nor transformers (quantize_cli/planning.py). Each command runs in a fresh process, as CI
runs it, which reports its exit code and the heavy modules it imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from quantize_cli.devices import without_torch
from tests.families import FAMILIES, build

HEAVY = ("torch", "triton", "transformers")

# Runs the CLI in this fresh process and prints {"code", "heavy"} as the last line of stderr.
# QUANTIZE_TEST_HUB=<folder>: the Hub answers from that folder (headers, config.json, snapshot).
RUNNER = r"""
import json, os, struct, sys
from types import SimpleNamespace

hub = os.environ.get("QUANTIZE_TEST_HUB")
if hub:
    import huggingface_hub

    def metadata(repo, revision=None):
        files = {}
        for f in sorted(os.listdir(hub)):
            if f.endswith(".safetensors"):
                with open(os.path.join(hub, f), "rb") as fh:
                    doc = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
                doc.pop("__metadata__", None)
                files[f] = SimpleNamespace(tensors={n: SimpleNamespace(dtype=e["dtype"], shape=e["shape"], data_offsets=e["data_offsets"])
                                                    for n, e in doc.items()})
        return SimpleNamespace(files_metadata=files)

    def no_download(*args, **kwargs):
        raise AssertionError("downloaded weights")

    huggingface_hub.get_safetensors_metadata = metadata
    huggingface_hub.hf_hub_download = lambda repo, name, revision=None, **kw: os.path.join(hub, name)
    huggingface_hub.snapshot_download = no_download
    huggingface_hub.model_info = lambda repo, revision=None, **kw: SimpleNamespace(sha="0" * 40)  # --low-disk pins a commit

from quantize_cli.cli import main

try:
    main(sys.argv[1:])
    code = 0
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "heavy": sorted(m for m in %r if m in sys.modules)}), file=sys.stderr)
""" % (HEAVY,)


def run_fresh(*args, env: dict | None = None) -> tuple[int, list[str], str, str]:
    """(exit code, heavy modules imported, stdout, stderr without the report line) of one command."""
    r = subprocess.run([sys.executable, "-c", RUNNER, *map(str, args)], capture_output=True, text=True,
                       env={**os.environ, **(env or {})}, timeout=120)
    *err, last = r.stderr.rstrip("\n").split("\n")
    doc = json.loads(last)
    return doc["code"], doc["heavy"], r.stdout, "\n".join(err)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A dense Llama and two MoE checkpoints (per-expert Qwen3-MoE, DeepSeek-V3), bf16, 2 shards each."""
    from quantize_cli.checkpoint.example_weights import write_checkpoint

    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for name in ("llama", "qwen3_moe", "deepseek_v3"):
        cfg, shapes = FAMILIES[name]()
        out[name] = write_checkpoint(str(root / name), build(shapes), cfg, shards=2)
    return out


CHECKS = [
    ("llama", "FP8"), ("llama", "NVFP4"), ("llama", "INT8"), ("llama", "MXFP8"), ("llama", "FP8_PB_WO"),
    ("llama", "W4A16_NVFP4"), ("qwen3_moe", "NVFP4"), ("qwen3_moe", "FP8"), ("deepseek_v3", "MXFP8"),
]


@pytest.mark.parametrize("name,algo", CHECKS)
def test_check_imports_no_torch(checkpoints, name, algo):
    code, heavy, out, err = run_fresh("check", checkpoints[name], "--algo", algo)
    assert (code, heavy) == (0, []), err
    assert out.startswith(f"check: {checkpoints[name]}  algo {algo}  format modelopt") and "result: 0 error(s)" in out


@pytest.mark.parametrize("extra", [
    ("--format", "compressed-tensors"),
    ("--algo-for", "*down_proj=FP8"),
    ("--algo-for", "*down_proj=FP8", "--format", "compressed-tensors"),
    ("--tp", "2", "--recipe", "llama"),
])
def test_check_options_import_no_torch(checkpoints, tmp_path, extra):
    code, heavy, out, err = run_fresh("check", checkpoints["llama"], "--algo", "NVFP4", "--json", tmp_path / "c.json", *extra)
    assert (code, heavy) == (0, []), err
    assert json.load(open(tmp_path / "c.json"))["ok"] is True


def test_check_failure_is_the_same_without_torch(checkpoints):
    """A pattern that splits a fused group: exit 1, the usual finding and message, still no torch."""
    code, heavy, out, err = run_fresh("check", checkpoints["llama"], "--algo", "NVFP4", "--exclude", "*.k_proj")
    assert (code, heavy) == (1, [])
    assert "pattern-partial-group" in out and "check failed for" in err


def test_check_example_and_hub_id_import_no_torch(tmp_path, monkeypatch, checkpoints):
    """example:tiny-llama once generated (generating it needs torch: its weights are random), and a
    Hub repo id answered from headers (a weight download would raise)."""
    from quantize_cli.checkpoint.examples import example_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the subprocess inherits it
    example_path("tiny-llama")  # generated here, in the test's own process
    code, heavy, out, err = run_fresh("check", "example:tiny-llama", "--algo", "FP8")
    assert (code, heavy) == (0, []), err
    assert out.startswith("check: example:tiny-llama  algo FP8") and "result: 0 error(s)" in out
    code, heavy, out, err = run_fresh("convert", "example:tiny-llama", "--algo", "MXFP8", "--layout", "marlin", "--dry-run")
    assert (code, heavy) == (0, []), err
    assert out.startswith("plan: example:tiny-llama -> MXFP8")
    code, heavy, out, err = run_fresh("check", "someone/llama-test", "--algo", "NVFP4", env={"QUANTIZE_TEST_HUB": checkpoints["llama"]})
    assert (code, heavy) == (0, []), err
    assert out.startswith("check: someone/llama-test  algo NVFP4") and "result: 0 error(s)" in out


DRY_RUNS = [
    ("llama", "FP8", ()),
    ("llama", "NVFP4", ()),
    ("llama", "INT8", ()),
    ("llama", "MXFP8", ()),
    ("llama", "FP8_PB_WO", ()),
    ("llama", "NVFP4", ("--format", "compressed-tensors")),
    ("llama", "MXFP8", ("--format", "compressed-tensors")),
    ("llama", "NVFP4", ("--layout", "marlin")),
    ("llama", "FP8_PB_WO", ("--layout", "marlin")),
    ("llama", "NVFP4", ("--layout", "cutlass")),
    ("llama", "NVFP4", ("--layout", "flashinfer")),
    ("llama", "NVFP4", ("--algo-for", "*down_proj=FP8")),
    ("llama", "NVFP4", ("--scale-search", "mse", "--kv-cache-dtype", "fp8")),
    ("qwen3_moe", "NVFP4", ()),
    ("qwen3_moe", "FP8", ("--layout", "flashinfer")),
    ("qwen3_moe", "NVFP4", ("--algo-for", "*experts*=FP8", "--format", "compressed-tensors")),
    ("deepseek_v3", "NVFP4", ("--layout", "cutlass")),
    ("deepseek_v3", "MXFP8", ("--layout", "marlin")),
]


@pytest.mark.parametrize("name,algo,extra", DRY_RUNS)
def test_dry_run_imports_no_torch(checkpoints, name, algo, extra):
    code, heavy, out, err = run_fresh("convert", checkpoints[name], "--algo", algo, "--dry-run", *extra)
    assert (code, heavy) == (0, []), err
    target = "MIXED_PRECISION" if "--algo-for" in extra else algo
    assert out.startswith(f"plan: {checkpoints[name]} -> {target}")


def test_dry_run_refusal_is_the_same_without_torch(checkpoints):
    code, heavy, out, err = run_fresh("convert", checkpoints["llama"], "--algo", "INT8", "--layout", "flashinfer", "--dry-run")
    assert (code, heavy) == (1, [])
    assert "FlashInfer has no INT8 GEMM in vLLM 0.33.0" in err and "nothing was written" in err


def test_dry_run_report_on_cpu_imports_no_torch(checkpoints, tmp_path):
    report = tmp_path / "r.json"
    code, heavy, _, err = run_fresh("convert", checkpoints["llama"], "--algo", "FP8", "--dry-run", "--device", "cpu", "--report", report)
    assert (code, heavy) == (0, []), err
    doc = json.load(open(report))
    assert doc["status"] == "dry-run" and doc["options"]["device"] == "cpu"


def test_dry_run_report_with_auto_device_records_what_torch_resolves(checkpoints, tmp_path):
    """--report records the device a run would use: only torch can say what "auto" is."""
    import torch

    report = tmp_path / "r.json"
    code, heavy, _, err = run_fresh("convert", checkpoints["llama"], "--algo", "FP8", "--dry-run", "--report", report)
    assert code == 0 and "torch" in heavy, err
    assert json.load(open(report))["options"]["device"] == ("cuda" if torch.cuda.is_available() else "cpu")


def test_dry_run_hub_id_imports_no_torch(checkpoints):
    """--low-disk plans from the remote headers; nothing is downloaded and torch is not imported."""
    env = {"QUANTIZE_TEST_HUB": checkpoints["llama"]}
    code, heavy, out, err = run_fresh("convert", "someone/llama-test", "--algo", "FP8", "--low-disk", "--dry-run", env=env)
    assert (code, heavy) == (0, []), err
    assert out.startswith("plan: someone/llama-test -> FP8")


def test_device_is_kept_unresolved_only_where_nothing_reads_it():
    assert without_torch("auto", auto_is_read=False) == "auto"
    assert without_torch(None, auto_is_read=False) == "auto"
    assert without_torch("CPU", auto_is_read=True) == "cpu"
    assert without_torch("auto", auto_is_read=True) is None  # --report, --kernels triton
    assert without_torch("cuda", auto_is_read=False) is None  # only torch can check it (and fail)
    assert without_torch("tpu", auto_is_read=False) is None


@pytest.mark.parametrize("name", ["llama", "qwen3_moe"])
def test_inspect_imports_no_torch(checkpoints, name):
    """`quantize inspect` summarizes from headers and config only."""
    code, heavy, out, err = run_fresh("inspect", checkpoints[name])
    assert (code, heavy) == (0, []), err
    assert out.startswith(f"{checkpoints[name]}: 2 shards") and "BF16" in out and "not quantized" in out, out


def test_example_names_agree_with_their_generators():
    """examples.NAMES (torch-free, resolves example:NAME) lists exactly the generators example.py has."""
    from quantize_cli.checkpoint.example_weights import EXAMPLES
    from quantize_cli.checkpoint.examples import NAMES

    assert tuple(EXAMPLES) == NAMES
