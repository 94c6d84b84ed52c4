"""Input checks and launch facts shared by the kernel wrappers (pure torch: no Triton import).

Wrappers accept what the torch references accept and refuse the rest with a ``ValueError`` that
names the argument, what it was, and what to do instead.
"""

from __future__ import annotations

import os

import torch

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_BATCH = 65535  # the batch (expert) index is grid axis 1, which CUDA caps at 65535


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``, tests only)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_weight(w, ndim: int, what: str = "w") -> torch.Tensor:
    """Validate a weight (``ndim`` = 2: ``[N, K]``; 3: a stack ``[E, N, K]``); return it contiguous."""
    if not isinstance(w, torch.Tensor):
        raise ValueError(f"{what} must be a torch.Tensor, got {type(w).__name__}")
    if w.dim() != ndim:
        layout = "[N, K]" if ndim == 2 else "[E, N, K]"
        raise ValueError(f"{what} must be {ndim}-D {layout}, got shape {list(w.shape)}")
    if w.numel() == 0:
        raise ValueError(f"{what} must be non-empty, got shape {list(w.shape)}")
    if w.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{what} must be bfloat16, float16 or float32, got {w.dtype}; convert it first")
    if w.device.type == "cpu" and not interpreting():
        raise ValueError(
            f"{what} is on the CPU: the Triton kernels need a CUDA tensor. Use scheme.quantize() on the "
            "CPU (or set TRITON_INTERPRET=1 to run the kernels in Triton's interpreter, for tests)"
        )
    if w.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{what} must be on a CUDA device, got {w.device}")
    if ndim == 3 and w.shape[0] > MAX_BATCH:
        raise ValueError(f"{what} stacks {w.shape[0]} weights; at most {MAX_BATCH} per call, split the stack")
    return w.contiguous()


def check_global_amax(global_amax, batch: int | None, device: torch.device) -> torch.Tensor | None:
    """A precomputed global amax as fp32 on `device`: 0-d for one weight, 0-d or ``[E]`` for a stack.

    Returns ``[batch]`` (a 0-d value repeated) or None when none was given.
    """
    if global_amax is None:
        return None
    if not isinstance(global_amax, torch.Tensor):
        raise ValueError(f"global_amax must be a 0-d float32 tensor, got {type(global_amax).__name__}")
    if not global_amax.is_floating_point():
        raise ValueError(f"global_amax must be a floating tensor, got {global_amax.dtype}")
    ok_shapes = [()] if batch is None else [(), (batch,)]
    if tuple(global_amax.shape) not in ok_shapes:
        want = "0-d" if batch is None else f"0-d or [{batch}]"
        raise ValueError(f"global_amax must be {want}, got shape {list(global_amax.shape)}")
    g = global_amax.to(device=device, dtype=torch.float32)
    return g.reshape(1) if batch is None else g.expand(batch).contiguous()


def soft_fp8(device: torch.device) -> bool:
    """Round to e4m3 in software (exact everywhere) rather than with the hardware cast?

    Yes under the interpreter (its cast is not nearest-even) and on GPUs before sm_89, which have no
    e4m3 conversion instruction.
    """
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) < (8, 9)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors on `device` (a small stand-in under the interpreter)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
