"""Searched INT4 group scales (``--scale-search mse``): ModelOpt W4A16_AWQ (``amax / 7``, fp32) and
compressed-tensors W4A16 (``amax / 7.5``) / W4A16_ASYM (scale and zero point from the group's
shrunk min and max, in the weight's dtype), the reference's contract.

* Never worse than round to nearest in the (weighted) squared error of each 128-group, up to the
  documented resolution (hypothesis; the errors recomputed in fp64 from the written tensors).
* The ModelOpt choice is the oracle minimum over the candidates; an asymmetric choice is exactly
  the scheme's RTN formula applied to one candidate's (min * m_i, max * m_i).
* Equal weights give the unweighted bytes; zero weights and all-zero groups (every candidate ties)
  keep round to nearest (candidate 0); row chunks concatenate (the converter's row chunks).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quantize_cli.formats.compressed_tensors import CT_SCHEMES
from quantize_cli.formats.ct_int4 import ct_int4_qparams_from, group_bounds, unpack_int32
from quantize_cli.schemes import SCHEMES
from quantize_cli.schemes.int4 import unpack_row_pairs
from quantize_cli.schemes.numerics import scale_from_amax
from quantize_cli.schemes.search import INT4_SHIFT, ROW_MULTIPLIERS
from quantize_cli.schemes.searched import with_scale_search
from tests.conftest import assert_same_bytes
from tests.schemes.test_search_weighted import awkward_channel_weights, awkward_weight

VARIANTS = {"INT4": SCHEMES["INT4"], "ct-INT4": CT_SCHEMES["INT4"], "ct-INT4_ASYM": CT_SCHEMES["INT4_ASYM"]}


def searched(name):
    return with_scale_search(VARIANTS[name], "mse")


def decoded(out: dict, n: int):
    """fp64 (codes - zero point) [N, K] and scales [N, K/128] of written tensors, either format."""
    if "weight_packed" in out:
        v = unpack_int32(out["weight_packed"], out["weight_packed"].shape[1] * 8).double()
        if "weight_zero_point" in out:
            v = v - unpack_int32(out["weight_zero_point"], n, dim=0).double().repeat_interleave(128, 1)
        return v, out["weight_scale"].double()
    return unpack_row_pairs(out["weight"]).double(), out["weight_scale"].double()


def group_errors(w, out, cw=None):
    """fp64 [G] weighted squared error per 128-group, fp64 [G] scale, [G] largest weight of the group."""
    n, k = w.shape
    v, s = decoded(out, n)
    d = (w.double() - v * s.repeat_interleave(128, 1)) ** 2
    c = torch.ones(k, dtype=torch.float64) if cw is None else cw.double()
    err = (d * c).reshape(n, k // 128, 128).sum(-1)
    return err.reshape(-1), s.reshape(-1), c.reshape(k // 128, 128).amax(-1).repeat(n)


def slack(s_rtn, top):
    """One unit per element of the int64 sums (2^-SHIFT RTN-scale^2), as a weighted squared error."""
    return 128 * s_rtn**2 * 2.0**-INT4_SHIFT * top


@st.composite
def cases(draw):
    """A weight [N, K] (N a multiple of 8, K of 128) with awkward content, and channel weights (or None)."""
    n, k = 8 * draw(st.integers(1, 3)), 128 * draw(st.integers(1, 3))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    w = awkward_weight(draw, g, n, k)
    if draw(st.booleans()):
        w = w.abs() * draw(st.sampled_from([1.0, -1.0]))  # one-signed groups: the asymmetric zero point at an edge
    cw = awkward_channel_weights(draw, g, k) if draw(st.booleans()) else None
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
    return w.to(dtype), cw


@pytest.mark.parametrize("name", list(VARIANTS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_never_worse_than_round_to_nearest(name, case):
    w, cw = case
    err_s, _, _ = group_errors(w, searched(name).quantize(w, None, cw), cw)
    err_r, s_rtn, top = group_errors(w, VARIANTS[name].quantize(w), cw)
    bad = err_s > err_r + slack(s_rtn, top)
    assert not bad.any(), f"{name}: weighted error above RTN in {int(bad.sum())} group(s)"


@pytest.mark.parametrize("name", list(VARIANTS))
def test_lower_error_and_same_tensors(name):
    w = torch.randn(16, 384, generator=torch.Generator().manual_seed(1)).bfloat16()
    a, b = searched(name).quantize(w), VARIANTS[name].quantize(w)
    assert {k: (v.dtype, v.shape) for k, v in a.items()} == {k: (v.dtype, v.shape) for k, v in b.items()}
    err_s, err_r = group_errors(w, a)[0], group_errors(w, b)[0]
    assert (err_s < err_r).float().mean() > 0.5 and err_s.sum() < 0.9 * err_r.sum()


def test_modelopt_choice_is_the_oracle_minimum():
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(32, 256, generator=g) * torch.exp2(torch.randint(-3, 3, (1, 256), generator=g).float())).bfloat16()
    cw = torch.exp2(torch.randn(256, generator=g) * 5)
    n, k = w.shape
    amax = w.float().abs().reshape(n, k // 128, 128).amax(-1)
    errs = []
    for m in ROW_MULTIPLIERS:
        s = scale_from_amax(amax * torch.tensor(m, dtype=torch.float32), 7.0)
        q = (w.float() / s.repeat_interleave(128, 1)).round().clamp(-8, 7).double()
        errs.append((((w.double() - q * s.double().repeat_interleave(128, 1)) ** 2) * cw.double()).reshape(n, -1, 128).sum(-1).reshape(-1))
    best = torch.stack(errs).amin(0)
    chosen, s_rtn, top = group_errors(w, searched("INT4").quantize(w, None, cw), cw)
    assert torch.all(chosen >= best) and torch.all(chosen <= best + slack(s_rtn, top))


@pytest.mark.parametrize("symmetric", [True, False])
def test_ct_qparams_are_the_formula_of_a_shrunk_range(symmetric):
    """Each group's (scale, zero point) is the scheme's RTN formula of (dt(lo * m_i), dt(hi * m_i))."""
    w = torch.randn(16, 256, generator=torch.Generator().manual_seed(4)).bfloat16() + 0.3
    out = searched("ct-INT4" if symmetric else "ct-INT4_ASYM").quantize(w)
    lo, hi = group_bounds(w)
    cands = [ct_int4_qparams_from((lo.float() * m).bfloat16(), (hi.float() * m).bfloat16(), symmetric) for m in ROW_MULTIPLIERS]
    s = out["weight_scale"]
    z = None if symmetric else unpack_int32(out["weight_zero_point"], 16, dim=0)
    picked = torch.full(s.shape, -1)
    for i, (cs, cz) in reversed(list(enumerate(cands))):
        hit = torch.eq(cs, s) & (True if z is None else torch.eq(cz, z))
        picked = torch.where(hit, i, picked)
    assert torch.all(picked >= 0) and torch.any(picked > 0)


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("value", [1.0, 7.3, 1e-30, 3e8])
def test_equal_weights_are_the_unweighted_search(name, value):
    w = torch.randn(16, 384, generator=torch.Generator().manual_seed(2)).bfloat16()
    a, b = searched(name).quantize(w, None, torch.full((384,), value)), searched(name).quantize(w)
    for key in b:
        assert_same_bytes(a[key], b[key], f"{name} {key}")


@pytest.mark.parametrize("name", list(VARIANTS))
def test_ties_keep_round_to_nearest(name):
    """Zero channel weights (no calibration token reached them) and all-zero groups: every candidate
    has the same error, and candidate 0 (round to nearest) stays."""
    w = torch.randn(16, 256, generator=torch.Generator().manual_seed(3)).bfloat16()
    a, b = searched(name).quantize(w, None, torch.zeros(256)), VARIANTS[name].quantize(w)
    for key in b:
        assert_same_bytes(a[key], b[key], f"{name} {key}")
    w[:, :128] = 0
    a, b = searched(name).quantize(w), VARIANTS[name].quantize(w)
    assert torch.equal(a["weight_scale"][:, 0], b["weight_scale"][:, 0])
    assert not torch.equal(a["weight_scale"][:, 1], b["weight_scale"][:, 1])


@pytest.mark.parametrize("name", list(VARIANTS))
def test_row_chunks_concatenate(name):
    w = torch.randn(24, 256, generator=torch.Generator().manual_seed(6)).bfloat16()
    cw = torch.exp2(torch.randn(256, generator=torch.Generator().manual_seed(7)) * 4)
    s = searched(name)
    whole, parts = s.quantize(w, None, cw), [s.quantize(w[r : r + 8], None, cw) for r in (0, 8, 16)]
    for key in whole:  # every tensor is split by rows (the zero points: eight rows per int32)
        assert_same_bytes(whole[key], torch.cat([p[key] for p in parts]), f"{name} {key}")
