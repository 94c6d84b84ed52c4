"""The layer-streamed forward: one block's weights on the device at a time.

    materialize the non-block modules (embeddings, rotary, final norm)
    run every sample up to block 0 and keep what block 0 receives     (a pre-hook that stops the model)
    for each block i:  load its weights (our reader) -> run every sample -> record amax -> free it
                       its outputs become block i+1's inputs
    tail pass (only when a quantizable Linear sits after the blocks, e.g. BERT's pooler)

Samples run one at a time (batch 1, no padding), so no padding token ever reaches an amax and
the result does not depend on how samples are grouped. Peak device memory is one block plus the
hidden states of all samples ``[n, L, H]`` (x2 while a block runs); the host holds only the block
being read. The keyword arguments block 0 received (masks, position embeddings) are reused for
every block: exact for models whose blocks all use the same attention type (a model mixing
sliding-window and full layers sees the same mask when ``--calib-seq-len`` <= its window).
"""

from __future__ import annotations

import inspect
import time
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


@torch.no_grad()
def run(sk: Skeleton, tensors: dict[str, TensorInfo], samples: list[list[int]], device: torch.device,
        recorder: hooks.Recorder, progress: Callable[[int, int, float], None] | None = None) -> dict:
    """Record, into `recorder`, every Linear input amax and K/V amax of the model over `samples`.

    Returns timing facts: ``{"blocks": n, "seconds": ..., "block_seconds": [...]}``.
    """
    model, blocks = sk.model, sk.blocks
    t0 = time.perf_counter()
    materialize(sk, model, "", tensors, device, skip=(sk.blocks_path,))
    states, extra = _capture(model, blocks, samples, device)
    per_block, tuple_out = [], False
    with hooks.active(recorder):
        for i, block in enumerate(blocks):
            tb = time.perf_counter()
            path = f"{sk.blocks_path}.{i}"
            materialize(sk, block, path, tensors, device)
            handles = hooks.attach(recorder, block, sk.prefix + path, sk.roles)
            try:
                for j, h in enumerate(states):
                    out = block(h, *extra[j][0], **extra[j][1])
                    tuple_out = isinstance(out, (tuple, list))
                    states[j] = _first(out)
            finally:
                hooks.detach(handles)
                release(block)
            per_block.append(time.perf_counter() - tb)
            if progress:
                progress(i + 1, len(blocks), per_block[-1])
        _tail(sk, recorder, samples, states, device, tuple_out)
    return {"blocks": len(blocks), "seconds": time.perf_counter() - t0, "block_seconds": per_block}


def _capture(model, blocks, samples, device) -> tuple[list[torch.Tensor], list[tuple[tuple, dict]]]:
    """Block 0's hidden states and other arguments, per sample."""
    states, extra = [], []

    def stop(mod, args, kwargs):
        raise _Stop(args, kwargs)

    handle = blocks[0].register_forward_pre_hook(stop, with_kwargs=True)
    try:
        for ids in samples:
            try:
                model(input_ids=torch.tensor([ids], device=device), **_model_kwargs(model))
            except _Stop as s:
                args, kwargs = tuple(s.args), dict(s.kwargs)
                h = args[0] if args else kwargs.pop("hidden_states")
                states.append(h)
                extra.append((args[1:], kwargs))
            else:
                raise CalibrationError("calibration: the model never reached its first block; this architecture cannot be calibrated layer by layer")
    finally:
        handle.remove()
    return states, extra


def _tail(sk: Skeleton, recorder: hooks.Recorder, samples, states, device, tuple_out: bool) -> None:
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
        for ids, h in zip(samples, states):
            current[:] = [h]
            model(input_ids=torch.tensor([ids], device=device), **_model_kwargs(model))
    finally:
        for b, f in zip(blocks, originals):
            b.forward = f
        hooks.detach(handles)
