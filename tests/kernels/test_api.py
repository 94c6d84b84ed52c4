"""Wrapper contract: validation errors, input normalisation, lazy Triton import."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from kernel_helpers import assert_same, reference

from quantize_cli import kernels
from quantize_cli.schemes import SCHEMES


def test_has_triton_reports_both_a_working_and_a_missing_install(monkeypatch):
    kernels.has_triton.cache_clear()  # the answer is cached per process
    assert kernels.has_triton()  # the test extra installs Triton (the interpreter runs the kernels here)
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    kernels.has_triton.cache_clear()
    try:
        assert not kernels.has_triton()
    finally:
        monkeypatch.undo()
        kernels.has_triton.cache_clear()
    assert kernels.has_triton()


@pytest.mark.parametrize(
    "bad, message",
    [
        (torch.ones(16), "2-D"),
        (torch.ones(2, 3, 16), "2-D"),
        (torch.ones(0, 16), "non-empty"),
        (torch.ones(4, 16, dtype=torch.int32), "bfloat16, float16 or float32"),
        (torch.ones(4, 16, dtype=torch.float64), "bfloat16, float16 or float32"),
        ([[1.0] * 16], "torch.Tensor"),
    ],
    ids=["1d", "3d", "empty", "int32", "float64", "list"],
)
def test_rejects_bad_weights(bad, message, device):
    if isinstance(bad, torch.Tensor):
        bad = bad.to(device)
    with pytest.raises(ValueError, match=message):
        kernels.quantize(SCHEMES["FP8_PB_WO"], bad)


def test_rejects_bad_global_amax(device):
    w = torch.ones(4, 16, device=device)
    with pytest.raises(ValueError, match="0-d"):
        kernels.quantize("FP8", w, torch.ones(2))
    with pytest.raises(ValueError, match="0-d float32 tensor"):
        kernels.quantize("FP8", w, 1.0)
    with pytest.raises(ValueError, match=r"0-d or \[2\]"):
        kernels.quantize_stack("NVFP4", torch.ones(2, 4, 16, device=device), torch.ones(3))


def test_rejects_unknown_scheme(device):
    with pytest.raises(ValueError, match="unknown algorithm"):
        kernels.quantize("FP16", torch.ones(4, 16, device=device))


def test_cpu_tensor_needs_interpreter(monkeypatch):
    """Outside the interpreter a CPU tensor is refused with a pointer to the torch reference."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="scheme.quantize"):
        kernels.quantize("INT8", torch.ones(4, 16))


def test_non_contiguous_and_names(make_weight):
    """A transposed (non-contiguous) weight and a scheme given by name (case-insensitive)."""
    w = make_weight((96, 130)).t()
    assert not w.is_contiguous()
    assert_same(kernels.quantize("fp8_pb_wo", w), reference(SCHEMES["FP8_PB_WO"], w), "transposed")
    assert_same(kernels.quantize("w8a16", w), reference(SCHEMES["INT8"], w), "transposed")


def test_import_is_lazy():
    """Importing the package and the kernels package pulls in no Triton."""
    code = "import sys, quantize_cli, quantize_cli.kernels; sys.exit('triton' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
