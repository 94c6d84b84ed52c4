"""Activation-weighted scale search (``channel_weights``): the reference's contract.

* Oracle: per group, every candidate's weighted squared error computed directly in fp64 from its
  own dequantization (a second implementation); the searched choice is the minimum up to the
  documented resolution, never worse than round-to-nearest (hypothesis, every kind of group).
* Equal weights are the unweighted search, bit for bit; zero weights keep round-to-nearest.
* A massive input channel: the weighted search trades error elsewhere for less error there.
* Row chunks concatenate; bad weights are refused naming the rule.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quantize_cli.schemes import SCHEMES
from quantize_cli.schemes.numerics import e2m1_values, unpack_nibbles
from quantize_cli.schemes.search import (NVFP4_CODE_STEPS, NVFP4_SHIFT, NVFP4_WEIGHTED_CODE_STEPS, ROW_MULTIPLIERS, ROW_SHIFT,
                                         nvfp4_block_scales, nvfp4_payload)
from quantize_cli.schemes.searched import with_scale_search
from quantize_cli.schemes.nvfp4 import block_scales, global_scale
from tests.conftest import assert_same_bytes

ALGOS = ("INT8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "W4A16_NVFP4")


def weighted_group_errors(algo: str, w: torch.Tensor, out: dict, cw: torch.Tensor):
    """(fp64 weighted squared error per group, fp64 RTN-sized scale per group, max weight per group)."""
    x, c = w.double(), cw.double()
    n, k = w.shape
    if algo == "W4A16_NVFP4":
        vals = e2m1_values(unpack_nibbles(out["weight"])).double().reshape(n, k // 16, 16)
        s = out["weight_scale"].double() * out["weight_scale_2"].double()
        err = ((x.reshape(n, k // 16, 16) - vals * s[..., None]) ** 2 * c.reshape(k // 16, 16)).sum(-1)
        return err.reshape(-1), s.reshape(-1), c.reshape(k // 16, 16).amax(-1).repeat(n)
    if algo == "FP8_PB_WO":
        s = out["weight_scale"][:, 0, :, 0].double()
        nb, kb = s.shape
        d = (x - out["weight"].double() * s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]) ** 2 * c
        d = torch.nn.functional.pad(d, (0, kb * 128 - k, 0, nb * 128 - n))
        top = torch.nn.functional.pad(c, (0, kb * 128 - k)).reshape(kb, 128).amax(-1).repeat(nb)
        return d.reshape(nb, 128, kb, 128).sum(dim=(1, 3)).reshape(-1), s.reshape(-1), top
    s = out["weight_scale"].double()
    return ((x - out["weight"].double() * s[:, None]) ** 2 * c).sum(-1), s, c.amax().repeat(n)


def resolution(algo, shape, s_rtn, top):
    """One unit per element of the int64 sums, as a weighted squared error (module doc of search.py)."""
    length = {"W4A16_NVFP4": 16, "FP8_PB_WO": 128 * 128}.get(algo, shape[1])
    shift = NVFP4_SHIFT if algo == "W4A16_NVFP4" else ROW_SHIFT
    return length * s_rtn**2 * 2.0**-shift * top


def awkward_weight(draw, g: torch.Generator, n: int, k: int) -> torch.Tensor:
    """fp32 [N, K]: heavy tails (cubed normals) and row magnitudes from 2^-20 to 2^9."""
    w = torch.randn(n, k, generator=g) ** draw(st.sampled_from([1, 3]))
    return w * torch.exp2(torch.randint(-20, 10, (n, 1), generator=g).float())


def awkward_channel_weights(draw, g: torch.Generator, k: int) -> torch.Tensor:
    """[K] like a calibration's E[x_j^2]: a wide range, 10% zeros, maybe one massive channel."""
    cw = torch.exp2(torch.randn(k, generator=g) * 4)
    cw[torch.rand(k, generator=g) < 0.1] = 0.0
    if draw(st.booleans()):
        cw[torch.randint(0, k, (1,), generator=g)] = 1e7  # a massive-activation channel
    return cw


