"""What GPTQ and the smoothing search observe in one block: input Hessians and channel statistics.

:class:`BlockStats` is a recorder for the taps of :mod:`.hooks` (``record(name, x)`` on every
Linear input, per expert for fused MoE experts), so the same hooks feed it and the amax
:class:`~.hooks.Recorder`. For every distinct input ``x [..., K]`` it keeps, in fp32 on x's device:

    hessian  sum over tokens of x^T x          [K, K]   (GPTQ; ``mean`` divides by the tokens)
    absum    sum over tokens of |x_j|          [K]      (AWQ's mean activation per channel)
    amax     max over tokens of |x_j|          [K]      (SmoothQuant; the smoothed input's amax)

Linears that receive the very same tensor object in a forward (q/k/v, gate/up, an expert's
gate/up) share one entry: the same input gives the same statistics, so the fused members of the
served model share their Hessian without a table of fused names. Tokens are summed in batch
order, so the same data gives the same bits; on the CPU each ``x^T x`` runs on one thread
(:mod:`.one_thread`: the BLAS splits the token sum by the thread count).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .one_thread import one_thread


@dataclass
class InputStats:
    """Statistics of one input (shared by the Linears that read it)."""

    tokens: int = 0
    hessian: torch.Tensor | None = None
    absum: torch.Tensor | None = None
    amax: torch.Tensor | None = None

    def mean_hessian(self) -> torch.Tensor:
        """``X^T X / T`` (fp32 ``[K, K]``)."""
        return self.hessian / max(self.tokens, 1)

    def mean_abs(self) -> torch.Tensor:
        return self.absum / max(self.tokens, 1)


@dataclass
class BlockStats:
    """Recorder of one block's Linear inputs (see the module doc).

    hessian: accumulate ``x^T x`` (GPTQ); channels: accumulate ``|x|`` sums and maxima (smoothing).
    """

    hessian: bool = True
    channels: bool = False
    inputs: dict[str, InputStats] = field(default_factory=dict)  # input key -> stats
    key: dict[str, str] = field(default_factory=dict)  # Linear (checkpoint name) -> its input key
    names: dict[int, str] = field(default_factory=dict)  # id(module) -> name (hooks.attach fills it)
    experts: dict[int, tuple] = field(default_factory=dict)  # id(experts module) -> (name, roles) (hooks.attach)
    _last: tuple | None = None  # (the last input tensor, its key): members reading the same tensor share it

    def record(self, name: str, x: torch.Tensor) -> None:
        last = self._last
        same = last is not None and last[0] is x
        if name not in self.key:
            self.key[name] = last[1] if same else name
        k = self.key[name]
        if same and last[1] == k:  # a fused member of the Linear just recorded: nothing new
            return
        self._last = (x, k)
        x2 = x.detach().reshape(-1, x.shape[-1]).float()
        st = self.inputs.setdefault(k, InputStats())
        st.tokens += x2.shape[0]
        if self.hessian:
            with one_thread(x2.device):  # the CPU's GEMM splits the token sum by thread count
                h = x2.t() @ x2
            st.hessian = h if st.hessian is None else st.hessian.add_(h)
        if self.channels:
            a = x2.abs()
            s, m = a.sum(0), a.amax(0)
            st.absum = s if st.absum is None else st.absum.add_(s)
            st.amax = m if st.amax is None else torch.maximum(st.amax, m)

    def record_kv(self, module, key, value) -> None:  # the attention tap: nothing to keep here
        pass

    def of(self, name: str) -> InputStats | None:
        """The statistics of Linear `name`'s input (None: it received no token)."""
        k = self.key.get(name)
        return self.inputs.get(k) if k is not None else None

    def release(self) -> None:
        self._last = None


__all__ = ["BlockStats", "InputStats"]
