"""Shared fixtures: golden vectors, synthetic checkpoints in tmp_path, byte-exact comparison."""

from __future__ import annotations

import importlib.util
import os
import re
import sys

import pytest
import torch
from safetensors.torch import load_file

from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors, write_checkpoint

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
PYPROJECT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")


def extra_test_packages() -> list[str]:
    """The import names the test install must have: the ``test`` extra of pyproject.toml, and Triton
    (a dependency on Linux; the kernel tests run it in its CPU interpreter)."""
    text = open(PYPROJECT, encoding="utf-8").read()
    extra = re.search(r"^test\s*=\s*\[(.*?)\]", text, re.M | re.S).group(1)
    names = [re.match(r"[A-Za-z0-9_.-]+", d.strip().strip('"')).group(0) for d in extra.split(",") if d.strip()]
    return [n.lower().replace("-", "_") for n in names] + (["triton"] if sys.platform.startswith("linux") else [])


def missing_test_packages(find=importlib.util.find_spec) -> list[str]:
    return [n for n in extra_test_packages() if find(n) is None]


def pytest_configure(config):
    """A package of the test extra that is missing fails the run here, instead of its tests skipping."""
    # The GPU machine has no registry: QUANTIZE_TESTS_WITHOUT=ray lets `-m gpu` run there without the
    # packages named (their tests then fail, never skip). CI never sets it.
    allowed = set(filter(None, os.environ.get("QUANTIZE_TESTS_WITHOUT", "").split(",")))
    missing = [n for n in missing_test_packages() if n not in allowed]
    if missing:
        raise pytest.UsageError(f"the test install lacks {', '.join(missing)}; install it with pip install -e '.[test]' "
                                "(the tests that need it fail rather than skip)")


def convert(src, dst=None, console=None, **options):
    """``api.convert`` called with keywords: the library takes one ConvertOptions; tests build it here."""
    from quantize_cli.api import convert as run
    from quantize_cli.plan.options import ConvertOptions

    return run(ConvertOptions(src=src, dst=dst, **options), console)


def golden_case(name: str) -> dict[str, torch.Tensor]:
    """Tensors of golden case `name` (``input.*`` and ``expected.*``)."""
    return load_file(os.path.join(GOLDEN, "tensors", f"{name}.safetensors"))


def golden_checkpoint(name: str) -> str:
    return os.path.join(GOLDEN, "checkpoints", name)


def load_all(folder) -> dict[str, torch.Tensor]:
    """Every tensor of every safetensors shard in `folder`."""
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(folder, f)))
    return out


def output_files(folder) -> dict[str, bytes]:
    """Every file of a converted checkpoint by name, except the model card (README.md names its own
    DST and command line, so it differs between any two outputs; tests/test_card.py checks it) and
    hidden bookkeeping (.quantize-checksums records how and where each output was made)."""
    return {f: open(os.path.join(folder, f), "rb").read() for f in sorted(os.listdir(folder))
            if f != "README.md" and not f.startswith(".")}


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, same shape, same bytes (0-d stays 0-d; -0.0 and +0.0 differ)."""
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def assert_same_bytes(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert tuple(a.shape) == tuple(b.shape), f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    ua = a.contiguous().reshape(-1).view(torch.uint8)
    ub = b.contiguous().reshape(-1).view(torch.uint8)
    bad = (ua != ub).nonzero()
    assert bad.numel() == 0, f"{what}: {bad.numel()} byte(s) differ, first at byte {bad[0].item()}"


@pytest.fixture
def make_checkpoint(tmp_path):
    """Factory: ``make_checkpoint(tensors, config, shards=1, name="src") -> path``."""

    def make(tensors, config, shards=1, name="src", sidecars=True):
        return write_checkpoint(str(tmp_path / name), tensors, config, shards=shards, sidecars=sidecars)

    return make


@pytest.fixture
def tiny_llama(make_checkpoint):
    """A 2-layer bf16 Llama (hidden 256) in 2 shards; k_proj x0.25 and up_proj x4 so fused scales differ."""
    cfg = llama_config()
    t = llama_tensors(cfg, seed=1)
    t["model.layers.0.self_attn.k_proj.weight"] *= 0.25
    t["model.layers.1.mlp.up_proj.weight"] *= 4
    return make_checkpoint(t, cfg, shards=2)


@pytest.fixture
def default_stop_handlers():
    """SIGINT, SIGTERM and SIGHUP at Python's defaults for the test, restored after: a suite started in
    the background (`cmd &` ignores SIGINT, `nohup` SIGHUP) would otherwise test the ignored case."""
    import signal

    wanted = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL, signal.SIGHUP: signal.SIG_DFL}
    before = {s: signal.getsignal(s) for s in wanted}
    for s, h in wanted.items():
        signal.signal(s, h)
    yield
    for s, h in before.items():
        signal.signal(s, h)


@pytest.fixture(scope="session")
def example_scales(tmp_path_factory):
    """SCALES.json of ``example:tiny-llama`` made once per session with ``quantize calibrate`` on the golden
    calibration text: ``(path, {module: amax}, {attention: {"k_amax", "v_amax", ...}})``."""
    from tests.matrix.support import calibrate_example

    return calibrate_example(str(tmp_path_factory.mktemp("example-scales") / "scales.json"))
