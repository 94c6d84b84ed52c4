"""``unpack(pack(x)) == x`` byte for byte for every supported (layout, algo), on shapes that are
and are not tile multiples, and ``packed_specs`` announces exactly what ``pack`` returns."""

from __future__ import annotations

import pytest
import torch

from quantize_cli import layouts as L
from quantize_cli.layouts import Layout
from tests.conftest import assert_same_bytes

from .helpers import DENSE, MOE, TORCH_DTYPE, moe_plain, quantize

# [N, K]: tile multiples, non-multiples (Marlin / CUTLASS pad), tiny, and a single 128 K block.
SHAPES = [(256, 384), (200, 176), (130, 304), (8, 32), (64, 16), (128, 64), (384, 128), (256, 256), (200, 160), (200, 256)]


def _cases():
    for layout, algo in DENSE:
        acts = (torch.bfloat16, torch.float16) if layout is Layout.MARLIN else (torch.bfloat16,)  # Marlin only
        for shape in SHAPES:
            for act in acts:
                if L.shape_problem(layout, algo, shape) is None:
                    name = f"{layout.value}-{algo}-{shape[0]}x{shape[1]}-{str(act)[6:]}"
                    yield pytest.param(layout, algo, shape, act, id=name)


def _check_specs(specs: dict, tensors: dict) -> None:
    assert set(specs) == set(tensors)
    for name, (dtype, shape) in specs.items():
        t = tensors[name]
        assert (t.dtype, tuple(t.shape)) == (TORCH_DTYPE[dtype], tuple(shape)), name


@pytest.mark.parametrize("layout,algo,shape,act", list(_cases()))
def test_dense_roundtrip(layout, algo, shape, act):
    plain = quantize(algo, *shape)
    packed = L.pack(layout, algo, plain, act)
    _check_specs(L.packed_specs(layout, algo, shape, act), packed)
    assert "weight" not in packed  # a stock loader must miss it
    for k in plain:
        if k != "weight":
            assert packed[k] is plain[k] or torch.equal(packed[k], plain[k])  # plain scales kept
    back = L.unpack(layout, algo, packed, act)
    assert set(back) == set(plain)
    for k in plain:
        assert_same_bytes(back[k], plain[k], k)


def test_every_combination_has_padded_and_unpadded_shapes():
    for layout, algo in DENSE:
        shapes = [s for s in SHAPES if L.shape_problem(layout, algo, s) is None]
        assert len(shapes) >= 2, (layout, algo)
        if layout in (Layout.MARLIN, Layout.CUTLASS) and algo != "FP8_PB_WO":
            assert (200, 176) in shapes or (algo == "MXFP8" and (200, 160) in shapes) or (algo == "INT4" and (200, 256) in shapes)


MOE_SHAPES = [(2, 128, 256), (3, 256, 512), (1, 64, 256), (2, 16, 96)]


@pytest.mark.parametrize("layout,algo", MOE, ids=[f"{lay.value}-{a}" for lay, a in MOE])
def test_moe_roundtrip(layout, algo):
    done = 0
    for e, i, h in MOE_SHAPES:
        if L.moe_shape_problem(layout, algo, e, i, h):
            continue
        w13, w2 = moe_plain(algo, e, i, h)
        packed = L.pack_moe(layout, algo, w13, w2)
        specs = L.moe_packed_specs(layout, algo, e, i, h)
        sfx = L.suffix(layout)
        for side in ("w13", "w2"):
            _check_specs(specs[side], {k: v for k, v in packed[side].items() if k.endswith(sfx)})
            assert "weight" not in packed[side]
        back = L.unpack_moe(layout, algo, packed)
        for side, plain in (("w13", w13), ("w2", w2)):
            assert set(back[side]) == set(plain)
            for k in plain:
                assert_same_bytes(back[side][k], plain[k], f"{side}.{k}")
        done += 1
    assert done >= 2


def test_unsupported_combinations_are_refused_with_a_reason():
    plain = quantize("FP8", 128, 128)
    with pytest.raises(ValueError, match="no bytes move"):
        L.pack("cutlass", "FP8", plain)
    with pytest.raises(ValueError, match="marlin"):
        L.pack("flashinfer", "W4A16_NVFP4", quantize("W4A16_NVFP4", 128, 128))
    with pytest.raises(ValueError, match="N % 128"):
        L.packed_specs("flashinfer", "NVFP4", (200, 176))
    with pytest.raises(ValueError, match="intermediate"):
        L.moe_packed_specs("flashinfer", "NVFP4", 2, 32, 256)
    w13, w2 = moe_plain("FP8", 2, 16, 64)
    w13["weight_scale"][1, 1] *= 2
    with pytest.raises(ValueError, match="equal w1/w3"):
        L.pack_moe("flashinfer", "FP8", w13, w2)


def test_plain_layout_is_identity():
    plain = quantize("NVFP4", 64, 64)
    assert L.pack("plain", "NVFP4", plain) == plain
    assert L.packed_specs("plain", "NVFP4", (64, 64)) == L.SCHEMES["NVFP4"].outputs((64, 64))
