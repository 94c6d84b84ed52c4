"""FP8 e4m3 reference: per-tensor, per-row and 128x128-block scales (design §4.1, spec §2.1-2.3).

One routine, :func:`quantize_blocks`, serves all three: they are the same "amax over a block ->
scale" with blocks of ``(N, K)``, ``(1, K)`` and ``(128, 128)`` (torchao's granularity idea).

    scale = amax / 448 over the group (an all-zero group gets 1.0), fp32
    q     = e4m3(clamp(w_fp32 / scale, -448, 448))          fp32 divide, then one rounding

The clamp makes torch (NaN above 464) and Triton (saturating) casts agree; it never changes a
value here because |w / scale| <= 448 up to one rounding, which e4m3 rounds to 448 anyway.
Per-tensor FP8 divides in fp32 (the golden ``expected.weight``), not through ModelOpt's bf16
quotient: it is more accurate and no loader can tell.

torch is imported inside the numeric functions: the scheme classes describe their outputs
without it (planning, ``check`` and ``--dry-run`` import no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..algorithms import E4M3_MAX, FP8_BLOCK
from .base import Scheme, Spec

if TYPE_CHECKING:
    import torch

BLOCK = FP8_BLOCK
MODELOPT_FP8 = {"dynamic": False, "num_bits": 8, "type": "float"}  # ModelOpt's group config of 8-bit float codes


def fp8_cast(x: torch.Tensor) -> torch.Tensor:
    """Clamp fp32 `x` (in place: callers pass a temporary) to the e4m3 range and cast (RNE)."""
    import torch

    return x.clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _fp32(w: torch.Tensor) -> torch.Tensor:
    """An fp32 copy of `w` that the caller may modify in place (never `w` itself)."""
    import torch

    return w.float() if w.dtype != torch.float32 else w.clone()


def block_shape(granularity: str, shape: tuple[int, int]) -> tuple[int, int]:
    """The ``(bn, bk)`` block one scale covers: ``tensor`` ``(N, K)``, ``channel`` ``(1, K)``, ``block`` 128 x 128."""
    n, k = shape
    return {"tensor": (max(n, 1), max(k, 1)), "channel": (1, max(k, 1)), "block": (BLOCK, BLOCK)}[granularity]


def quantize_blocks(w: torch.Tensor, block: tuple[int, int], amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The one FP8 scale routine: amax over each `block` of `w` ``[N, K]`` -> fp32 scale ``[nb, kb]``
    (amax / 448, an all-zero block 1.0) -> e4m3 ``w / scale`` (fp32 divide, one rounding).

    `amax`: ``[nb, kb]`` (or 0-d for one block) overriding max |w|, e.g. a fused group's shared
    per-tensor amax. Per tensor, per row and 128 x 128 blocks differ only in `block`
    (:func:`block_shape`); the division is elementwise, so the bytes do not depend on the view.
    """
    from .numerics import block_amax, expand_blocks, scale_from_amax

    n, k = w.shape
    bn, bk = block
    amax = block_amax(w, block) if amax is None else amax.float().to(w.device).reshape(-(-n // bn), -(-k // bk))
    scale = scale_from_amax(amax, E4M3_MAX)  # [nb, kb]
    if n % bn == 0 and k % bk == 0:  # broadcast over a 4-D view: no expanded scale copy
        q = _fp32(w).reshape(n // bn, bn, k // bk, bk).div_(scale[:, None, :, None])
        return fp8_cast(q).reshape(n, k), scale
    return fp8_cast(_fp32(w).div_(expand_blocks(scale, block, (n, k)))), scale


@dataclass(frozen=True)
class Fp8PerTensor(Scheme):
    """``FP8``: one 0-d fp32 ``weight_scale``; static 0-d ``input_scale``."""

    modelopt_single_group = True

    def modelopt_group(self, group_size):
        return {"input_activations": dict(MODELOPT_FP8), "weights": dict(MODELOPT_FP8)}

    def outputs(self, shape):
        out: dict[str, Spec] = {"weight": ("F8_E4M3", tuple(shape)), "weight_scale": ("F32", ())}
        out["input_scale"] = ("F32", ())
        return out

    def quantize(self, w, global_amax=None):
        amax = self.global_amax(w) if global_amax is None else global_amax
        q, scale = quantize_blocks(w, block_shape("tensor", w.shape), amax)
        return {"weight": q, "weight_scale": scale.reshape(()), "input_scale": self.input_scale_tensor}

    def dequantize(self, q):
        return q["weight"].float() * q["weight_scale"].to(q["weight"].device)


@dataclass(frozen=True)
class Fp8PerChannel(Scheme):
    """``FP8_PER_CHANNEL_PER_TOKEN``: fp32 ``weight_scale [N]``, one per output row."""

    def modelopt_group(self, group_size):
        return {"input_activations": dict(MODELOPT_FP8), "weights": {**MODELOPT_FP8, "strategy": "channel"}}

    def outputs(self, shape):
        return {"weight": ("F8_E4M3", tuple(shape)), "weight_scale": ("F32", (shape[0],))}

    def quantize(self, w, global_amax=None):
        q, scale = quantize_blocks(w, block_shape("channel", w.shape))  # scale [N, 1]
        return {"weight": q, "weight_scale": scale.reshape(-1)}

    def dequantize(self, q):
        return q["weight"].float() * q["weight_scale"][:, None]


@dataclass(frozen=True)
class Fp8Block(Scheme):
    """``FP8_PB_WO``: fp32 ``weight_scale [ceil(N/128), 1, ceil(K/128), 1]``, one per 128x128 block."""

    @property
    def k_group(self) -> int:
        return BLOCK

    def shape_problem(self, shape):
        problem = super().shape_problem(shape)
        if problem is None and (shape[0] % BLOCK or shape[1] % BLOCK):
            problem = f"needs both dims divisible by {BLOCK} for 128x128 blocks (vLLM's FP8_PB_WO loader), got {list(shape)}"
        return problem

    def outputs(self, shape):
        n, k = shape
        return {"weight": ("F8_E4M3", (n, k)), "weight_scale": ("F32", (-(-n // BLOCK), 1, -(-k // BLOCK), 1))}

    def quantize(self, w, global_amax=None):
        q, scale = quantize_blocks(w, block_shape("block", w.shape))  # scale [nb, kb]
        return {"weight": q, "weight_scale": scale[:, None, :, None].contiguous()}

    def dequantize(self, q):
        from .numerics import expand_blocks

        w = q["weight"]
        s = q["weight_scale"][:, 0, :, 0].to(w.device)
        n, k = w.shape
        if n % BLOCK == 0 and k % BLOCK == 0:  # broadcast over a 4-D view: no expanded scale copy
            return w.float().reshape(n // BLOCK, BLOCK, k // BLOCK, BLOCK).mul_(s[:, None, :, None]).reshape(n, k)
        return w.float() * expand_blocks(s, (BLOCK, BLOCK), (n, k))
