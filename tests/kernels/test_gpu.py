"""GPU-only kernel tests: exhaustive rounding tables, hardware vs software e4m3, the reciprocal
division path, large shapes, and a weight of more than 2^31 elements (int64 offsets). Run on the
GPU machine with ``-m gpu`` (``-m "gpu or not gpu"`` adds the CPU matrix and the slow case).

References run on the CPU (``kernel_helpers.reference``), except in the exhaustive tables, which
need a billion values: there every scale is exactly 1 whichever way torch divides (asserted).
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from kernel_helpers import assert_same, reference, weight

from quantize_cli import kernels
from quantize_cli.kernels._tl_math import div_rcp, div_rn, rcp_refined
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
        ref = SCHEMES["FP8"].quantize(w[0], one[0])
        assert ref["weight_scale"].item() == 1.0
        ref = ref["weight"]
        for soft in (False, True):
            q, _ = fp8_quant.quantize_per_tensor(w, one, soft=soft)
            assert torch.equal(q[0].view(torch.uint8), ref.view(torch.uint8)), f"soft={soft}"


def test_e2m1_every_fp32_value():
    """NVFP4 with weight_scale_2 = 1 and group amax 6 (block scale 1): every fp32 value in [-6, 6]."""
    unit = torch.tensor(2688.0, device=CUDA)
    for v in fp32_range(0.0, 6.0):
        v = v[: v.numel() // 15 * 15].reshape(-1, 15)
        w = torch.cat([torch.full((v.shape[0], 1), 6.0, device=CUDA), v], dim=1).reshape(1, -1)
        ref = SCHEMES["NVFP4"].quantize(w, unit)
        assert ref["weight_scale_2"].item() == 1.0 and torch.all(ref["weight_scale"].float() == 1.0)
        assert_same(kernels.quantize("NVFP4", w, unit), ref, "E2M1 table")


def test_int8_every_fp32_value():
    """INT8 with row amax 127 (scale 1): every fp32 value in [-127, 127] rounds half to even."""
    for v in fp32_range(0.0, 127.0):
        v = v[: v.numel() // 4095 * 4095].reshape(-1, 4095)
        w = torch.cat([torch.full((v.shape[0], 1), 127.0, device=CUDA), v], dim=1)
        ref = SCHEMES["INT8"].quantize(w)
        assert torch.all(ref["weight_scale"] == 1.0)
        assert_same(kernels.quantize("INT8", w), ref, "INT8 table")


def test_int4_every_fp32_value():
    """INT4 with group amax 7 (scale 1): every fp32 value in [-7, 7] rounds half to even, clamped."""
    for v in fp32_range(0.0, 7.0):
        v = v[: v.numel() // 254 * 254].reshape(-1, 127)  # an even number of rows (two per byte)
        w = torch.cat([torch.full((v.shape[0], 1), 7.0, device=CUDA), v], dim=1)
        ref = SCHEMES["INT4"].quantize(w)
        assert torch.all(ref["weight_scale"] == 1.0)
        assert_same(kernels.quantize("INT4", w), ref, "INT4 table")


@pytest.mark.parametrize("algo", ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "MXFP8"])
def test_software_e4m3_equals_hardware(algo):
    """The software e4m3 path (interpreter, pre-sm_89 GPUs) gives the hardware path's bytes."""
    from quantize_cli.kernels import fp8_quant, mxfp8_quant, nvfp4_quant

    w = weight((1000, 1056)).to(CUDA).unsqueeze(0)  # 1056: a multiple of MXFP8's 32, not of 128 (a partial FP8 block)
    amax = kernels.stack_global_amax(w)
    calls = {
        "FP8": lambda soft: fp8_quant.quantize_per_tensor(w, amax, soft),
        "FP8_PER_CHANNEL_PER_TOKEN": lambda soft: fp8_quant.quantize_per_row(w, soft),
        "FP8_PB_WO": lambda soft: fp8_quant.quantize_per_block(w, soft),
        "NVFP4": lambda soft: nvfp4_quant.quantize(w, amax, soft),
        "MXFP8": lambda soft: mxfp8_quant.quantize(w, soft),
    }
    hard, soft = calls[algo](False), calls[algo](True)
    for h, s in zip(hard, soft):
        assert torch.equal(h.view(torch.uint8), s.view(torch.uint8))


