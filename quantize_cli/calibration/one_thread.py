"""One intra-op thread for GPTQ's arithmetic on the CPU, so that its bytes do not depend on the
thread count.

On the CPU, torch's BLAS and LAPACK (MKL) choose their summation order by the number of threads:
measured with torch 2.13 / MKL 2024.2, ``x^T x`` over 8192 tokens splits the token sum across
threads (384 channels: other bits with 2 and 4 threads than with 1), and the Cholesky factor and
inverse of GPTQ differ for every size tried (64 to 1536). A GPTQ conversion of MiniLM then differed
in 130 of 73,728 words of one tensor between 1 and 2 threads (issue 36). One thread has one order:
the calibration forward (whose products also split their sums: ``example:tiny-llama``'s
``layers.1.mlp.down_proj`` input differed between 1 and 2 threads), the Hessian accumulation and the
whole solver run under :func:`one_thread`, so any thread count
(``OMP_NUM_THREADS``, ``torch.set_num_threads``, the cores of the machine) gives the bytes of one
thread. It is also faster on small layers: GPTQ's column loop is thousands of tiny ops, on which
two threads spent 2-5x the CPU time of one (OpenMP's fork/join and spin-waits per op).

Other devices are left alone: a GPU's order does not depend on a host thread count.
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def one_thread(device: torch.device):
    """Run the block with one torch intra-op thread when `device` is the CPU (restored after)."""
    before = torch.get_num_threads()
    if device.type != "cpu" or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


__all__ = ["one_thread"]
