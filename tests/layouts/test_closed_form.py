"""Closed forms of the spec (kernel-layouts.md), computed here element by element with index
arithmetic, independent of the reshape/permute implementation. Most of these have no golden
vector (other shapes, padding, the one-group branch, 16-row shuffle, BlockMajorK, fp16 scale
rounding); the golden tests pin the same code on the shapes that have one."""

from __future__ import annotations

import json

import pytest
import torch

from quantize_cli import layouts as L
from quantize_cli.layouts import Layout
from quantize_cli.layouts import cutlass as C
from quantize_cli.layouts import flashinfer as FI
from quantize_cli.layouts import marlin as M
from tests.conftest import assert_same_bytes

from .helpers import ALGOS, DENSE, MOE, moe_plain, quantize

G = torch.Generator().manual_seed(1)


def _marlin_closed_form(codes_kn: torch.Tensor, bits: int) -> torch.Tensor:
    """Spec §1.2, literally: int index and bit position of every code (k, n)."""
    k_, n_ = codes_kn.shape
    k = torch.arange(k_)[:, None].expand(k_, n_)
    n = torch.arange(n_)[None, :].expand(k_, n_)
    kt, kk, nt, nn = k // 16, k % 16, n // 64, n % 64
    w, b, col = nn // 16, (nn % 16) // 8, nn % 8
    t = (kk % 8) // 2
    th = 4 * col + t
    r = (kk % 2) + 2 * (kk // 8)
    pf = 32 // bits
    row = n_ * 16 // pf
    if bits == 4:
        idx = kt * row + nt * 128 + 4 * th + w
        e = 4 * b + r
        pos = 4 * (e // 2 + 4 * (e % 2))
    else:
        idx = kt * row + nt * 256 + 8 * th + 2 * w + b
        pos = 8 * torch.tensor([0, 2, 1, 3])[r]
    out = torch.zeros(k_ // 16 * row, dtype=torch.int64)
    out.index_add_(0, idx.reshape(-1), (codes_kn.long() << pos).reshape(-1))  # disjoint bits: sum = or
    out = torch.where(out >= 2**31, out - 2**32, out)
    return out.to(torch.int32).reshape(k_ // 16, row)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k,n", [(16, 64), (64, 128), (256, 192), (128, 640)])
def test_marlin_weight_closed_form(bits, k, n):
    codes = torch.randint(0, 2**bits, (n, k), generator=G, dtype=torch.uint8)
    packed = M.repack_codes(codes, bits)
    assert_same_bytes(packed, _marlin_closed_form(codes.T, bits), "marlin weight")
    assert_same_bytes(M.unrepack_codes(packed, bits), codes, "inverse")


def test_marlin_scale_permutations():
    """§1.3: grouped = 8x8 transpose of each 64-chunk; single = off[] gather on 32-chunks."""
    s = torch.randn(4, 128, generator=G)
    flat, p = s.reshape(-1), torch.arange(s.numel())
    grouped = flat[64 * (p // 64) + 8 * (p % 64 % 8) + (p % 64) // 8]
    off = torch.tensor([0, 1, 8, 9, 16, 17, 24, 25])
    q = p % 32
    single = flat[32 * (p // 32) + 2 * (q // 8) + off[q % 8]]
    assert torch.equal(M.permute_scales(s, True).reshape(-1), grouped)
    assert torch.equal(M.permute_scales(s, False).reshape(-1), single)
    for g in (True, False):
        assert torch.equal(M.unpermute_scales(M.permute_scales(s, g), g), s)


def test_marlin_fp8_block_single_group_branch():
    """K == 128 (one FP8 block along K) takes the channel-wise permutation (spec §1.3 warning).

    (A block scale is constant over its 128 columns, so both permutations give the same values
    here; the branch is still checked, for the day a finer block appears.)"""
    plain = quantize("FP8_PB_WO", 256, 128)
    s = M.channel_scales("FP8_PB_WO", plain["weight_scale"], 256, 256, 128, torch.bfloat16)
    ref = plain["weight_scale"][:, 0, 0, 0].to(torch.bfloat16).repeat_interleave(128)[None]
    assert torch.equal(s, M.permute_scales(ref, grouped=False) * 2.0**120)
    assert (M._grouped(128, 128), M._grouped(128, 256), M._grouped(-1, 256), M._grouped(16, 64)) == (
        False, True, False, True)


@pytest.mark.parametrize("n,k,g,expected", [
    (256, 384, -1, (256, 384)), (200, 96, -1, (256, 128)), (64, 200, -1, (64, 256)),
    (96, 80, 16, (128, 128)), (2880, 2880, 16, (2880, 2944)), (200, 176, 16, (256, 192)), (8, 32, -1, (64, 128)),
])
def test_marlin_padding_family(n, k, g, expected):
    """``marlin_padded_nk``: the cheaper of (N%64, K%128) / (N%128, K%64), K a multiple of the group."""
    assert M.padded_nk(n, k, g) == expected


def test_marlin_fp8_scale_finishing():
    """§1.4: round to the activation dtype first, then x2^120 (bf16) / x2^8 (fp16); fp16
    sub-normals keep fewer bits and scales <= 2^-25 flush to 0."""
    ws = torch.tensor([1e-3, 2.0**-20, 2.0**-25, 3 * 2.0**-26, 2.0**-24 * 1.5] + [0.5] * 59)
    for act, bias in ((torch.bfloat16, 2.0**120), (torch.float16, 2.0**8)):
        s = M.unpermute_scales(M.channel_scales("FP8_PER_CHANNEL_PER_TOKEN", ws, 64, 64, 128, act), False)
        assert torch.equal(s[0], ws.to(act) * bias)
    fp16 = M.channel_scales("FP8_PER_CHANNEL_PER_TOKEN", ws, 64, 64, 128, torch.float16)
    assert M.unpermute_scales(fp16, False)[0, 2] == 0  # 2^-25: a tie between 0 and 2^-24, to even


def test_marlin_nvfp4_scale_bytes():
    """fp16, sf = 1: a normal e4m3 code c is stored as c + 120; sub-normal codes (< 8) as 0."""
    codes = torch.arange(0, 0x7F, dtype=torch.uint8)
    ws = codes.repeat(2)[:256 - 2].reshape(1, -1)
    ws = torch.cat([ws, torch.full((1, 2), 0x38, dtype=torch.uint8)], 1).view(torch.float8_e4m3fn)  # [1, 256]
    ws = ws.reshape(16, 16)  # [N=16, K/16=16]
    b = M.nvfp4_scales(ws, 16, 64, 256, torch.float16, 1.0)
    got = M.unpermute_scales(b.view(torch.uint8).reshape(-1, 2, 2).transpose(1, 2).reshape(b.shape), True)
    c = ws.view(torch.uint8).T.long()
    want = torch.where(c >= 8, c + 120, torch.zeros_like(c))
    assert torch.equal(got[:, :16].long(), want)
    assert torch.equal(got[:, 16:], torch.zeros_like(got[:, 16:]))  # N padding


@pytest.mark.parametrize("max_scale,act,sf", [
    (448.0, torch.bfloat16, 1.0), (0.5, torch.bfloat16, 512.0), (224.0, torch.bfloat16, 2.0),
    (240.0, torch.bfloat16, 1.0), (2.0**-9, torch.bfloat16, 2.0**17), (0.5, torch.float16, 1.0)])
def test_marlin_nvfp4_scale_factor(max_scale, act, sf):
    """sf = 2^floor(log2(448*2^7 / max(s*2^7))): max * sf lands in (224, 448]; fp16 always 1."""
    ws = torch.tensor([[max_scale, max_scale / 4, 0.0, 2.0**-9]]).to(torch.float8_e4m3fn)
    assert M.nvfp4_scale_factor(ws, act) == sf
    assert M.nvfp4_scale_factor([ws[:, 1:], ws[:, :1]], act) == sf  # a fused group: one factor over all


def test_swizzle_offset_formula():
    """§2.4: flat offset (m//128)*128*Kp + (c//4)*512 + (m%32)*16 + ((m%128)//32)*4 + c%4."""
    for m_, c_ in ((200, 11), (256, 24), (1, 1), (130, 9)):
        s = torch.randint(1, 255, (m_, c_), generator=G, dtype=torch.uint8)
        sw = C.swizzle_128x4(s)
        mp, kp = (m_ + 127) // 128 * 128, (c_ + 3) // 4 * 4
        assert sw.shape == (mp, kp)
        m, c = torch.meshgrid(torch.arange(m_), torch.arange(c_), indexing="ij")
        off = (m // 128) * 128 * kp + (c // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + c % 4
        flat = sw.reshape(-1)
        assert torch.equal(flat[off], s)
        mask = torch.ones(mp * kp, dtype=torch.bool)
        mask[off.reshape(-1)] = False
        assert int(flat[mask].count_nonzero()) == 0  # padding is zero
        assert torch.equal(C.unswizzle_128x4(sw, m_, c_), s)


@pytest.mark.parametrize("block", [16, 32])
def test_row_shuffle_formula(block):
    """shuffle_matrix_a: out[r] = in[(r//B)*B + (r%8)*(B/8) + (r%B)//8]."""
    x = torch.randn(4 * block, 3, generator=G)
    r = torch.arange(4 * block)
    src = (r // block) * block + (r % 8) * (block // 8) + (r % block) // 8
    assert torch.equal(FI.shuffle_rows(x, block), x[src])
    assert torch.equal(FI.unshuffle_rows(FI.shuffle_rows(x, block), block), x)


def test_moe_gated_shuffle_formula():
    """w13 row r <- src(r): s = (r//32)*32 + (r%8)*4 + (r%32)//8; I + s//2 if s even else s//2."""
    e, i = 2, 64
    x = torch.randn(e, 2 * i, 5, generator=G)
    r = torch.arange(2 * i)
    s = (r // 32) * 32 + (r % 8) * 4 + (r % 32) // 8
    src = torch.where(s % 2 == 0, i + s // 2, s // 2)
    assert torch.equal(FI.gated_shuffle(x), x[:, src])
    assert torch.equal(FI.gated_unshuffle(FI.gated_shuffle(x)), x)
    assert torch.equal(FI.swap_w13(x), x[:, (r + i) % (2 * i)])


def test_block_major_k_formula():
    """TRT-LLM block FP8: out[e, kb, r, :] = w[e, shuffle16(r), 128*kb : 128*(kb+1)]."""
    w = torch.randint(0, 0x7E, (2, 256, 384), generator=G, dtype=torch.uint8).view(torch.float8_e4m3fn)
    out = FI.block_major_k(w).view(torch.uint8)
    r = torch.arange(256)
    src = (r // 16) * 16 + (r % 8) * 2 + (r % 16) // 8
    want = w.view(torch.uint8).reshape(2, 256, 3, 128)[:, src].permute(0, 2, 1, 3)
    assert torch.equal(out, want)


def test_moe_block_scales_clamped_and_fp8_scale_is_the_max():
    w13, w2 = moe_plain("FP8_PB_WO", 2, 128, 128)
    w13["weight_scale"][0, 1, 0] = 1e-13
    p = L.pack_moe("cutlass", "FP8_PB_WO", w13, w2)
    assert p["w13"]["weight_scale_cutlass"][0, 0, 0] == torch.tensor(1e-10, dtype=torch.float32)
    assert torch.equal(p["w13"]["weight_scale"], w13["weight_scale"])  # the plain one is kept as is
    w13, w2 = moe_plain("FP8", 2, 16, 64)
    p = L.pack_moe("cutlass", "FP8", w13, w2)
    assert torch.equal(p["w13"]["weight_scale_cutlass"], w13["weight_scale"][:, 0])


def test_supported_table_and_reasons():
    assert set(DENSE) == {(Layout.MARLIN, a) for a in ALGOS if a != "INT4_ASYM"} | {(Layout.CUTLASS, "NVFP4"), (Layout.FLASHINFER, "NVFP4")}
    assert set(MOE) == {(lay, a) for lay in (Layout.CUTLASS, Layout.FLASHINFER) for a in ("FP8", "FP8_PB_WO", "NVFP4")} | {
        (Layout.MARLIN, "MXFP8")}
    assert "FlashInfer's MXFP8" in L.supported("cutlass", "MXFP8") and "FlashInfer's MXFP8" in L.supported("flashinfer", "MXFP8", moe=True)
    for algo in ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "INT8"):
        assert "no bytes move" in L.supported("cutlass", algo)
    assert "no bytes move" in L.supported("flashinfer", "FP8")
    assert "marlin" in L.supported("cutlass", "w4a16_nvfp4")
    assert L.supported("marlin", "W8A16") is None  # the ModelOpt name of INT8
    assert "Marlin MoE" in L.supported("marlin", "NVFP4", moe=True)
    assert all(L.supported("plain", a) is None for a in ALGOS)


def test_layout_enum_and_metadata():
    assert Layout("marlin") is Layout.MARLIN and "16x64" in Layout.MARLIN.__doc__
    for layout in Layout:
        meta = L.layout_metadata(layout, torch.float16)
        json.dumps(meta)
        assert meta["name"] == layout.value
    assert L.layout_metadata("marlin", torch.float16)["activation_dtype"] == "float16"
    assert "vllm 0.33.0" in L.layout_metadata("marlin")["target"]
    assert "flashinfer 0.7.2" in L.layout_metadata("flashinfer")["target"]


@pytest.mark.gpu
def test_cuda_gives_the_same_bytes():
    """Every pure function on CUDA tensors: the same bytes as on the CPU (pack and unpack)."""
    cuda = torch.device("cuda")
    on = lambda d, dev: {k: v.to(dev) for k, v in d.items()}  # noqa: E731
    for layout, algo in DENSE:
        for shape in ((256, 384), (200, 176), (384, 128)):
            if L.shape_problem(layout, algo, shape):
                continue
            for act in (torch.bfloat16, torch.float16):
                plain = quantize(algo, *shape)
                cpu = L.pack(layout, algo, plain, act)
                gpu = L.pack(layout, algo, on(plain, cuda), act)
                for k in cpu:
                    assert_same_bytes(gpu[k].cpu(), cpu[k], f"{layout}-{algo}-{shape}: {k}")
                back = L.unpack(layout, algo, gpu, act)
                for k in plain:
                    assert_same_bytes(back[k].cpu(), plain[k], f"{layout}-{algo}: unpack {k}")
                assert torch.equal(L.dequantize(layout, algo, gpu, act).cpu(), L.dequantize(layout, algo, cpu, act))
    for layout, algo in MOE:
        w13, w2 = moe_plain(algo, 2, 128, 256)
        cpu = L.pack_moe(layout, algo, w13, w2)
        gpu = L.pack_moe(layout, algo, on(w13, cuda), on(w2, cuda))
        for side in cpu:
            for k in cpu[side]:
                assert_same_bytes(gpu[side][k].cpu(), cpu[side][k], f"moe {layout}-{algo}: {side}.{k}")
        back = L.unpack_moe(layout, algo, gpu)
        for side, plain in (("w13", w13), ("w2", w2)):
            for k in plain:
                assert_same_bytes(back[side][k].cpu(), plain[k], f"moe unpack {side}.{k}")
