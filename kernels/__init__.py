"""Triton kernels for every scheme, shipped as ``quantize_cli.kernels``.

Each kernel equals its torch reference in ``quantize_cli.schemes`` bit for bit: same keys, dtypes,
shapes and bytes. Nothing here imports Triton at import time; the kernel modules are imported on
first use, so ``import quantize_cli`` works on machines without Triton or a GPU.

Public API::

    quantize(scheme, w [N, K], global_amax=None)        == scheme.quantize(w, global_amax)
    quantize(searched, w, global_amax, channel_weights=cw [K]) == searched.quantize(w, global_amax, cw)
    quantize_stack(scheme, w [E, N, K], global_amax=None) == the E results stacked on dim 0
    global_amax(w [N, K]) -> 0-d fp32                   == scheme.global_amax(w)
    stack_global_amax(w [E, N, K]) -> [E] fp32
    block_amax(w [N, K], (bn, bk)) -> [ceil(N/bn), ceil(K/bk)] fp32 == numerics.block_amax

Example::

    from quantize_cli.kernels import quantize
    from quantize_cli.schemes import SCHEMES
    out = quantize(SCHEMES["NVFP4"], w.cuda())   # {"weight": uint8 [N, K/2], "weight_scale": ...}
"""

from __future__ import annotations

import functools

import torch

from ._validate import check_global_amax, check_weight


@functools.lru_cache(maxsize=None)
def has_triton() -> bool:
    """True when Triton imports (the kernels additionally need a CUDA tensor, or the interpreter)."""
    try:
        import triton  # noqa: F401
    except Exception:  # a broken install counts as absent: callers fall back to the torch reference
        return False
    return True


def can_run(device: torch.device | str) -> bool:
    """True when the kernels can run on `device` (CUDA with Triton, or Triton's interpreter)."""
    from ._validate import interpreting

    device = torch.device(device)
    return has_triton() and (device.type == "cuda" or (device.type == "cpu" and interpreting()))


def _scheme(scheme):
    from ..schemes import SCHEMES, Scheme, get_scheme
    from ..errors import UsageError

    if isinstance(scheme, Scheme):
        return scheme
    if isinstance(scheme, str):
        try:
            return get_scheme(scheme)
        except UsageError as exc:
            raise ValueError(str(exc)) from None
    raise ValueError(f"scheme must be a Scheme or an algorithm name ({', '.join(SCHEMES)}), got {scheme!r}")


