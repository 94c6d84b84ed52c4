"""FP8 references == golden vectors (ModelOpt 0.47 exports), byte for byte, plus invariants."""

import pytest
import torch

from quantize_cli.schemes import SCHEMES
from tests.conftest import assert_same_bytes, golden_case

SHAPES = ["256x384", "384x256", "200x96"]
CASES = [("fp8_per_tensor", "FP8"), ("fp8_per_channel", "FP8_PER_CHANNEL_PER_TOKEN"), ("fp8_block128", "FP8_PB_WO")]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("case,algo", CASES)
def test_golden(case, algo, shape):
    """Zero blocks/rows, exact e4m3 ties and very different block magnitudes are in these inputs."""
    g = golden_case(f"{case}_{shape}")
    out = SCHEMES[algo].quantize(g["input.weight"])
    assert_same_bytes(out["weight"], g["expected.weight"], "weight")
    assert_same_bytes(out["weight_scale"], g["expected.weight_scale"], "weight_scale")


def test_per_tensor_differs_from_modelopt_bf16_quotient_on_purpose():
    """We divide in fp32 (expected.weight), not through ModelOpt's bf16 quotient (design §4.6)."""
    g = golden_case("fp8_per_tensor_384x256")
    out = SCHEMES["FP8"].quantize(g["input.weight"])
    differ = (out["weight"].view(torch.uint8) != g["expected.weight_modelopt_exact"].view(torch.uint8)).sum().item()
    assert 0 < differ < 0.05 * out["weight"].numel()


