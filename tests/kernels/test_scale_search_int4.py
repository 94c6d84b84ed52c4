"""Searched INT4 group scales (``--scale-search mse --algo INT4``, ModelOpt W4A16_AWQ): the row kernel
on the ``[N*K/128, 128]`` view equals the torch reference byte for byte, weighted or not.

On the CPU the kernel runs in Triton's interpreter: small shapes with a partial last program
(more 128-groups than one program's 16, not a multiple of them), several groups per row (the
weighted path picks each group's columns by ``g % (K/128)``), bf16 / fp16 / fp32 sources.
``test_gpu_*`` repeat them on larger shapes on the GPU machine (``-m gpu``).
"""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_same, channel_weights, reference, weight

from quantize_cli import kernels
from quantize_cli.schemes import SCHEMES
from quantize_cli.schemes.searched import with_scale_search

INT4 = with_scale_search(SCHEMES["INT4"], "mse")
CASES = [
    ((6, 384), torch.bfloat16),  # 18 groups: two programs, the second partial
    ((2, 128), torch.float16),  # one group per row
    ((34, 256), torch.float32),  # 68 groups: five programs
]


def check(w, cw=None):
    out = kernels.quantize(INT4, w, channel_weights=cw)
    assert_same(out, reference(INT4, w, None, cw), f"searched INT4 {tuple(w.shape)} {w.dtype} weighted={cw is not None}")
    return out


@pytest.mark.parametrize("shape,dtype", CASES, ids=str)
def test_kernel_equals_reference(shape, dtype, make_weight):
    out = check(make_weight(shape, dtype, seed=3))
    rtn = SCHEMES["INT4"].quantize(make_weight(shape, dtype, seed=3))
    assert not torch.equal(out["weight_scale"], rtn["weight_scale"].to(out["weight_scale"].device))  # a search happened


@pytest.mark.parametrize("shape,dtype", CASES, ids=str)
def test_weighted_kernel_equals_reference(shape, dtype, make_weight, device):
    w = make_weight(shape, dtype, seed=9)
    out = check(w, channel_weights(shape[1], 10, device))
    plain = kernels.quantize(INT4, w)  # the weights must matter here, or the test proves nothing
    assert not torch.equal(out["weight_scale"], plain["weight_scale"])


def test_all_zero_takes_round_to_nearest(device):
    out = check(torch.zeros(4, 256, dtype=torch.bfloat16, device=device))
    assert torch.all(out["weight_scale"] == 1.0)


def test_stack_takes_each_items_weights(make_weight, device):
    w = torch.stack([make_weight((4, 256), seed=s) for s in (11, 12)])
    cw = torch.stack([channel_weights(256, 13, device), channel_weights(256, 14, device)])
    out = kernels.quantize_stack(INT4, w, channel_weights=cw)
    for e in range(2):
        assert_same({k: v[e] for k, v in out.items()}, reference(INT4, w[e], None, cw[e]), f"expert {e}")


def test_k_not_whole_groups_is_refused(make_weight):
    with pytest.raises(ValueError, match="divisible by 128"):
        kernels.quantize(INT4, make_weight((2, 192)))


GPU_CASES = [(s, torch.bfloat16) for s in [(2, 128), (100, 384), (256, 4096), (384, 14336)]] + [
    ((130, 256), torch.float16), ((256, 384), torch.float32)]


@pytest.mark.parametrize("shape,dtype", GPU_CASES, ids=str)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_kernel_equals_reference(shape, dtype):
    w = weight(shape, dtype, seed=7).cuda()
    check(w)
    check(w, channel_weights(shape[1], 15, "cuda"))