def _run(scheme, w: torch.Tensor, gamax: torch.Tensor | None, channel_weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Dispatch one validated, contiguous stack ``w [B, N, K]`` (``gamax`` ``[B]`` or None;
    ``channel_weights`` ``[K]`` / ``[B, K]`` for a searched scheme, or None)."""
    from ..schemes.fp8 import Fp8Block, Fp8PerChannel, Fp8PerTensor
    from ..schemes.int4 import Int4Group
    from ..schemes.int8 import Int8PerChannel
    from ..schemes.mxfp8 import Mxfp8
    from ..schemes.nvfp4 import Nvfp4
    from ..schemes.numerics import NVFP4_GROUP

    if getattr(scheme, "scale_search", "none") != "none":  # --scale-search mse: kernels/scale_search.py
        from . import scale_search

        return scale_search.run(scheme, w, gamax, _amax, channel_weights)
    if channel_weights is not None:
        raise ValueError(f"channel_weights weight the scale search; {scheme.algo} without --scale-search mse takes none")
    if isinstance(scheme, Fp8PerTensor):
        from . import fp8_quant

        q, s = fp8_quant.quantize_per_tensor(w, _amax(w) if gamax is None else gamax)
        return {"weight": q, "weight_scale": s, "input_scale": scheme.input_scale_tensor}
    if isinstance(scheme, Fp8PerChannel):
        from . import fp8_quant

        q, s = fp8_quant.quantize_per_row(w)
        return {"weight": q, "weight_scale": s}
    if isinstance(scheme, Fp8Block):
        from . import fp8_quant

        q, s = fp8_quant.quantize_per_block(w)
        return {"weight": q, "weight_scale": s}
    if isinstance(scheme, Nvfp4):
        from . import nvfp4_quant

        if w.shape[-1] % NVFP4_GROUP:
            raise ValueError(
                f"{scheme.algo} needs in-features (last dim) divisible by {NVFP4_GROUP}, got shape {list(w.shape[-2:])}"
            )
        q, s, wsf2 = nvfp4_quant.quantize(w, _amax(w) if gamax is None else gamax)
        out = {"weight": q, "weight_scale": s, "weight_scale_2": wsf2}
        if scheme.static_input_scale is not None:
            out["input_scale"] = scheme.input_scale_tensor
        return out
    if isinstance(scheme, Int8PerChannel):
        from . import int8_quant

        q, s = int8_quant.quantize_per_row(w)
        return {"weight": q, "weight_scale": s}
    if isinstance(scheme, Mxfp8):
        from . import mxfp8_quant

        q, s = mxfp8_quant.quantize(w)
        return {"weight": q, "weight_scale": s}
    if isinstance(scheme, Int4Group):
        from . import int4_quant

        q, s = int4_quant.quantize(w)
        return {"weight": q, "weight_scale": s}
    raise ValueError(f"no Triton kernel for scheme {scheme.algo!r} ({type(scheme).__name__})")


def _amax(w: torch.Tensor) -> torch.Tensor:
    from .amax import stack_amax

    return stack_amax(w)


def quantize(scheme, w: torch.Tensor, global_amax: torch.Tensor | None = None,
             channel_weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Quantize one weight on the GPU, exactly as ``scheme.quantize(w, global_amax)`` does.

    Args:
        scheme: a :class:`~quantize_cli.schemes.Scheme` or its algorithm name (``"FP8_PB_WO"``).
        w: ``[N, K]`` bf16 / fp16 / fp32 CUDA tensor (made contiguous if it is not).
        global_amax: 0-d max |w| over the fused group, for schemes with a shared scale (``FP8``,
            ``NVFP4``, ``W4A16_NVFP4``); computed from `w` when None; ignored by the others.
        channel_weights: ``[K]`` activation weights of a searched scheme's search (the calibration's
            ``E[x_j^2]``, ``schemes/weighted.py``), or None.

    Returns:
        The reference's dict: same keys, dtypes, shapes (0-d stays 0-d) and bytes, on `w`'s device,
        except ``input_scale``, which is the reference's constant CPU tensor.

    Raises:
        ValueError: `w` or `global_amax` has a shape, dtype or device the kernels cannot take.
    """
    scheme = _scheme(scheme)
    w = check_weight(w, 2)
    gamax = check_global_amax(global_amax, None, w.device)
    out = _run(scheme, w.unsqueeze(0), gamax, channel_weights)
    return {k: v if k == "input_scale" else v[0] for k, v in out.items()}


def quantize_stack(scheme, w: torch.Tensor, global_amax: torch.Tensor | None = None,
                   channel_weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Quantize a stack of independent weights (MoE experts) in one launch per kernel.

    Args:
        w: ``[E, N, K]``; item e is quantized as ``scheme.quantize(w[e], global_amax[e])``.
        global_amax: None (each item's own amax), 0-d (shared by all) or ``[E]`` fp32.
        channel_weights: a searched scheme's activation weights, ``[K]`` (shared) or ``[E, K]``, or None.

    Returns:
        Each reference output stacked on a new dim 0 (0-d scales become ``[E]``), except
        ``input_scale``, the reference's constant 0-d CPU tensor.
    """
    scheme = _scheme(scheme)
    w = check_weight(w, 3)
    return _run(scheme, w, check_global_amax(global_amax, w.shape[0], w.device), channel_weights)


def global_amax(w: torch.Tensor) -> torch.Tensor:
    """0-d fp32 max |w| of ``w [N, K]`` (== ``Scheme.global_amax``); a fused group's global amax
    is the max of its members' values."""
    return _amax(check_weight(w, 2).unsqueeze(0)).reshape(())


def stack_global_amax(w: torch.Tensor) -> torch.Tensor:
    """fp32 ``[E]``: max |w[e]| of each weight of a stack ``w [E, N, K]``."""
    return _amax(check_weight(w, 3))


def block_amax(w: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """fp32 ``[ceil(N/bn), ceil(K/bk)]`` max |w| per ``block = (bn, bk)`` tile of ``w [N, K]``
    (== ``numerics.block_amax``): ``(1, K)`` per row, ``(128, 128)`` blocks, ``(1, 16)`` groups."""
    from .amax import stack_block_amax

    if len(block) != 2 or min(block) < 1:
        raise ValueError(f"block must be two positive sizes (bn, bk), got {block!r}")
    return stack_block_amax(check_weight(w, 2).unsqueeze(0), block)[0]


__all__ = ["has_triton", "can_run", "quantize", "quantize_stack", "global_amax", "stack_global_amax", "block_amax"]