@pytest.mark.parametrize("algo", ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"])
def test_all_zero_tensor_gets_unit_scales_and_zero_payload(algo):
    out = SCHEMES[algo].quantize(torch.zeros(256, 128, dtype=torch.bfloat16))
    assert torch.all(out["weight_scale"] == 1.0)
    assert torch.all(out["weight"].view(torch.uint8) == 0)


@pytest.mark.parametrize("algo", ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"])
def test_same_values_in_bf16_fp16_fp32_give_same_bytes(algo):
    r = torch.randn(256, 256, generator=torch.Generator().manual_seed(3))
    w = (r.sign() * (r.abs() + 0.01)).to(torch.bfloat16)  # fp16-normal range: exact in all three dtypes
    assert torch.equal(w.to(torch.float16).to(torch.bfloat16), w)
    outs = [SCHEMES[algo].quantize(w.to(dt)) for dt in (torch.bfloat16, torch.float16, torch.float32)]
    for o in outs[1:]:
        for k in o:
            assert_same_bytes(o[k], outs[0][k], k)


def test_shapes_and_dtypes_match_outputs_spec():
    for algo, scale_shape in [("FP8", ()), ("FP8_PER_CHANNEL_PER_TOKEN", (384,)), ("FP8_PB_WO", (3, 1, 2, 1))]:
        s = SCHEMES[algo]
        out = s.quantize(torch.randn(384, 256).to(torch.bfloat16))
        spec = s.outputs((384, 256))
        assert set(out) == set(spec)
        assert tuple(out["weight_scale"].shape) == scale_shape
        for k, (dtype, shape) in spec.items():
            assert tuple(out[k].shape) == shape
            assert out[k].dtype == {"F8_E4M3": torch.float8_e4m3fn, "F32": torch.float32}[dtype]


def test_block_scale_is_per_block_not_transposed():
    """Blocks scaled 1, 10, 100, 1000 (row-major): a wrong block-to-scale mapping fails here."""
    w = torch.ones(256, 256)
    for i, f in enumerate([1.0, 10.0, 100.0, 1000.0]):
        r, c = divmod(i, 2)
        w[r * 128 : (r + 1) * 128, c * 128 : (c + 1) * 128] *= f
    s = SCHEMES["FP8_PB_WO"].quantize(w)["weight_scale"][:, 0, :, 0]
    assert torch.equal(s, torch.tensor([[1.0, 10.0], [100.0, 1000.0]]) / 448)


@pytest.mark.parametrize("algo", ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"])
def test_row_chunks_concatenate_to_the_whole(algo):
    """The executor quantizes big tensors in row chunks (multiples of row_align) with a global amax."""
    s = SCHEMES[algo]
    w = (torch.randn(512, 256, generator=torch.Generator().manual_seed(5)) * 0.05).to(torch.bfloat16)
    whole = s.quantize(w)
    g = s.global_amax(w)
    parts = [s.quantize(w[i : i + 256], g) for i in (0, 256)]
    for k, t in whole.items():
        joined = parts[0][k] if t.dim() == 0 else torch.cat([p[k] for p in parts])
        assert_same_bytes(joined, t, k)


@pytest.mark.parametrize("algo", ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"])
def test_dequantized_error_is_small(algo):
    from quantize_cli.schemes.numerics import sqnr_db

    w = torch.randn(256, 256, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    s = SCHEMES[algo]
    assert sqnr_db(w.float(), s.dequantize(s.quantize(w))) > 25


@pytest.mark.parametrize("granularity", ["tensor", "channel", "block"])
def test_one_scale_routine_by_block_shape(granularity):
    """quantize_blocks: amax per block -> amax/448 -> e4m3(w / scale), also on edge blocks (200 x 96)."""
    from quantize_cli.schemes.fp8 import block_shape, quantize_blocks

    w = torch.randn(200, 96, generator=torch.Generator().manual_seed(3)).bfloat16()
    bn, bk = block_shape(granularity, tuple(w.shape))
    q, scale = quantize_blocks(w, (bn, bk))
    assert scale.shape == (-(-200 // bn), -(-96 // bk))
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            tile = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].float()
            s = tile.abs().max() / torch.tensor(448.0)
            assert scale[i, j] == s
            want = (tile / s).clamp(-448, 448).to(torch.float8_e4m3fn)
            assert torch.equal(q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].view(torch.uint8), want.view(torch.uint8))
    if granularity == "tensor":  # a given (shared) amax replaces max |w|
        _, s2 = quantize_blocks(w, (bn, bk), torch.tensor(896.0))
        assert s2.item() == 2.0


@pytest.mark.parametrize("shape", [(256, 384), (200, 96)])
def test_block_dequantize_view_equals_expanded_scales(shape):
    """FP8_PB_WO dequantizes through a broadcast 4-D view when both dims are 128-multiples and
    through expanded scales otherwise: both are w x scale of its block, value for value."""
    from quantize_cli.schemes.numerics import expand_blocks

    torch.manual_seed(0)
    w = torch.randn(shape).bfloat16()
    q = SCHEMES["FP8_PB_WO"].quantize(w)
    want = q["weight"].float() * expand_blocks(q["weight_scale"][:, 0, :, 0], (128, 128), shape)
    assert torch.equal(SCHEMES["FP8_PB_WO"].dequantize(q), want)


def test_square_sums_fp32_agrees_with_fp64_and_falls_back_on_overflow():
    """--report's norms are summed in fp32 (a third of fp64's CPU time) to ~1e-7 of the fp64 sums;
    values whose squares overflow fp32 are summed in fp64 rather than reported as inf."""
    from quantize_cli.schemes.numerics import error_fields, square_sums

    torch.manual_seed(0)
    ref = torch.randn(1024, 4096).bfloat16()
    deq = SCHEMES["FP8"].dequantize(SCHEMES["FP8"].quantize(ref))
    r64, d64 = ref.double(), deq.double()
    want = [float(r64.square().sum()), float((r64 - d64).square().sum())]
    got = square_sums(ref, deq)
    assert all(abs(g - w) <= 1e-6 * w for g, w in zip(got, want)), (got, want)
    big = torch.full((4, 4), 1e30, dtype=torch.bfloat16)
    signal, noise = square_sums(big, big * 0.5)
    assert signal == pytest.approx(16 * float(big[0, 0]) ** 2, rel=1e-12) and noise == pytest.approx(signal / 4, rel=1e-12)
    assert error_fields(signal, noise)["sqnr_db"] == pytest.approx(10 * torch.log10(torch.tensor(4.0)).item())
    assert error_fields(1.0, 0.0) == {"rel_error": 0.0, "sqnr_db": float("inf")}
    tiny = torch.full((64, 64), 1e-30, dtype=torch.bfloat16)  # squares underflow fp32: a drowned member
    signal, noise = square_sums(tiny, torch.zeros_like(tiny))
    assert signal == pytest.approx(4096 * float(tiny[0, 0]) ** 2, rel=1e-12) and noise == signal
    assert error_fields(signal, noise)["sqnr_db"] == 0.0  # not "exact"
