"""Kernel tests: on a machine without CUDA the kernels run in Triton's CPU interpreter.

``TRITON_INTERPRET`` is read when a kernel is decorated (module import), so it is set here, before
any test module imports ``quantize_cli.kernels.*``. The interpreter needs numpy (test extra).
Helpers (test weights, tie tables, the byte comparison) live in ``kernel_helpers.py``.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy  # noqa: E402,F401  Triton's interpreter needs it; both are in the test install (tests/conftest.py checks)
import triton  # noqa: E402,F401

from kernel_helpers import weight  # noqa: E402  (after TRITON_INTERPRET is set)


@pytest.fixture
def device() -> torch.device:
    """Where the kernels run: the GPU when there is one, else the CPU (through the interpreter)."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


@pytest.fixture
def make_weight(device):
    """``make_weight(shape, dtype=bf16, seed=0)``: :func:`kernel_helpers.weight` on the test device."""

    def make(shape, dtype=torch.bfloat16, seed=0):
        return weight(shape, dtype, seed).to(device)

    return make
