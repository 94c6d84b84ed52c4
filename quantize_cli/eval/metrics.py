"""What eval measures, as running sums (so logits never have to be held for all tokens).

Causal LMs, per scored position t (the prediction of token t + 1 of the same sample):

    nll       -log p(x[t+1])                               perplexity = exp(mean nll)
    KL        sum_v p_src(v) (log p_src(v) - log p_dst(v))   mean over positions (nats)
    top-1     argmax p_dst == argmax p_src                  fraction of positions
    delta     nll_dst - nll_src                             paired: mean and standard error

Encoders: the cosine of the mean-pooled last hidden states (sentence-transformers' pooling) of
each sample. Per layer: the accumulated error of the quantized model's hidden states,
``|h_dst - h_src| / |h_src|``, and the layer's own error, the quantized block run on the source's
inputs, relative to what the source block adds: ``|f_dst(h) - f_src(h)| / |f_src(h) - h|``.
All sums in fp64 on the host; the per-token arithmetic is fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class LMStats:
    """Running sums over scored positions of a causal LM (dst, and src when given)."""

    positions: int = 0
    nll_dst: float = 0.0
    nll_src: float = 0.0
    kl: float = 0.0
    top1: int = 0
    delta_sq: float = 0.0

    def add(self, logits_dst: torch.Tensor, targets: torch.Tensor, logits_src: torch.Tensor | None = None) -> None:
        """`logits_* [T, V]` predicting `targets [T]` (int64)."""
        lp_d = torch.log_softmax(logits_dst.float(), dim=-1)
        nll_d = -lp_d.gather(-1, targets[:, None])[:, 0]
        self.positions += int(targets.numel())
        self.nll_dst += float(nll_d.double().sum())
        if logits_src is None:
            return
        lp_s = torch.log_softmax(logits_src.float(), dim=-1)
        nll_s = -lp_s.gather(-1, targets[:, None])[:, 0]
        self.nll_src += float(nll_s.double().sum())
        self.kl += float(torch.nn.functional.kl_div(lp_d, lp_s, log_target=True, reduction="none").sum(-1).double().sum())
        self.top1 += int((lp_d.argmax(-1) == lp_s.argmax(-1)).sum())
        self.delta_sq += float(((nll_d - nll_s).double() ** 2).sum())

    def summary(self, with_source: bool) -> dict:
        n = max(self.positions, 1)
        out = {"positions": self.positions, "nll": self.nll_dst / n, "perplexity": _exp(self.nll_dst / n)}
        if not with_source:
            return out
        mean = (self.nll_dst - self.nll_src) / n
        var = max(self.delta_sq / n - mean * mean, 0.0)
        ppl_src = _exp(self.nll_src / n)
        out.update({
            "source_nll": self.nll_src / n, "source_perplexity": ppl_src,
            "perplexity_ratio": out["perplexity"] / ppl_src if ppl_src else math.inf,
            "perplexity_increase_pct": 100.0 * (out["perplexity"] / ppl_src - 1.0) if ppl_src else math.inf,
            "kl_mean": self.kl / n, "top1_agreement": self.top1 / n,
            "nll_delta": mean, "nll_delta_se": math.sqrt(var / n) if self.positions > 1 else 0.0,
        })
        return out


def _exp(x: float) -> float:
    return math.exp(x) if x < 700 else math.inf


@dataclass
class EncoderStats:
    """Cosine of mean-pooled embeddings, per sample."""

    cosines: list[float] = field(default_factory=list)

    def add(self, hidden_dst: torch.Tensor, hidden_src: torch.Tensor) -> None:
        """`hidden_* [B, L, H]` (no padding: every position counts)."""
        e_d, e_s = hidden_dst.float().mean(dim=1), hidden_src.float().mean(dim=1)
        self.cosines += torch.nn.functional.cosine_similarity(e_d, e_s, dim=-1).double().tolist()

    def summary(self) -> dict:
        n = max(len(self.cosines), 1)
        return {"samples": len(self.cosines), "embedding_cosine_mean": sum(self.cosines) / n,
                "embedding_cosine_min": min(self.cosines, default=1.0)}


@dataclass
class LayerStats:
    """Squared-error sums of one block (see the module docstring)."""

    acc_err: float = 0.0
    acc_ref: float = 0.0
    own_err: float = 0.0
    own_ref: float = 0.0

    def add(self, h_in_src, out_src, out_dst, out_dst_on_src) -> None:
        """All ``[B, L, H]``: the source block's input and output, the quantized model's output,
        and the quantized block's output on the source's input."""
        self.acc_err += _sq(out_dst - out_src)
        self.acc_ref += _sq(out_src)
        self.own_err += _sq(out_dst_on_src - out_src)
        self.own_ref += _sq(out_src - h_in_src)

    def summary(self, index: int) -> dict:
        return {"layer": index, "hidden_rel_error": _ratio(self.acc_err, self.acc_ref),
                "own_rel_error": _ratio(self.own_err, self.own_ref)}


def _sq(x: torch.Tensor) -> float:
    return float(x.float().pow(2).sum().double())


def _ratio(err: float, ref: float) -> float:
    return math.sqrt(err / ref) if ref > 0 else (0.0 if err == 0 else math.inf)
