"""Activation weights of the scale search: which input channels' errors matter, and by how much.

A Linear computes ``y = W x``; quantizing ``W`` to ``W + E`` adds ``E x`` to its output. Over
calibration inputs with per-channel mean square ``c_j = E[x_j^2]`` (the diagonal of the layer's
input Hessian ``X^T X / n``), the expected output error of row i is, ignoring the cross terms,
``sum_j c_j E_ij^2``. The searched scale of a group therefore minimizes ``sum_j c_j (w_j - q_j)^2``
over the group's elements ``j`` (its input channels). Round-to-nearest and the plain (data-free)
search treat every channel alike (``c_j = 1``); a model with massive activations (an input channel
reaching thousands, as in many decoder LLMs) amplifies the error of that channel's column by
thousands, and only the weighted search knows it.

Only the ratios within a group decide its argmin, so the weights are divided by the group's
largest (:func:`normalized`, on the CPU: the same bits for every device), which keeps the int64
error sums of :mod:`.search` in range whatever the magnitude of ``c``.
"""

from __future__ import annotations

import torch


def check(cw: torch.Tensor | None, k: int, batch: int | None = None) -> torch.Tensor | None:
    """`cw` as fp32 (``[K]``, or ``[batch, K]`` for a stack); ValueError naming the rule otherwise.

    Args:
        cw: per input channel weights (``E[x_j^2]``), finite and >= 0; None: unweighted.
        k: in-features of the weight.
        batch: items of a stack (``[K]`` is then shared by all of them).
    """
    if cw is None:
        return None
    shapes = [(k,)] + ([(batch, k)] if batch is not None else [])
    if tuple(cw.shape) not in shapes:
        raise ValueError(f"channel_weights must have shape {' or '.join(str(list(s)) for s in shapes)} "
                         f"(one weight per input channel), got {list(cw.shape)}")
    if not cw.is_floating_point():
        raise ValueError(f"channel_weights must be a float tensor, got {cw.dtype}")
    cw = cw.float()
    if not bool(torch.isfinite(cw).all()) or bool((cw < 0).any()):
        raise ValueError("channel_weights must be finite and >= 0 (mean squares of the inputs); recalibrate")
    return cw


def normalized(cw: torch.Tensor, width: int, device=None) -> torch.Tensor:
    """fp64 ``[..., K]`` on `device`: `cw` ``[..., K]`` divided by its max over each chunk of `width`
    columns (the last one may be shorter); an all-zero chunk stays zero.

    Computed on the CPU (IEEE fp64 division, correctly rounded) and then moved, so the reference
    and the kernels, which both call this, use the same bits whatever the device; equal weights
    become exactly 1.0, which makes the weighted search the unweighted one, bit for bit.
    """
    k = cw.shape[-1]
    chunks = -(-k // width)
    w64 = torch.nn.functional.pad(cw.detach().cpu().double(), (0, chunks * width - k)).reshape(*cw.shape[:-1], chunks, width)
    top = w64.amax(dim=-1, keepdim=True)
    out = w64 / torch.where(top > 0, top, torch.ones_like(top))
    return out.reshape(*cw.shape[:-1], chunks * width)[..., :k].contiguous().to(device if device is not None else cw.device)


__all__ = ["check", "normalized"]
