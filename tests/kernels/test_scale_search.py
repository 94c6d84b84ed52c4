"""Searched-scale kernels (``--scale-search mse``) equal the torch reference byte for byte.

On the CPU they run in Triton's interpreter, which is slow for 16 candidates per group: the
shapes here are small but awkward (rows that are not block multiples, K over one 1024 chunk,
128x128 blocks cut at both edges, several NVFP4 programs). ``test_gpu_*`` repeat the matrix on
larger shapes on the GPU machine (``-m gpu``).
"""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_same, channel_weights, reference, weight

from quantize_cli import kernels
from quantize_cli.schemes import SCHEMES
from quantize_cli.schemes.searched import with_scale_search

SEARCHED = {a: with_scale_search(SCHEMES[a], "mse") for a in ("INT8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "W4A16_NVFP4", "NVFP4")}
CASES = [
    ("INT8", (5, 40), torch.bfloat16),
    ("INT8", (3, 1100), torch.float16),  # K over one 1024 chunk: several chunks per candidate
    ("FP8_PER_CHANNEL_PER_TOKEN", (7, 24), torch.bfloat16),
    ("FP8_PER_CHANNEL_PER_TOKEN", (2, 1030), torch.float32),
    ("FP8_PB_WO", (130, 20), torch.bfloat16),  # two blocks, both cut at the edges
    ("W4A16_NVFP4", (70, 32), torch.bfloat16),  # 140 groups: three programs, the last one partial
    ("NVFP4", (3, 48), torch.float16),
    ("NVFP4", (1, 16), torch.float32),
]


def check(algo, w, gamax=None):
    out = kernels.quantize(SEARCHED[algo], w, gamax)
    assert_same(out, reference(SEARCHED[algo], w, gamax), f"searched {algo} {tuple(w.shape)} {w.dtype}")
    return out


@pytest.mark.parametrize("algo,shape,dtype", CASES, ids=lambda v: str(v))
def test_kernel_equals_reference(algo, shape, dtype, make_weight):
    check(algo, make_weight(shape, dtype, seed=3))


@pytest.mark.parametrize("algo", ["INT8", "W4A16_NVFP4"])
def test_all_zero(algo, device):
    """Every candidate has zero error: the tie goes to round-to-nearest (scale 1.0)."""
    out = check(algo, torch.zeros(3, 32, dtype=torch.bfloat16, device=device))
    assert torch.all(out["weight_scale"].float() == 1.0)


def test_nvfp4_shared_global_amax(make_weight):
    """A fused group's global amax (larger than this member's own) is honoured, as in RTN."""
    w = make_weight((6, 64), seed=4)
    check("NVFP4", w, w.float().abs().amax() * 3)


def test_nvfp4_scale_code_edges(device):
    """Block scales at the e4m3 floor (2^-9: no candidate below) and at 448 (no candidate above)."""
    w = torch.zeros(2, 32)
    w[0, :16] = torch.linspace(-1, 1, 16)  # the global amax: block scale 448
    w[1, :16] = torch.linspace(-1e-6, 1e-6, 16)  # tiny: clamped up to 2^-9
    w[1, 16:] = torch.linspace(0, 0.3, 16)
    check("W4A16_NVFP4", w.to(device))


def test_stack_equals_items(make_weight):
    """quantize_stack over experts == each expert on its own (per-item global amax)."""
    w = torch.stack([make_weight((4, 32), seed=s) for s in (5, 6)])
    out = kernels.quantize_stack(SEARCHED["W4A16_NVFP4"], w)
    for e in range(2):
        ref = reference(SEARCHED["W4A16_NVFP4"], w[e])
        assert_same({k: v[e] for k, v in out.items()}, ref, f"expert {e}")


# -- activation-weighted search (channel_weights): the same bytes as the reference ----------------
def check_weighted(algo, w, cw, gamax=None):
    out = kernels.quantize(SEARCHED[algo], w, gamax, channel_weights=cw)
    assert_same(out, reference(SEARCHED[algo], w, gamax, cw), f"weighted {algo} {tuple(w.shape)} {w.dtype}")
    return out


WEIGHTED_CASES = [
    ("INT8", (5, 40), torch.bfloat16),
    ("INT8", (3, 1100), torch.float16),
    ("FP8_PER_CHANNEL_PER_TOKEN", (7, 24), torch.float32),
    ("FP8_PB_WO", (130, 150), torch.bfloat16),  # the second column of blocks is cut: its weights too
    ("W4A16_NVFP4", (70, 48), torch.bfloat16),  # groups of three columns blocks: g % (K/16) picks them
    ("NVFP4", (3, 48), torch.float16),
]


@pytest.mark.parametrize("algo,shape,dtype", WEIGHTED_CASES, ids=lambda v: str(v))
def test_weighted_kernel_equals_reference(algo, shape, dtype, make_weight, device):
    w = make_weight(shape, dtype, seed=9)
    out = check_weighted(algo, w, channel_weights(shape[1], 10, device))
    plain = kernels.quantize(SEARCHED[algo], w)  # the weights must matter here, or the test proves nothing
    assert not torch.equal(out["weight_scale"].float(), plain["weight_scale"].float())


def test_weighted_stack_takes_each_items_weights(make_weight, device):
    """quantize_stack with [E, K] weights == each expert with its own weights."""
    w = torch.stack([make_weight((4, 32), seed=s) for s in (11, 12)])
    cw = torch.stack([channel_weights(32, 13, device), channel_weights(32, 14, device)])
    out = kernels.quantize_stack(SEARCHED["W4A16_NVFP4"], w, channel_weights=cw)
    for e in range(2):
        assert_same({k: v[e] for k, v in out.items()}, reference(SEARCHED["W4A16_NVFP4"], w[e], None, cw[e]), f"expert {e}")


def test_weights_need_a_searched_scheme(make_weight, device):
    with pytest.raises(ValueError, match="without --scale-search mse"):
        kernels.quantize(SCHEMES["NVFP4"], make_weight((2, 32)), channel_weights=torch.ones(32, device=device))


# -- GPU twins: the same contract on larger shapes (run with -m gpu on the GPU machine) -----------
GPU_CASES = [(s, torch.bfloat16) for s in [(1, 16), (100, 96), (200, 176), (130, 272), (256, 4096), (384, 14336)]] + [
    ((130, 272), torch.float16), ((256, 384), torch.float32)]


@pytest.mark.parametrize("algo", list(SEARCHED))
@pytest.mark.parametrize("shape,dtype", GPU_CASES, ids=str)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_kernel_equals_reference(algo, shape, dtype):
    w = weight(shape, dtype, seed=7).cuda()
    check(algo, w)


@pytest.mark.parametrize("algo", list(SEARCHED))
@pytest.mark.parametrize("shape,dtype", GPU_CASES, ids=str)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_weighted_kernel_equals_reference(algo, shape, dtype):
    w = weight(shape, dtype, seed=7).cuda()
    check_weighted(algo, w, channel_weights(shape[1], 15, "cuda"))


@pytest.mark.parametrize("algo", list(SEARCHED))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_soft_and_hardware_e4m3_agree(algo):
    """The software e4m3 rounding (interpreter, pre-sm_89) and the hardware cast pick the same scales."""
    from quantize_cli.kernels import scale_search as ks

    w = weight((256, 512), torch.bfloat16, seed=8).cuda().unsqueeze(0)
    base = SEARCHED[algo].base
    if algo in ("NVFP4", "W4A16_NVFP4"):
        gamax = w.float().abs().amax().reshape(1)
        a, b = ks.quantize_nvfp4(w, gamax, soft=True), ks.quantize_nvfp4(w, gamax, soft=False)
    elif algo == "FP8_PB_WO":
        a, b = ks.quantize_blocks(w, soft=True), ks.quantize_blocks(w, soft=False)
    else:
        int8 = base.algo == "INT8"
        a, b = ks.quantize_rows(w, int8, soft=True), ks.quantize_rows(w, int8, soft=False)
    for x, y in zip(a, b):
        assert torch.equal(x.view(torch.uint8) if x.element_size() == 1 else x, y.view(torch.uint8) if y.element_size() == 1 else y)
