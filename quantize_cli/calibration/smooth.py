"""``--smooth awq|smoothquant``: per-channel scales folded into the weights, no extra tensor.

A Linear's input channel j can be divided by ``s_j`` where it is produced and its weight column
multiplied by ``s_j``: the model computes the same function, but the weight and activation
ranges the quantizer sees change. Four places in a decoder layer produce a Linear's input from an
op whose output channels can be scaled (AWQ's and llm-compressor's default mappings)::

    input_layernorm          -> self_attn.{q,k,v}_proj   error measured on self_attn's output
    self_attn.v_proj (rows)  -> self_attn.o_proj          on o_proj's output; under GQA one scale
                                                          per v channel, repeated for each query head
    post_attention_layernorm -> mlp.{gate,up}_proj        on mlp's output
    mlp.up_proj (rows)       -> mlp.down_proj             on down_proj's output

A norm must compute ``x_hat * (c + weight) (+ bias)``, c found on the module (:func:`norm_offset`:
0 for Llama, 1 for Gemma, whose ``pre_feedforward_layernorm`` is the MLP's norm); an MoE MLP
(router + experts) is not smoothed. The scales (x: the calibration inputs,
``mean|x_j|`` and ``max|x_j|`` per channel; w: the balance weights):

* ``awq``: AWQ's grid as llm-compressor runs it: ``s = x_mean^r / (w_mean^(1-r) + 1e-4)``
  (``w_mean``: |w| normalised by its quantization group's max, averaged over the rows), r in
  0, 1/18, ..., 1, plus ``s = 1`` (no smoothing), each normalised by ``sqrt(max s * min s)``;
  the candidate with the least mean squared error of the measured output over the calibration
  tokens, with the balance weights quantized by the target format and, where the format
  quantizes activations (NVFP4, FP8, ...), the inputs too (:mod:`.fake_quant`), wins.
* ``smoothquant``: ``s = max|x_j|^0.5 / max|w_j|^0.5`` on the two norm mappings (SmoothQuant's
  alpha 0.5, llm-compressor's default), no search.

Folding (:class:`Fold`) is done on the source tensors in their own dtype: a norm weight becomes
``n' = dt((c + n) / s - c)``, and its balance columns are multiplied by ``(c + n) / (c + n')`` (so ``n' * w'`` equals
``n * w`` up to one rounding of ``w'``); a Linear's rows are divided by ``s`` (its bias too).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from .methods import AWQ_GRID as N_GRID, SMOOTHING as METHODS, SMOOTHQUANT_ALPHA as SQ_ALPHA


@dataclass(frozen=True)
class Mapping:
    """``prev``'s output channels feed ``balance``'s input channels (block-relative paths)."""

    prev: str
    balance: tuple[str, ...]
    inspect: str
    repeat: int = 1  # balance input channels per prev output channel group (GQA: query heads per KV head)
    head_dim: int = 0
    offset: float = 0.0  # a norm prev computing x_hat * (offset + weight): Gemma's 1

    def expand(self, s: torch.Tensor) -> torch.Tensor:
        """Scales of prev's output channels -> of the balance inputs (repeated per query head under GQA)."""
        if self.repeat == 1:
            return s
        kv = s.numel() // self.head_dim
        return s.reshape(kv, 1, self.head_dim).expand(kv, self.repeat, self.head_dim).reshape(-1)

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Balance-input statistics -> one value per prev output channel (the mean over query heads)."""
        if self.repeat == 1:
            return x
        kv = x.numel() // (self.head_dim * self.repeat)
        return x.reshape(kv, self.repeat, self.head_dim).mean(1).reshape(-1)


def _get(block: torch.nn.Module, path: str):
    mod = block
    for part in path.split("."):
        mod = getattr(mod, part, None)
        if mod is None:
            return None
    return mod


def norm_offset(norm: torch.nn.Module) -> float | None:
    """c where the norm computes ``x_hat * (c + weight) (+ bias)``: 0 for Llama's RMSNorm and
    LayerNorm, 1 for Gemma's; None when its output is no such function of its weight (checked on
    the module with random inputs: weight 0, 1 and 2 must give outputs on one line)."""
    w = getattr(norm, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1:
        return None
    probe = copy.deepcopy(norm).float()  # fp32: a bf16 output's rounding would blur the line
    w = probe.weight
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, w.numel(), generator=gen).to(w.device)
    bias = getattr(probe, "bias", None)
    b = bias.float() if isinstance(bias, torch.Tensor) else 0.0
    ys = []
    with torch.no_grad():
        for value in (0.0, 1.0, 2.0):
            w.fill_(value)
            ys.append(probe(x).float() - b)
    y0, y1, y2 = ys
    slope = y1 - y0  # x_hat
    if not torch.allclose(y2 - y1, slope, rtol=1e-2, atol=1e-3) or not bool((slope.abs() > 1e-3).any()):
        return None
    if torch.allclose(y0, torch.zeros_like(y0), atol=1e-3):
        return 0.0
    c = float((y0 * slope).sum() / slope.square().sum())  # y0 = c * x_hat, least squares
    c = round(c)  # Gemma's 1: an integer offset, exactly
    return float(c) if c and torch.allclose(y0, c * slope, rtol=1e-2, atol=1e-3) else None


def mappings(block: torch.nn.Module, method: str, num_heads: int | None) -> list[Mapping]:
    """The mappings of a decoder layer that apply (see the module doc), in order.

    The MLP's norm is ``pre_feedforward_layernorm`` where the layer has one (Gemma 2/3, whose
    ``post_attention_layernorm`` normalises the attention's output before the residual add);
    else ``post_attention_layernorm``, unless a ``post_feedforward_layernorm`` says the layer
    normalises after its sublayers (OLMo 2): then the MLP reads the residual stream, no norm."""
    out = []
    lin = lambda p: isinstance(_get(block, p), torch.nn.Linear)  # noqa: E731
    attn = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    norm1 = _get(block, "input_layernorm")
    c1 = norm_offset(norm1) if norm1 is not None else None
    if all(map(lin, attn)) and c1 is not None:
        out.append(Mapping("input_layernorm", attn, "self_attn", offset=c1))
    v, o = _get(block, "self_attn.v_proj"), _get(block, "self_attn.o_proj")
    if method == "awq" and lin("self_attn.v_proj") and lin("self_attn.o_proj") and num_heads:
        rep, hd = o.in_features // v.out_features if v.out_features else 0, o.in_features // num_heads
        if rep >= 1 and rep * v.out_features == o.in_features and v.out_features % max(hd, 1) == 0:
            out.append(Mapping("self_attn.v_proj", ("self_attn.o_proj",), "self_attn.o_proj", rep, hd))
    mlp = ("mlp.gate_proj", "mlp.up_proj")
    if _get(block, "pre_feedforward_layernorm") is not None:
        name2 = "pre_feedforward_layernorm"
    elif _get(block, "post_feedforward_layernorm") is None:
        name2 = "post_attention_layernorm"
    else:
        name2 = None
    norm2 = _get(block, name2) if name2 else None
    c2 = norm_offset(norm2) if norm2 is not None else None
    if all(map(lin, mlp)) and lin("mlp.down_proj") and c2 is not None:
        out.append(Mapping(name2, mlp, "mlp", offset=c2))
    if method == "awq" and all(map(lin, mlp)) and lin("mlp.down_proj"):
        out.append(Mapping("mlp.up_proj", ("mlp.down_proj",), "mlp.down_proj"))
    return out


@dataclass
class Capture:
    """The inputs an inspected module received, one ``(args, kwargs)`` per batch."""

    calls: list = field(default_factory=list)

    def hook(self, module, args, kwargs):
        self.calls.append((args, kwargs))

    def merge(self) -> None:
        """Token-wise modules (a Linear, an MLP: one tensor argument) run once on all tokens: the
        batches are concatenated ``[T, K]`` (the search then makes one call per candidate)."""
        if len(self.calls) > 1 and all(len(a) == 1 and not k for a, k in self.calls):
            x = torch.cat([a[0].reshape(-1, a[0].shape[-1]) for a, _ in self.calls])
            self.calls = [((x,), {})]


def attach_captures(block: torch.nn.Module, maps: list[Mapping]) -> tuple[dict[str, Capture], list]:
    """Forward pre-hooks recording every inspected module's inputs; returns (captures, handles)."""
    caps, handles = {}, []
    for m in maps:
        if m.inspect not in caps:
            caps[m.inspect] = Capture()
            handles.append(_get(block, m.inspect).register_forward_pre_hook(caps[m.inspect].hook, with_kwargs=True))
    return caps, handles


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _cast(obj, dtype):
    """Floating tensors in `obj` (tuples, lists, dicts) cast to `dtype`."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(_cast(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: _cast(v, dtype) for k, v in obj.items()}
    return obj


class search_precision:
    """``with search_precision(block, captures, device):`` on the CPU the search runs in fp32 (block
    and captured inputs cast, exactly back afterwards: bf16 values are fp32 values), because the
    CPU's bf16 kernels are several times slower than its fp32 ones; on a GPU it stays as it is."""

    def __init__(self, block: torch.nn.Module, captures: dict, device: torch.device):
        self.block, self.captures = block, captures
        self.dtype = next((p.dtype for p in block.parameters() if p.is_floating_point()), torch.float32)
        self.on = getattr(device, "type", str(device)) == "cpu" and self.dtype != torch.float32

    def __enter__(self):
        if self.on:
            self.block.float()
            for cap in self.captures.values():
                cap.calls = [_cast(c, torch.float32) for c in cap.calls]
        return self

    def __exit__(self, *exc):
        if self.on:
            self.block.to(self.dtype)