@triton.jit
def _divide_both_kernel(x_ptr, d_ptr, fast_ptr, exact_ptr, NX, BLOCK_G: tl.constexpr):
    """Program (i, j): x[i*16*BLOCK_G ...] as ``[BLOCK_G, 16]`` divided by d[j], both ways."""
    i = tl.program_id(0)
    j = tl.program_id(1)
    offs = i * BLOCK_G * 16 + tl.arange(0, BLOCK_G)[:, None] * 16 + tl.arange(0, 16)[None, :]
    m = offs < NX
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    d = tl.load(d_ptr + j + tl.zeros([BLOCK_G], dtype=tl.int32))
    out = j.to(tl.int64) * NX + offs
    tl.store(fast_ptr + out, div_rcp(x, d, rcp_refined(d)), mask=m)
    tl.store(exact_ptr + out, div_rn(x, d[:, None]), mask=m)


def _divisors(lo_exp: int, hi_exp: int, n: int) -> torch.Tensor:
    """`n` random fp32 divisors with exponents in [lo_exp, hi_exp), plus powers of two and
    all-ones mantissas (the reciprocal's hardest case) at both ends."""
    g = torch.Generator().manual_seed(7)
    mant = 1.0 + torch.rand(n, generator=g, dtype=torch.float64)
    expo = torch.randint(lo_exp, hi_exp, (n,), generator=g).double()
    d = (mant * torch.exp2(expo)).float()
    ones = torch.tensor(2.0 - 2.0**-23)
    edges = [2.0**lo_exp, 2.0 ** (hi_exp - 1), 1.0, ones * 2.0**lo_exp, ones * 2.0 ** (hi_exp - 1), ones]
    return torch.cat([d, torch.tensor(edges, dtype=torch.float32)])


