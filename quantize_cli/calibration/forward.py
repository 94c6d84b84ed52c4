"""The layer-streamed forward: one block's weights on the device at a time.

    materialize the non-block modules (embeddings, rotary, final norm)
    run every sample up to block 0 and keep what block 0 receives     (a pre-hook that stops the model)
    for each block i:  load its weights (our reader) -> run every sample -> record amax -> free it
                       its outputs become block i+1's inputs
    tail pass (only when a quantizable Linear sits after the blocks, e.g. BERT's pooler)

Samples of equal length run together (a batch ``[B, L]`` of at most ``batch_tokens`` tokens), so
no padding token ever exists, let alone reaches an amax; samples of different lengths never share
a batch. Peak device memory is one block plus the hidden states of all samples ``[n, L, H]`` (plus
one batch's outputs while a block runs); with ``offload`` the hidden states live in host memory
(pinned when the device is a GPU) and only one batch at a time is on the device. Each block gets
the other arguments (masks, position embeddings) the model gives that block (:class:`BlockArgs`):
a model mixing sliding-window and full-attention layers (Gemma 3) runs each with its own mask and
rotary table.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..checkpoint.safetensors_io import TensorInfo
from ..errors import CalibrationError
from . import hooks
from .model import Skeleton, materialize, release


class _Stop(Exception):
    """Raised by the pre-hook of block 0 once it has seen its inputs."""

    def __init__(self, args, kwargs):
        super().__init__()
        self.args, self.kwargs = args, kwargs


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _model_kwargs(model: torch.nn.Module) -> dict:
    params = inspect.signature(model.forward).parameters
    return {"use_cache": False} if "use_cache" in params else {}


BATCH_TOKENS = 8192  # tokens per forward: large enough to keep a GPU busy, small next to a block's weights


def batches(samples: list[list[int]], batch_tokens: int = BATCH_TOKENS) -> list[list[list[int]]]:
    """Samples grouped into padding-free batches: equal lengths only, at most `batch_tokens` tokens
    (at least one sample), in the order the lengths first appear."""
    by_len: dict[int, list[list[int]]] = {}
    for s in samples:
        by_len.setdefault(len(s), []).append(s)
    out = []
    for n, group in by_len.items():
        size = max(1, batch_tokens // n)
        out.extend(group[i : i + size] for i in range(0, len(group), size))
    return out


def _to(obj, device: torch.device, pin: bool = False):
    """`obj` (tensors inside tuples, lists and dicts) on `device`; pinned host memory when `pin`."""
    if isinstance(obj, torch.Tensor):
        if pin and obj.device.type != "cpu":  # device -> pinned host buffer, asynchronous: the host never reads it,
            host = torch.empty(obj.shape, dtype=obj.dtype, pin_memory=True)  # and its copy back is ordered after
            return host.copy_(obj, non_blocking=True)  # this one on the same stream
        return obj.to(device, non_blocking=True)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to(o, device, pin) for o in obj)
    if isinstance(obj, dict):
        return {k: _to(v, device, pin) for k, v in obj.items()}
    return obj


@torch.no_grad()
def run(sk: Skeleton, tensors: dict[str, TensorInfo], samples: list[list[int]], device: torch.device,
        recorder: hooks.Recorder, progress: Callable[[int, int, float], None] | None = None,
        batch_tokens: int = BATCH_TOKENS, offload: bool = False, transform=None) -> dict:
    """Record, into `recorder`, every Linear input amax and K/V amax of the model over `samples`.

    `offload`: keep the hidden states between blocks in host memory (pinned for a GPU), one batch
    on the device at a time; the amax are the same either way (the same arithmetic on the device).
    `transform(sk, i, block, path, run_block)`: called once a block is loaded, before its recorded
    pass; ``run_block()`` runs every batch through the block without keeping the outputs (the
    statistics pass of GPTQ and smoothing, :mod:`.layerwise`). The transform may change the
    block's weights: the recorded pass and the next block's inputs then come from the new ones.
    Returns timing facts: ``{"blocks": n, "batches": b, "seconds": ..., "block_seconds": [...]}``.
    """
    model, blocks = sk.model, sk.blocks
    t0 = time.perf_counter()
    groups = batches(samples, batch_tokens)
    materialize(sk, model, "", tensors, device, skip=(sk.blocks_path,))
    store = torch.device("cpu") if offload else device
    pin = offload and device.type == "cuda"
    states, extra = _capture(model, blocks, groups, device)
    if offload:
        states = _to(states, store, pin)
        extra = [BlockArgs(_to(e.variants, store, pin), e.kinds) for e in extra]
    per_block, tuple_out = [], False
    with hooks.active(recorder):
        for i, block in enumerate(blocks):
            tb = time.perf_counter()
            path = f"{sk.blocks_path}.{i}"
            materialize(sk, block, path, tensors, device)
            handles = []
            try:
                if transform is not None:
                    transform(sk, i, block, path, lambda: _pass(block, i, states, extra, device, offload, None, pin))
                handles = hooks.attach(recorder, block, sk.prefix + path, sk.roles)
                tuple_out = _pass(block, i, states, extra, device, offload, store, pin)
            finally:
                hooks.detach(handles)
                release(block)
            per_block.append(time.perf_counter() - tb)
            if progress:
                progress(i + 1, len(blocks), per_block[-1])
        _tail(sk, recorder, groups, states, device, tuple_out)
    return {"blocks": len(blocks), "batches": len(groups), "seconds": time.perf_counter() - t0, "block_seconds": per_block}


def _pass(block, i: int, states: list, extra: list, device, offload: bool, store, pin: bool) -> bool:
    """Every batch through `block` (block `i`, with its own arguments); its outputs replace `states` when `store` is given (else they
    are dropped: a statistics pass). Returns whether the block returns a tuple."""
    tuple_out = False
    for j, h in enumerate(states):
        args, kwargs = _to(extra[j].of(i), device) if offload else extra[j].of(i)
        out = block(h.to(device, non_blocking=True), *args, **kwargs)
        tuple_out = isinstance(out, (tuple, list))
        if store is not None:
            states[j] = _to(_first(out), store, pin) if offload else _first(out)
    return tuple_out


@dataclass
class BlockArgs:
    """What the blocks receive besides their hidden states, for one batch: the distinct
    ``(args, kwargs)`` (masks, position embeddings) and, per block, which of them (a model mixing
    sliding-window and full-attention layers, like Gemma 3, gives its two kinds of layers two masks
    and two rotary tables; the others give every block the same objects, so one entry)."""

    variants: list[tuple[tuple, dict]]
    kinds: list[int]  # per block: index into variants

    def of(self, i: int) -> tuple[tuple, dict]:
        return self.variants[self.kinds[i]]


def _split(args: tuple, kwargs: dict) -> tuple[torch.Tensor, tuple, dict]:
    """(hidden states, the other args, the other kwargs) of one block call."""
    kwargs = dict(kwargs)
    h = args[0] if args else kwargs.pop("hidden_states")
    return h, tuple(args[1:]), kwargs


def _capture(model, blocks, groups, device) -> tuple[list[torch.Tensor], list[BlockArgs]]:
    """Block 0's hidden states ``[B, L, H]`` and every block's other arguments, per batch.

    The model runs with its blocks passing their input through (their weights stay on the meta
    device), so that each block's call shows the arguments the model gives that block; the last
    block's call stops the model. Should an architecture not run that way, block 0's arguments
    are used for every block (exact when all blocks share one attention type)."""
    states, extra = [], []
    last = len(blocks) - 1
    calls: list[tuple[tuple, dict]] = []

    def record(i: int):
        def hook(mod, args, kwargs):
            calls.append((tuple(args), dict(kwargs)))
            if i == last:
                raise _Stop(args, kwargs)
        return hook

    def passthrough(hidden_states, *args, **kwargs):
        return hidden_states

    handles = [b.register_forward_pre_hook(record(i), with_kwargs=True) for i, b in enumerate(blocks)]
    for b in blocks[:last]:
        b.forward = passthrough
    try:
        for ids in groups:
            calls.clear()
            try:
                model(input_ids=torch.tensor(ids, device=device), **_model_kwargs(model))
            except _Stop:
                pass
            except Exception:  # noqa: BLE001 - an architecture the pass-through blocks break: block 0's alone
                if not calls:
                    raise
                calls[1:] = [calls[0]] * last
            if len(calls) != len(blocks):
                raise CalibrationError("calibration: the model never reached its blocks; this architecture cannot be calibrated layer by layer")
            h, _, _ = _split(*calls[0])
            states.append(h)
            extra.append(_variants(calls))
    finally:
        for h in handles:
            h.remove()
        for b in blocks[:last]:
            del b.forward
    return states, extra


def _variants(calls: list[tuple[tuple, dict]]) -> BlockArgs:
    """The calls' non-hidden arguments, one entry per distinct set of objects (by identity)."""
    variants, kinds, index = [], [], {}
    for args, kwargs in calls:
        _, rest, kw = _split(args, kwargs)
        key = (tuple(id(a) for a in rest), tuple((k, id(v)) for k, v in kw.items()))
        if key not in index:
            index[key] = len(variants)
            variants.append((rest, kw))
        kinds.append(index[key])
    return BlockArgs(variants, kinds)


def _tail(sk: Skeleton, recorder: hooks.Recorder, groups, states, device, tuple_out: bool) -> None:
    """Linears after the blocks (BERT's pooler): rerun the model with blocks passing through the
    final hidden states, so the tail sees exactly what the full model would give it."""
    model, blocks = sk.model, sk.blocks
    tail = [(n, m) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and not (n == sk.blocks_path or n.startswith(sk.blocks_path + "."))]
    if not tail:
        return
    handles = [m.register_forward_pre_hook(hooks._linear_hook(recorder, sk.prefix + n)) for n, m in tail]
    originals = [b.forward for b in blocks]
    current: list[torch.Tensor] = []

    def passthrough(first: bool):
        def fwd(hidden_states, *args, **kwargs):
            h = current[0] if first else hidden_states
            return (h,) if tuple_out else h
        return fwd

    try:
        for k, b in enumerate(blocks):
            b.forward = passthrough(k == 0)
        for ids, h in zip(groups, states):
            current[:] = [h.to(device)]
            model(input_ids=torch.tensor(ids, device=device), **_model_kwargs(model))
    finally:
        for b, f in zip(blocks, originals):
            b.forward = f
        hooks.detach(handles)
