"""How much a searched scale beats round-to-nearest: the baseline ``--report`` and ``verify --source`` show.

The RTN reconstruction of a source weight under the global scale the output was written with, and
the error reduction against it. Kept apart from the search itself (search.py) and from the scheme
(searched.py): both are needed here, neither needs this.
"""

from __future__ import annotations

import math

import torch

from .base import Scheme
from .numerics import square_sums
from .nvfp4 import Nvfp4, block_scales
from .search import nvfp4_payload
from .searched import Searched, searchable


def rtn_dequantize(scheme: Scheme, w: torch.Tensor, written: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """fp32 RTN reconstruction of source ``w`` under the written global scale (None: not searchable).

    The baseline of the error reduction shown by ``--report`` and ``verify --source``."""
    base = getattr(scheme, "base", None) or scheme
    if not searchable(base):
        return None
    if isinstance(base, Nvfp4):
        wsf2 = written["weight_scale_2"].float().to(w.device)
        bs8 = block_scales(w, wsf2)
        return base.dequantize({"weight": nvfp4_payload(w, bs8, wsf2), "weight_scale": bs8, "weight_scale_2": wsf2})
    return base.dequantize(base.quantize(w))


def searched_baseline(scheme: Scheme, w: torch.Tensor, written: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The RTN reconstruction for a :class:`Searched` scheme's report, None for any other scheme."""
    return rtn_dequantize(scheme, w, written) if isinstance(scheme, Searched) else None


def compare_with_rtn(scheme: Scheme, w: torch.Tensor, written: dict[str, torch.Tensor], deq: torch.Tensor) -> dict:
    """:func:`error_reduction` of the written tensors (dequantized `deq`) against RTN of source `w`."""
    rtn = rtn_dequantize(scheme, w, written)
    if rtn is None:
        return {}
    return error_reduction(*square_sums(w, deq, rtn))


def error_reduction(signal: float, noise: float, noise_rtn: float) -> dict:
    """Report fields comparing a searched tensor's squared error `noise` with RTN's `noise_rtn`."""

    def db(n):
        return math.inf if n == 0 else (10 * math.log10(signal / n) if signal else -math.inf)

    return {"rtn_sqnr_db": db(noise_rtn), "sqnr_gain_db": (db(noise) - db(noise_rtn)) if noise and noise_rtn else 0.0,
            "mse_reduction": (1 - noise / noise_rtn) if noise_rtn else 0.0}


__all__ = ["rtn_dequantize", "searched_baseline", "compare_with_rtn", "error_reduction"]