@st.composite
def weighted_cases(draw):
    """A weight [N, K] with awkward content and channel weights with a wide range, zeros and a massive channel."""
    n, k = draw(st.integers(1, 6)), 16 * draw(st.integers(1, 10))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    w, cw = awkward_weight(draw, g, n, k), awkward_channel_weights(draw, g, k)
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
    return w.to(dtype), cw


@pytest.mark.parametrize("algo", ALGOS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=weighted_cases())
def test_weighted_error_never_above_round_to_nearest(algo, case):
    w, cw = case
    err_s, _, _ = weighted_group_errors(algo, w, with_scale_search(SCHEMES[algo], "mse").quantize(w, None, cw), cw)
    err_r, s_rtn, top = weighted_group_errors(algo, w, SCHEMES[algo].quantize(w), cw)
    slack = resolution(algo, w.shape, s_rtn, top)
    assert torch.all(err_s <= err_r + slack), f"{algo}: weighted error above RTN in {int((err_s > err_r + slack).sum())} group(s)"


def nvfp4_candidates(w, wsf2, cw):
    """[C, G] fp64 weighted error of every candidate code of the weighted search, and [C, G] validity,
    computed directly."""
    n, k = w.shape
    code0 = block_scales(w, wsf2).view(torch.uint8).long()
    errs, valid = [], []
    for step in NVFP4_WEIGHTED_CODE_STEPS:
        code = code0 + step
        valid.append(((code >= 1) & (code <= 126)).reshape(-1))
        bs8 = code.clamp(1, 126).to(torch.uint8).view(torch.float8_e4m3fn)
        v = e2m1_values(unpack_nibbles(nvfp4_payload(w, bs8, wsf2))).double().reshape(n, k // 16, 16)
        s = bs8.double() * wsf2.double()
        errs.append(((w.double().reshape(n, k // 16, 16) - v * s[..., None]) ** 2 * cw.double().reshape(k // 16, 16)).sum(-1).reshape(-1))
    return torch.stack(errs), torch.stack(valid)


def test_nvfp4_choice_is_the_oracle_minimum():
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(64, 256, generator=g) * torch.exp2(torch.randint(-3, 3, (1, 256), generator=g).float())).bfloat16()
    cw = torch.exp2(torch.randn(256, generator=g) * 5)
    wsf2 = global_scale(w.float().abs().amax())
    errs, valid = nvfp4_candidates(w, wsf2, cw)
    out = with_scale_search(SCHEMES["W4A16_NVFP4"], "mse").quantize(w, None, cw)
    chosen, s_rtn, top = weighted_group_errors("W4A16_NVFP4", w, out, cw)
    best = torch.where(valid, errs, torch.inf).amin(0)
    assert torch.all(chosen <= best + resolution("W4A16_NVFP4", w.shape, s_rtn, top))
    assert torch.all(chosen >= best)  # it is one of the candidates, never better than the best of them


def test_int8_choice_is_the_oracle_minimum():
    g = torch.Generator().manual_seed(6)
    w = torch.randn(32, 200, generator=g) ** 3
    cw = torch.exp2(torch.randn(200, generator=g) * 6)
    amax = w.abs().amax(1)
    errs = []
    for m in torch.tensor(ROW_MULTIPLIERS, dtype=torch.float32):
        s = amax * m / 127
        q = torch.round(w / s[:, None]).clamp(-128, 127)
        errs.append(((w.double() - q.double() * s.double()[:, None]) ** 2 * cw.double()).sum(1))
    best = torch.stack(errs).amin(0)
    out = with_scale_search(SCHEMES["INT8"], "mse").quantize(w, None, cw)
    chosen, s_rtn, top = weighted_group_errors("INT8", w, out, cw)
    assert torch.all(chosen >= best) and torch.all(chosen <= best + resolution("INT8", w.shape, s_rtn, top))


@pytest.mark.parametrize("algo", ALGOS + ("NVFP4",))
@pytest.mark.parametrize("value", [1.0, 7.3, 1e-30, 3e8])
def test_equal_weights_are_the_unweighted_search(algo, value):
    """Equal weights choose what the unweighted error chooses among the same candidates (NVFP4: the
    weighted search's wider list; the data-free search scans the first six of it)."""
    w = torch.randn(130, 272, generator=torch.Generator().manual_seed(2)).bfloat16()
    s = with_scale_search(SCHEMES[algo], "mse")
    a, b = s.quantize(w, None, torch.full((272,), value)), s.quantize(w)
    if algo in ("NVFP4", "W4A16_NVFP4"):
        wsf2 = b["weight_scale_2"]
        b = {**b, "weight_scale": nvfp4_block_scales(w, wsf2, None, NVFP4_WEIGHTED_CODE_STEPS)}
        b["weight"] = nvfp4_payload(w, b["weight_scale"], wsf2)
        assert NVFP4_WEIGHTED_CODE_STEPS[:len(NVFP4_CODE_STEPS)] == NVFP4_CODE_STEPS
    for key in b:
        assert_same_bytes(a[key], b[key], f"{algo} {key}")


@pytest.mark.parametrize("algo", ALGOS)
def test_zero_weights_keep_round_to_nearest(algo):
    """No calibration token ever reached these channels: every candidate ties, RTN stays."""
    w = torch.randn(130, 272, generator=torch.Generator().manual_seed(3)).bfloat16()
    a, b = with_scale_search(SCHEMES[algo], "mse").quantize(w, None, torch.zeros(272)), SCHEMES[algo].quantize(w)
    for key in b:
        assert_same_bytes(a[key], b[key], f"{algo} {key}")


@pytest.mark.parametrize("algo", ALGOS)
def test_massive_channel_trades_error_towards_it(algo):
    """One channel weighted 1e4 x the others: the weighted search's weighted error is below the
    unweighted search's, and its error on that channel below as well (it is what the search buys)."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(256, 512, generator=g).bfloat16()
    cw = torch.ones(512)
    hot = torch.arange(0, 512, 37)  # a massive channel in many groups / blocks
    cw[hot] = 1e4
    s = with_scale_search(SCHEMES[algo], "mse")
    weighted, plain = s.quantize(w, None, cw), s.quantize(w)
    e_w = (s.dequantize(weighted) - w.float()).double() ** 2
    e_p = (s.dequantize(plain) - w.float()).double() ** 2
    assert (e_w * cw).sum() < (e_p * cw).sum()
    assert e_w[:, hot].sum() < e_p[:, hot].sum()
    assert e_w.sum() > e_p.sum()  # the plain search is the better one by its own (unweighted) measure


@pytest.mark.parametrize("algo", ("NVFP4", "INT8", "FP8_PER_CHANNEL_PER_TOKEN"))
def test_row_chunks_concatenate(algo):
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(7)).bfloat16()
    cw = torch.exp2(torch.randn(128, generator=torch.Generator().manual_seed(8)) * 4)
    s = with_scale_search(SCHEMES[algo], "mse")
    gamax = w.float().abs().amax()
    full = s.quantize(w, gamax, cw)
    parts = [s.quantize(w[:32], gamax, cw), s.quantize(w[32:], gamax, cw)]
    for key in ("weight", "weight_scale"):
        assert_same_bytes(torch.cat([p[key] for p in parts]), full[key], key)


@pytest.mark.parametrize("cw,rule", [(torch.ones(31), "shape \\[32\\]"), (torch.tensor([-1.0] + [1.0] * 31), "finite and >= 0"),
                                     (torch.tensor([float("nan")] + [1.0] * 31), "finite and >= 0"),
                                     (torch.ones(32, dtype=torch.int32), "float tensor")])
def test_bad_weights_are_refused(cw, rule):
    with pytest.raises(ValueError, match=rule):
        with_scale_search(SCHEMES["W4A16_NVFP4"], "mse").quantize(torch.randn(4, 32), None, cw)
