"""The streamed forward of DST, and of SRC on the same tokens in the same pass.

    fill the non-block modules of each model (embeddings, rotary, final norm, head)
    run every batch up to block 0 and keep what block 0 receives   (calibration's capture)
    for each block i:   fill SRC's block i and DST's block i (served weights, quantized inputs)
                        per batch:  SRC block on SRC's states      -> SRC's next states
                                    DST block on DST's states      -> DST's next states
                                    DST block on SRC's states      -> this layer's own error
                        release both blocks
    tail: the model with pass-through blocks gives logits (or the last hidden states) from the
          final states, a few rows at a time, and the metrics are summed (metrics.py)

Two blocks are materialized at a time (one per model; one without SRC), whatever the depth; the
hidden states of all samples stay on the device (fp32 ``[n, L, H]`` per model). Everything runs
in fp32, so the figures measure the quantization, not bf16 rounding; quantized Linears compute
``act(x) @ W_served^T`` in fp32 (exact products, fp32 accumulation, as the kernels do).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..calibration.forward import BATCH_TOKENS, _capture, _first, _model_kwargs, batches
from ..checkpoint.safetensors_io import read_tensor
from .metrics import EncoderStats, LayerStats, LMStats
from .model import Loader, fill, release

LOGIT_ELEMENTS = 1 << 26  # logits computed per tail forward (256 MB of fp32): rows of a batch at a time


class SourceLoader(Loader):
    """A checkpoint's tensors as written."""

    def __init__(self, tensors: dict):
        self.tensors = tensors

    def tensor(self, name: str) -> torch.Tensor | None:
        info = self.tensors.get(name)
        return read_tensor(info) if info is not None else None


class ServedLoader(SourceLoader):
    """A converted checkpoint as served (:class:`~quantize_cli.eval.weights.Served`)."""

    def __init__(self, served, device=None):
        super().__init__(served.tensors)
        self.served, self.device = served, device

    def linear(self, name: str):
        spec = self.served.linears.get(name)
        if spec is None:
            return None
        w = self.served.weight(name, self.device)
        return w, spec.act, self.served.pre_quant_scale(name, w.shape[1], self.device)

    def quantized(self, name: str) -> bool:
        return name in self.served.linears

    def kv(self, attn: str):
        return self.served.kv_scales(attn)


@dataclass
class Side:
    """One model streamed through its blocks."""

    sk: object  # calibration.model.Skeleton
    loader: Loader
    states: list = field(default_factory=list)  # per batch: hidden states [B, L, H]
    extra: list = field(default_factory=list)  # per batch: the blocks' other arguments (calibration.forward.BlockArgs)


@dataclass
class Outcome:
    """What the pass measured, and how."""

    lm: LMStats | None
    encoder: EncoderStats | None
    layers: list[dict]
    batches: int
    peak_blocks: int  # blocks materialized at once (the memory bound)
    seconds: float


@torch.no_grad()
def run(dst: Side, src: Side | None, samples: list[list[int]], device: torch.device, causal: bool,
        progress: Callable[[int, int], None] | None = None, batch_tokens: int = BATCH_TOKENS,
        observe: Callable | None = None) -> Outcome:
    """Stream `samples` through DST (and SRC) block by block; see the module docstring.

    `observe(dst, src)`: called with every chunk of scored logits ``[T, V]`` (src None without
    SRC) or, for an encoder, last hidden states ``[B, L, H]``: for tests and benches."""
    t0 = time.perf_counter()
    groups = batches(samples, batch_tokens)
    sides = [s for s in (src, dst) if s is not None]
    for side in sides:
        fill(side.sk, side.sk.model, "", side.loader, device, skip=(side.sk.blocks_path,))
        side.states, side.extra = _capture(side.sk.model, side.sk.blocks, groups, device)
    layers, live, peak, tuple_out = [], 0, 0, False
    n = len(dst.sk.blocks)
    for i in range(n):
        path = f"{dst.sk.blocks_path}.{i}"
        for side in sides:
            fill(side.sk, side.sk.blocks[i], path, side.loader, device)
            live += 1
        peak = max(peak, live)
        stats = LayerStats()
        for j in range(len(groups)):
            out_d, tuple_out = _block(dst, i, dst.states[j], dst.extra[j].of(i))
            if src is not None:
                h_in = src.states[j]
                out_s, _ = _block(src, i, h_in, src.extra[j].of(i))
                own, _ = _block(dst, i, h_in, src.extra[j].of(i))
                stats.add(h_in, out_s, out_d, own)
                src.states[j] = out_s
            dst.states[j] = out_d
        for side in sides:
            release(side.sk.blocks[i])
            live -= 1
        if src is not None:
            layers.append(stats.summary(i))
        if progress:
            progress(i + 1, n)
    lm = LMStats() if causal else None
    enc = EncoderStats() if not causal and src is not None else None
    for j, ids in enumerate(groups):
        _tail(dst, src, ids, j, device, tuple_out, lm, enc, observe)
    for side in sides:
        release(side.sk.model)
    return Outcome(lm, enc, layers, len(groups), peak, time.perf_counter() - t0)


def _block(side: Side, i: int, h: torch.Tensor, extra) -> tuple[torch.Tensor, bool]:
    args, kwargs = extra
    out = side.sk.blocks[i](h, *args, **kwargs)
    return _first(out), isinstance(out, (tuple, list))


def _tail(dst: Side, src: Side | None, ids: list[list[int]], j: int, device, tuple_out: bool, lm, enc, observe) -> None:
    """The model after the blocks (final norm, head) on batch `j`'s final states, a few rows at a time."""
    length = len(ids[0])
    vocab = dst.sk.model.config.get_text_config().vocab_size if causal_head(dst) else 1
    rows = max(1, LOGIT_ELEMENTS // max(1, length * vocab))
    for r in range(0, len(ids), rows):
        chunk = torch.tensor(ids[r : r + rows], device=device)
        out_d = _through(dst, chunk, dst.states[j][r : r + rows], tuple_out)
        out_s = _through(src, chunk, src.states[j][r : r + rows], tuple_out) if src is not None else None
        if lm is not None:
            logits_d = out_d.logits[:, :-1].reshape(-1, out_d.logits.shape[-1])
            logits_s = out_s.logits[:, :-1].reshape(-1, out_s.logits.shape[-1]) if out_s is not None else None
            lm.add(logits_d, chunk[:, 1:].reshape(-1), logits_s)
            if observe:
                observe(logits_d, logits_s)
            continue
        if enc is not None:
            enc.add(out_d.last_hidden_state, out_s.last_hidden_state)
        if observe:
            observe(out_d.last_hidden_state, None if out_s is None else out_s.last_hidden_state)


def causal_head(side: Side) -> bool:
    return hasattr(side.sk.model, "lm_head") or type(side.sk.model).__name__.endswith("ForCausalLM")


def _through(side: Side, ids: torch.Tensor, h: torch.Tensor, tuple_out: bool):
    """The model's output with every block passing `h` through (block 0 returns it)."""
    blocks = side.sk.blocks

    def passthrough(first: bool):
        def fwd(hidden_states, *args, **kwargs):
            out = h if first else hidden_states
            return (out,) if tuple_out else out
        return fwd

    for k, b in enumerate(blocks):
        b.forward = passthrough(k == 0)
    try:
        return side.sk.model(input_ids=ids, **_model_kwargs(side.sk.model))
    finally:
        for b in blocks:
            del b.forward