@dataclass
class Balance:
    """One balance Linear of a mapping: its module, weight as the scheme quantizes it, scheme and
    the other balance members it shares a global amax with (None: not quantized)."""

    module: torch.nn.Linear
    weight: torch.Tensor
    scheme: object | None
    group: str | None


def _weight_mean(weights: list[torch.Tensor], groups: list[int]) -> torch.Tensor:
    """Per input channel: |w| over its quantization group's max, averaged over all rows (AWQ's w_mean)."""
    total, rows = 0, 0
    for w, g in zip(weights, groups):
        a = w.float().abs()
        n, k = a.shape
        a = a.reshape(n, k // g, g)
        a = (a / (a.amax(-1, keepdim=True) + 1e-6)).reshape(n, k)
        total, rows = total + a.sum(0), rows + n
    return total / rows


def _group_along_k(scheme, k: int) -> int:
    g = getattr(scheme, "k_group", None) or k  # the scheme's own fact, not a table of names
    return g if k % g == 0 else k


class Search:
    """Scores candidate scales of one mapping on the captured inputs (see the module doc)."""

    def __init__(self, mapping: Mapping, block, capture: Capture, balance: list[Balance], act_quant, act_amax: torch.Tensor | None):
        self.m, self.block, self.capture, self.balance = mapping, block, capture, balance
        self.act_quant, self.act_amax = act_quant, act_amax
        self.inspect = _get(block, mapping.inspect)
        capture.merge()
        with torch.no_grad():
            self.reference = [_first(self.inspect(*a, **k)).float() for a, k in capture.calls]

    def loss(self, s: torch.Tensor) -> float:
        """Mean squared error of the inspected output with the balance layers served under `s`."""
        s = s.float()
        weights = self._quantized_weights(s)
        saved, last = [], [None, None]  # q/k/v (gate/up) read the same input: quantize it once
        amax = float((self.act_amax / s).max()) if self.act_amax is not None else 0.0

        def served_input(x, quantized: bool):
            if last[0] is not x or last[1][0] != quantized:
                xs = x.float() / s
                last[0], last[1] = x, (quantized, self.act_quant(xs, amax) if quantized else xs)
            return last[1][1]

        for b, wq in zip(self.balance, weights):
            def fwd(x, b=b, wq=wq):
                xs = served_input(x, self.act_quant is not None and b.scheme is not None)
                return torch.nn.functional.linear(xs, wq, None if b.module.bias is None else b.module.bias.float()).to(x.dtype)
            saved.append((b.module, b.module.forward))
            b.module.forward = fwd
        try:
            err, n = 0.0, 0
            with torch.no_grad():
                for (a, k), ref in zip(self.capture.calls, self.reference):
                    out = _first(self.inspect(*a, **k)).float()
                    err += float((out - ref).square().sum())
                    n += ref.numel()
        finally:
            for mod, f in saved:
                mod.forward = f
        return err / max(n, 1)

    def _quantized_weights(self, s: torch.Tensor) -> list[torch.Tensor]:
        """Each balance weight times `s` (the space of the inputs ``x / s``), quantized and dequantized
        (fused members share a global amax)."""
        scaled = [(b.weight.float() * s[None, :]).to(b.weight.dtype) for b in self.balance]
        gamax: dict[str, torch.Tensor] = {}
        for b, w in zip(self.balance, scaled):
            if b.scheme is not None and b.group is not None and b.scheme.shares_global_amax:
                a = b.scheme.global_amax(w)
                gamax[b.group] = a if b.group not in gamax else torch.maximum(gamax[b.group], a)
        out = []
        for b, w in zip(self.balance, scaled):
            if b.scheme is None:
                out.append(w.float())
                continue
            out.append(b.scheme.dequantize(b.scheme.quantize(w, gamax.get(b.group))).float())
        return out


def awq_candidates(x_mean: torch.Tensor, w_mean: torch.Tensor) -> list[torch.Tensor]:
    """AWQ's candidate scales: s = 1, then duo scaling for r = 0, 1/18, ..., 1 (llm-compressor's grid)."""
    out = [torch.ones_like(x_mean)]
    for i in range(N_GRID - 1):
        r = i / (N_GRID - 2)
        s = (x_mean.pow(r) / (w_mean.pow(1 - r) + 1e-4)).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        out.append(torch.where(torch.isfinite(s), s, torch.ones_like(s)))
    return out


def smoothquant_scales(x_amax: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    """SmoothQuant: ``max|x_j|^a / max|w_j|^(1-a)`` (a = 0.5); a channel with zero weights keeps x's term."""
    w_amax = torch.stack([w.float().abs().amax(0) for w in weights]).amax(0)
    s = x_amax.pow(SQ_ALPHA) / w_amax.pow(1 - SQ_ALPHA)
    s = torch.where(w_amax > 0, s, x_amax)
    return torch.where(torch.isfinite(s) & (s > 0), s, torch.ones_like(s)).clamp(min=1e-5)


def choose(method: str, search: Search, x_mean: torch.Tensor, x_amax: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The scales of one mapping (prev-channel sized) and what the search saw."""
    m = search.m
    weights = [b.weight for b in search.balance]
    if method == "smoothquant":
        s = smoothquant_scales(x_amax, weights)
        return s, {"method": method}
    groups = [_group_along_k(b.scheme, w.shape[1]) for b, w in zip(search.balance, weights)]
    w_mean = m.reduce(_weight_mean(weights, groups))
    best, best_loss, first = None, float("inf"), None
    for i, cand in enumerate(awq_candidates(m.reduce(x_mean), w_mean)):
        loss = search.loss(m.expand(cand))
        first = loss if first is None else first
        if loss < best_loss:  # strictly better: ties keep the earlier (s = 1 first)
            best, best_loss, best_i = cand, loss, i
    return best, {"method": method, "candidate": best_i, "loss": best_loss, "loss_unsmoothed": first}


class Fold:
    """Collects a block's chosen scales and makes the new source tensors, each rounded once.

    `read(name)` gives a source tensor (its dtype); `prefix` is the block's checkpoint name. Linear
    weights accumulate a column factor (their inputs, from every mapping they balance) and a row
    factor (their outputs, when they are a mapping's prev); a norm is divided at once, because its
    balance columns must absorb its rounding (``n / dt(n / s)``, the effective scale)."""

    def __init__(self, block: torch.nn.Module, prefix: str, read):
        self.block, self.prefix, self.read = block, prefix, read
        self.col: dict[str, torch.Tensor] = {}
        self.row: dict[str, torch.Tensor] = {}
        self.norms: dict[str, dict[str, torch.Tensor]] = {}

    def add(self, m: Mapping, s: torch.Tensor) -> torch.Tensor:
        """Fold scales `s` (prev's output channels) of mapping `m`; returns the balance inputs' scales (CPU).

        On the CPU whatever device searched `s`: the source tensors it scales are read there, and
        these elementwise IEEE operations give the same bits on every device."""
        s = s.float().cpu()
        prev = f"{self.prefix}.{m.prev}"
        if isinstance(_get(self.block, m.prev), torch.nn.Linear):
            self.row[prev] = self.row.get(prev, 1.0) * s
            eff = s
        else:
            n = self.read(f"{prev}.weight")
            c = m.offset  # the norm scales by c + n (Gemma: 1 + n): that product is divided by s
            if c:
                ne = n.float() + c
                n2 = (ne / s - c).to(n.dtype)
                stuck = (n2.float() + c == 0) & (ne != 0)  # rounded onto -c (a dead channel): keep that channel's norm
                n2 = torch.where(stuck, n, n2)
                eff = torch.where(n2.float() + c != 0, ne / (n2.float() + c), s)
            else:
                n2 = (n.float() / s).to(n.dtype)
                eff = torch.where(n2.float() != 0, n.float() / n2.float(), s)
            self.norms[prev] = {"weight": n2}
            bias = self._maybe(f"{prev}.bias")
            if bias is not None:
                self.norms[prev]["bias"] = (bias.float() / eff).to(bias.dtype)
        eff = m.expand(eff)
        for b in m.balance:
            name = f"{self.prefix}.{b}"
            self.col[name] = self.col.get(name, 1.0) * eff
        return eff

    def _maybe(self, name: str):
        try:
            return self.read(name)
        except KeyError:
            return None

    def tensors(self) -> dict[str, torch.Tensor]:
        """Checkpoint tensor name -> its new value (source dtype)."""
        out = {}
        for prev, leaves in self.norms.items():
            out.update({f"{prev}.{k}": v for k, v in leaves.items()})
        for name in sorted(set(self.col) | set(self.row)):
            w = self.read(f"{name}.weight")
            col, row = self.col.get(name), self.row.get(name)
            x = w.float()
            if col is not None:
                x = x * col[None, :]
            if row is not None:
                x = x / row[:, None]
            out[f"{name}.weight"] = x.to(w.dtype)
            bias = self._maybe(f"{name}.bias")
            if row is not None and bias is not None:
                out[f"{name}.bias"] = (bias.float() / row).to(bias.dtype)
        return out


__all__ = ["METHODS", "Mapping", "mappings", "attach_captures", "Capture", "Balance", "Search", "choose",
           "awq_candidates", "smoothquant_scales", "Fold", "search_precision"]