@pytest.mark.parametrize("dtype, lo, hi", [(torch.bfloat16, -60, 8), (torch.float16, -60, 61)], ids=["bf16", "fp16"])
def test_reciprocal_division(dtype, lo, hi):
    """``div_rcp`` against ``div_rn`` for every positive finite input value of `dtype` and ~1000
    divisors spanning the range the NVFP4 kernel allows for that dtype: bit-identical wherever the
    quotient's E2M1 code depends on more than its sign (0.2 <= |q| <= 8), and the same E2M1
    code everywhere (|q| <= 2^60, the kernel's domain)."""
    from quantize_cli.schemes.numerics import e2m1_codes

    bits = torch.arange(1, 0x7F80 if dtype == torch.bfloat16 else 0x7C00, dtype=torch.int32)
    x = bits.to(torch.int16).view(dtype).float().to(CUDA)
    d = _divisors(lo, hi, 1024).to(CUDA)
    fast = torch.empty(d.numel(), x.numel(), device=CUDA)
    exact = torch.empty_like(fast)
    _divide_both_kernel[(triton.cdiv(x.numel(), 16 * 64), d.numel())](x, d, fast, exact, x.numel(), BLOCK_G=64)
    keep = exact.abs() <= 2.0**60
    mid = keep & (exact.abs() >= 0.2) & (exact.abs() <= 8.0)
    assert mid.sum() > 200_000  # the band where exact bits matter is well populated (bf16: ~700k pairs)
    assert torch.equal(fast[mid].view(torch.int32), exact[mid].view(torch.int32))
    for sign in (1.0, -1.0):
        assert torch.equal(e2m1_codes(sign * fast[keep]), e2m1_codes(sign * exact[keep]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_nvfp4_reciprocal_path_equals_div_rn(dtype, monkeypatch):
    """The NVFP4 kernel with one reciprocal per group gives the bytes of its div_rn build (and of
    the reference) on weights whose quotients sit on and around every E2M1 tie."""
    from quantize_cli.kernels import nvfp4_quant
    from quantize_cli.schemes.nvfp4 import block_scales, global_scale
    from kernel_helpers import E2M1_TIES, around, signed

    rows = []
    for gamax in (1000.0, 0.0123, 3.7, 2688.0, 2688.0 / 1024):  # the last two: exact ties
        g = torch.tensor(gamax)
        wsf2 = global_scale(g)
        amaxes = torch.linspace(0.3, 1.0, 40) * gamax
        bs8 = block_scales(amaxes.reshape(-1, 1).expand(-1, 16).contiguous(), wsf2)[:, 0]
        for a, b in zip(amaxes.tolist(), bs8.float().tolist()):
            v = signed(around(torch.tensor(E2M1_TIES), (torch.tensor(b) * wsf2).item())).clamp(-a, a)
            rows += [[a] + v[i : i + 15].tolist() + [0.0] * (15 - len(v[i : i + 15])) for i in range(0, v.numel(), 15)]
    w = torch.tensor(rows).reshape(-1, 16 * 8).to(dtype).to(CUDA)
    w = torch.cat([w, weight((256, 128), dtype).to(CUDA)])
    outs = []
    for fast in (True, False):
        monkeypatch.setattr(nvfp4_quant, "FAST_DIV", fast)
        outs.append(kernels.quantize("NVFP4", w))
    assert_same(outs[0], outs[1], "reciprocal vs div_rn")
    assert_same(outs[0], reference(SCHEMES["NVFP4"], w), "reciprocal vs reference")


LARGE = [(4096, 4096 + 48), (1000, 11008), (333, 20000), (512, 28672)]


@pytest.mark.parametrize("algo", list(SCHEMES))
@pytest.mark.parametrize("shape", LARGE, ids=lambda s: f"{s[0]}x{s[1]}")
def test_large_shapes(algo, shape):
    """Realistic sizes, incl. rows longer than one tile (K > 16384: the two-pass row path)."""
    w = weight(shape).to(CUDA)
    if algo in ("MXFP8", "INT4", "INT4_ASYM") and SCHEMES[algo].shape_problem(shape):  # the kernel refuses, as the plan does
        with pytest.raises(ValueError):
            kernels.quantize(algo, w)
        return
    assert_same(kernels.quantize(algo, w), reference(SCHEMES[algo], w), f"{algo} {shape}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("algo", list(SCHEMES))
def test_large_dtypes(algo, dtype):
    w = weight((1536, 4096), dtype).to(CUDA)
    assert_same(kernels.quantize(algo, w), reference(SCHEMES[algo], w), f"{algo} {dtype}")


def test_moe_stack():
    w = torch.stack([weight((1536, 512), seed=e).to(CUDA) * (e + 1) for e in range(8)])
    for algo in SCHEMES:
        out = kernels.quantize_stack(algo, w)
        for e in (0, 7):
            item = {k: v if k == "input_scale" else v[e] for k, v in out.items()}
            assert_same(item, reference(SCHEMES[algo], w[e]), f"{algo} expert {e}")


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
            elif algo.startswith("INT4") and key == "weight":
                got[key] = v[tail.start // 2 :]  # [N/2, K]: two rows per byte
            else:
                got[key] = v[tail]
        assert_same(got, reference(scheme, w[tail], gamax), f"{algo} tail rows")
        del out, got
    # A stack whose second item starts past 2^31 elements: batch offsets are int64 too.
    s = w[: (n // 2) * 2].view(2, n // 2, k)
    out = kernels.quantize_stack("INT8", s)
    assert_same({key: v[1, -64:] for key, v in out.items()}, reference(SCHEMES["INT8"], s[1, -64:]), "stack item 1")
