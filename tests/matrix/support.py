"""Shared by the matrix and tests/test_interactions.py: SCALES.json of the example, a fake Hub, a local
Ray instance and an interruption after N journaled units of work. Fixtures wrap these (conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os

import pytest

from tests.fakehub import FakeHub
from tests.hostile.helpers import invoke

CALIB = os.path.join(os.path.dirname(os.path.dirname(__file__)), "golden", "checkpoints", "calibration.jsonl")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKEN = "hf_" + "M8" * 17


def calibrate_example(path: str, example: str = "example:tiny-llama") -> tuple[str, dict, dict]:
    """``quantize calibrate`` on `example` with the golden calibration text; ``(path, {module: amax}, {attention: {k_amax, v_amax}})``."""
    r = invoke("calibrate", example, "--calib-data", CALIB, "-o", path, "--device", "cpu", "-q")
    assert r.exit_code == 0, r.output
    doc = json.load(open(path))
    assert doc["modules"] and doc["kv"]
    return path, {m: e["amax"] for m, e in doc["modules"].items()}, doc["kv"]


@contextlib.contextmanager
def fake_hub(token_dir: str):
    """A fake Hub (tests/fakehub.py); huggingface_hub points at it with a token, through LFS (no Xet)."""
    from huggingface_hub import constants

    server = FakeHub(lifetime_s=3600).start()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(constants, "ENDPOINT", server.url)
            mp.setattr(constants, "HF_TOKEN_PATH", os.path.join(token_dir, "no-login-token"))
            mp.setattr(constants, "HF_HUB_DISABLE_XET", True)
            mp.setenv("HF_TOKEN", TOKEN)
            yield server
    finally:
        server.stop()


@contextlib.contextmanager
def local_ray():
    """A local 2-CPU Ray instance (workers import this checkout)."""
    import ray

    path = os.pathsep.join([REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    # address="local": a new instance even where a `ray start` cluster, or a stale
    # /tmp/ray/ray_current_cluster left by a killed run, is on this machine (ray.init() would join it).
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        yield ray
    finally:
        ray.shutdown()


@contextlib.contextmanager
def interrupted_after(n: int):
    """Ctrl-C (KeyboardInterrupt) once `n` units of work are journaled: tasks (local) or shards (the Ray driver).

    The one hook into the converter's insides these tests need: the resume journal's append, which
    both executors call after a unit's bytes are written. (Adapt here if the journal moves.)
    Yields a one-item list: how many units were journaled.
    """
    from quantize_cli.output import journal as resume

    real, count = resume.Journal.append, [0]

    def append(self, *args, **kwargs):
        real(self, *args, **kwargs)
        count[0] += 1
        if count[0] == n:
            raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(resume.Journal, "append", append)
        yield count


@contextlib.contextmanager
def forward_calls():
    """Count the calibration forwards (``quantize_cli.calibration.calibrate``: statistics, GPTQ and smoothing
    all run inside it). Yields a one-item list. (Adapt here if the forward's entry point moves.)"""
    from quantize_cli import calibration

    real, count = calibration.calibrate, [0]

    def calibrate(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calibration, "calibrate", calibrate)
        yield count


@contextlib.contextmanager
def numerics_bumped():
    """This process as the next byte-deciding version: ``quantize_cli.NUMERICS_VERSION`` + 1 and the converter
    string derived from it (``CONVERTER``, bound at import where the identity and the GPTQ request read it)."""
    import quantize_cli
    from quantize_cli.output import identity

    version = quantize_cli.NUMERICS_VERSION + 1
    converter = f"{quantize_cli.__version__}+numerics.{version}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quantize_cli, "NUMERICS_VERSION", version)
        for module in (quantize_cli, identity):
            mp.setattr(module, "CONVERTER", converter)
        yield converter


def side_files(root: str) -> dict[str, tuple[int, int]]:
    """``{path: (size, mtime_ns)}`` of every file in a GPTQ / smoothing side folder under `root` (``.DST.weights``
    beside DST, or ``.weights`` inside the work folder): what a refused second run must not touch."""
    out = {}
    for folder, _, files in os.walk(root):
        if any(part.endswith(".weights") for part in os.path.relpath(folder, root).split(os.sep)):
            for f in files:
                st = os.stat(os.path.join(folder, f))
                out[os.path.join(folder, f)] = (st.st_size, st.st_mtime_ns)
    return out
