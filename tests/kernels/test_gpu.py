"""GPU-only kernel tests: exhaustive rounding tables, hardware vs software e4m3, large shapes, and
a weight of more than 2^31 elements (int64 offsets). Run on the GPU machine with ``-m gpu``
(add ``-m "gpu or slow"`` for the > 2^31 case)."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_same, weight

from quantize_cli import kernels
from quantize_cli.schemes import SCHEMES

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = torch.device("cuda")
CHUNK = 1 << 27  # fp32 bit patterns per exhaustive step (keeps the reference's temporaries small)


def fp32_range(lo: float, hi: float):
    """Every fp32 value in [lo, hi] (lo, hi >= 0) and its negative, in chunks, on the GPU."""
    start = torch.tensor(lo, dtype=torch.float32).view(torch.int32).item()
    stop = torch.tensor(hi, dtype=torch.float32).view(torch.int32).item() + 1
    for s in range(start, stop, CHUNK):
        bits = torch.arange(s, min(s + CHUNK, stop), dtype=torch.int32, device=CUDA)
        v = bits.view(torch.float32)
        yield torch.cat([v, -v])


def test_e4m3_every_fp32_value():
    """FP8 with scale 1: every fp32 value in [-464, 464] through clamp + cast, hardware and software."""
    from quantize_cli.kernels import fp8_quant

    one = torch.tensor([448.0], device=CUDA)
    for v in fp32_range(0.0, 464.0):
        w = v.reshape(1, 1, -1)
        ref = SCHEMES["FP8"].quantize(w[0], one[0])["weight"]
        for soft in (False, True):
            q, _ = fp8_quant.quantize_per_tensor(w, one, soft=soft)
            assert torch.equal(q[0].view(torch.uint8), ref.view(torch.uint8)), f"soft={soft}"


def test_e2m1_every_fp32_value():
    """NVFP4 with weight_scale_2 = 1 and group amax 6 (block scale 1): every fp32 value in [-6, 6]."""
    unit = torch.tensor(2688.0, device=CUDA)
    for v in fp32_range(0.0, 6.0):
        v = v[: v.numel() // 15 * 15].reshape(-1, 15)
        w = torch.cat([torch.full((v.shape[0], 1), 6.0, device=CUDA), v], dim=1).reshape(1, -1)
        assert_same(kernels.quantize("NVFP4", w, unit), SCHEMES["NVFP4"].quantize(w, unit), "E2M1 table")


def test_int8_every_fp32_value():
    """INT8 with row amax 127 (scale 1): every fp32 value in [-127, 127] rounds half to even."""
    for v in fp32_range(0.0, 127.0):
        v = v[: v.numel() // 4095 * 4095].reshape(-1, 4095)
        w = torch.cat([torch.full((v.shape[0], 1), 127.0, device=CUDA), v], dim=1)
        assert_same(kernels.quantize("INT8", w), SCHEMES["INT8"].quantize(w), "INT8 table")


@pytest.mark.parametrize("algo", ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4"])
def test_software_e4m3_equals_hardware(algo):
    """The software e4m3 path (interpreter, pre-sm_89 GPUs) gives the hardware path's bytes."""
    from quantize_cli.kernels import fp8_quant, nvfp4_quant

    w = weight((1000, 1040)).to(CUDA).unsqueeze(0)
    amax = kernels.stack_global_amax(w)
    calls = {
        "FP8": lambda soft: fp8_quant.quantize_per_tensor(w, amax, soft),
        "FP8_PER_CHANNEL_PER_TOKEN": lambda soft: fp8_quant.quantize_per_row(w, soft),
        "FP8_PB_WO": lambda soft: fp8_quant.quantize_per_block(w, soft),
        "NVFP4": lambda soft: nvfp4_quant.quantize(w, amax, soft),
    }
    hard, soft = calls[algo](False), calls[algo](True)
    for h, s in zip(hard, soft):
        assert torch.equal(h.view(torch.uint8), s.view(torch.uint8))


LARGE = [(4096, 4096 + 48), (1000, 11008), (333, 20000), (2048, 28672), (8192, 8192)]


@pytest.mark.parametrize("algo", list(SCHEMES))
@pytest.mark.parametrize("shape", LARGE, ids=lambda s: f"{s[0]}x{s[1]}")
def test_large_shapes(algo, shape):
    """Realistic sizes, incl. rows longer than one tile (K > 16384: the two-pass row path)."""
    w = weight(shape).to(CUDA)
    assert_same(kernels.quantize(algo, w), SCHEMES[algo].quantize(w), f"{algo} {shape}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("algo", list(SCHEMES))
def test_large_dtypes(algo, dtype):
    w = weight((1536, 4096), dtype).to(CUDA)
    assert_same(kernels.quantize(algo, w), SCHEMES[algo].quantize(w), f"{algo} {dtype}")


def test_moe_stack():
    w = torch.stack([weight((1536, 512), seed=e).to(CUDA) * (e + 1) for e in range(8)])
    for algo in SCHEMES:
        out = kernels.quantize_stack(algo, w)
        for e in (0, 7):
            item = {k: v if k == "input_scale" else v[e] for k, v in out.items()}
            assert_same(item, SCHEMES[algo].quantize(w[e]), f"{algo} expert {e}")


@pytest.mark.slow
def test_more_than_2_31_elements():
    """A [524416, 4096] weight (2^31 + 2^19 elements): element offsets overflow int32 past row
    524288. Rows are independent given the global amax, so the last rows of the kernel's output are
    compared with the reference run on those rows alone."""
    n, k = (1 << 31) // 4096 + 128, 4096
    torch.manual_seed(0)
    w = torch.randn(n, k, dtype=torch.bfloat16, device=CUDA)
    w[-1, -1] = 1000.0  # the global amax lives past the int32 boundary
    gamax = kernels.global_amax(w)
    assert gamax.item() == 1000.0
    tail = slice(n - 256, n)
    for algo in SCHEMES:
        scheme = SCHEMES[algo]
        out = kernels.quantize(scheme, w)
        got = {}
        for key, v in out.items():
            if v.dim() == 0 or key == "input_scale":
                got[key] = v  # derived from the global amax alone
            elif algo == "FP8_PB_WO" and key == "weight_scale":
                got[key] = v[tail.start // 128 :]  # [nb, 1, kb, 1]: the last two block rows
            else:
                got[key] = v[tail]
        assert_same(got, scheme.quantize(w[tail], gamax), f"{algo} tail rows")
        del out, got
    # A stack whose second item starts past 2^31 elements: batch offsets are int64 too.
    s = w[: (n // 2) * 2].view(2, n // 2, k)
    out = kernels.quantize_stack("INT8", s)
    assert_same({key: v[1, -64:] for key, v in out.items()}, SCHEMES["INT8"].quantize(s[1, -64:]), "stack item 1")
