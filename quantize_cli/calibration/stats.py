"""Per-input-channel statistics of every Linear input, accumulated in the calibration forward.

:class:`ChannelEnergy` keeps, per checkpoint module name, ``sum over tokens of x_j^2`` for every
input channel j of ``x [..., K]`` and the number of tokens: the diagonal of the input Hessian
``X^T X``. Divided by the tokens it is ``E[x_j^2]``, which weights the scale search
(``--scale-search mse`` with calibration data, ``schemes/weighted.py``).

Any object with ``add(name, x)`` can observe the same forward: :class:`~.hooks.Recorder` calls
every observer in its ``observers`` list with each Linear input it records (the per-expert routed
tokens of MoE experts included), so a full-Hessian accumulator (GPTQ) can sit beside this one.

Squares and sums are fp64 on the activations' device (the square of a bf16/fp16/fp32 value is
exact there), taken per chunk of tokens (the fp64 squares of a whole 8192-token batch of a
14336-wide input would be ~0.9 GB); batches arrive in a fixed order, so the result is the same
on every run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

CHUNK_TOKENS = 512  # tokens squared at once: bounds the temporary to CHUNK_TOKENS x K fp64 (59 MB at K 14336)


@dataclass
class ChannelEnergy:
    """``sums[name]``: fp64 ``[K]`` sum of ``x_j^2`` over ``tokens[name]`` tokens."""

    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, x: torch.Tensor) -> None:
        """Fold the tokens of ``x [..., K]`` (every leading dim is a token) into `name`'s sums."""
        x = x.detach()
        if x.dim() == 0 or x.shape[-1] == 0:
            return
        flat = x.reshape(-1, x.shape[-1])
        acc = self.sums.get(name)
        if acc is None:
            acc = self.sums[name] = torch.zeros(flat.shape[1], dtype=torch.float64, device=flat.device)
        elif acc.shape[0] != flat.shape[1]:
            raise ValueError(f"{name}: inputs of width {flat.shape[1]} after inputs of width {acc.shape[0]}")
        for t0 in range(0, flat.shape[0], CHUNK_TOKENS):
            acc += flat[t0 : t0 + CHUNK_TOKENS].double().square().sum(dim=0)  # squares of fp32 values are exact in fp64
        self.tokens[name] = self.tokens.get(name, 0) + flat.shape[0]

    def mean_squares(self) -> dict[str, torch.Tensor]:
        """fp32 CPU ``[K]`` ``E[x_j^2]`` per module that saw at least one token."""
        return {n: (s / self.tokens[n]).float().cpu() for n, s in self.sums.items() if self.tokens.get(n)}


__all__ = ["ChannelEnergy", "CHUNK_TOKENS"]
