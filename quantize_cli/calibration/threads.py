"""Calibration's bits do not depend on the machine's CPU thread count.

On the CPU, MKL's matrix products and LAPACK's blocked Cholesky split their work by the number of
threads, and the split changes the order of the sums: the same calibration gave other GPTQ bytes
with 1 and 2 threads (issue 36: a MiniLM run differed in 130 of 73,728 words of one tensor; a
``tiny-llama`` run in ``layers.1.mlp.down_proj``, whose input, the layer's forward, already
differed). The calibration forward and GPTQ's solver therefore run with one intra-op thread on the
CPU (:func:`one_thread_on`): the same inputs give the same bytes everywhere, and on a loaded
machine it also spends less CPU time (2 threads cost 5x the CPU time of 1 in the issue's run).
A CUDA device is unaffected: its arithmetic does not depend on the host's threads.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def one_thread_on(device):
    """torch's intra-op threads set to one inside the block when `device` is the CPU (restored after)."""
    if getattr(device, "type", "cpu") != "cpu":
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


__all__ = ["one_thread_on"]
