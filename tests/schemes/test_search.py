"""Searched scales (--scale-search mse): the reference's contract.

* ``none`` is the plain scheme itself: ModelOpt's golden bytes, unchanged.
* Property (hypothesis): for every group (INT8 / FP8 row, FP8 128x128 block, NVFP4 16-group),
  the searched squared error, computed exactly in fp64, is never above round-to-nearest's by more
  than the documented comparison resolution (one unit of 2^-SHIFT RTN-scale^2 per element).
* Candidate 0 is RTN: where RTN is exact, the search writes RTN's bytes.
* Gaussian weights: the total error goes down for every scheme.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quantize_cli.errors import UsageError
from quantize_cli.schemes import SCHEMES
from quantize_cli.schemes.numerics import unpack_nibbles, e2m1_values
from quantize_cli.schemes.search import NVFP4_SHIFT, ROW_SHIFT
from quantize_cli.schemes.searched import Searched, with_scale_search
from tests.conftest import assert_same_bytes, golden_case

ALGOS = ("INT8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "W4A16_NVFP4")


def exact_group_errors(algo: str, w: torch.Tensor, out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp64 squared error per group, fp64 scale per group) of `out`, dequantized exactly in fp64."""
    x = w.double()
    n, k = w.shape
    if algo == "W4A16_NVFP4":
        vals = e2m1_values(unpack_nibbles(out["weight"])).double().reshape(n, k // 16, 16)
        s = out["weight_scale"].double() * out["weight_scale_2"].double()  # [N, K/16], exact
        err = ((x.reshape(n, k // 16, 16) - vals * s[..., None]) ** 2).sum(-1)
        return err.reshape(-1), s.reshape(-1)
    if algo == "FP8_PB_WO":
        s = out["weight_scale"][:, 0, :, 0].double()  # [nb, kb]
        d = (x - out["weight"].double() * s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]) ** 2
        nb, kb = s.shape
        d = torch.nn.functional.pad(d, (0, kb * 128 - k, 0, nb * 128 - n))
        return d.reshape(nb, 128, kb, 128).sum(dim=(1, 3)).reshape(-1), s.reshape(-1)
    s = out["weight_scale"].double()
    return ((x - out["weight"].double() * s[:, None]) ** 2).sum(-1), s


def group_len(algo: str, shape) -> int:
    return {"W4A16_NVFP4": 16, "FP8_PB_WO": 128 * 128}.get(algo, shape[1])


@pytest.mark.parametrize("case,algo", [("int8_per_channel_256x384", "INT8"), ("fp8_per_channel_256x384", "FP8_PER_CHANNEL_PER_TOKEN"),
                                       ("fp8_block128_200x96", "FP8_PB_WO"), ("nvfp4_256x384", "NVFP4")])
def test_none_is_the_plain_scheme_and_golden(case, algo):
    scheme = with_scale_search(SCHEMES[algo], "none")
    assert scheme is SCHEMES[algo]
    g = golden_case(case)
    out = scheme.quantize(g["input.weight"])
    for key in ("weight", "weight_scale"):
        assert_same_bytes(out[key], g[f"expected.{key}"], key)


@st.composite
def weights(draw):
    """Small weights with awkward content: mixed magnitudes per row, outliers, exact zeros, ties."""
    n = draw(st.integers(1, 6))
    k = 16 * draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    kind = draw(st.sampled_from(["normal", "heavy", "uniform", "grid", "sparse"]))
    if kind == "normal":
        w = torch.randn(n, k, generator=g)
    elif kind == "heavy":
        w = torch.randn(n, k, generator=g) ** 3
    elif kind == "uniform":
        w = torch.rand(n, k, generator=g) * 2 - 1
    elif kind == "grid":  # values on a coarse grid: many exact ties between candidates
        w = torch.randint(-6, 7, (n, k), generator=g).float() / 2
    else:
        w = torch.randn(n, k, generator=g) * (torch.rand(n, k, generator=g) < 0.1)
    w = w * torch.exp2(torch.randint(-20, 10, (n, 1), generator=g).float())
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
    return w.to(dtype) if dtype != torch.float16 else w.clamp(-6e4, 6e4).to(dtype)


@pytest.mark.parametrize("algo", ALGOS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=weights())
def test_searched_error_never_above_round_to_nearest(algo, w):
    base = SCHEMES[algo]
    searched = with_scale_search(base, "mse")
    err_s, _ = exact_group_errors(algo, w, searched.quantize(w))
    err_r, s_rtn = exact_group_errors(algo, w, base.quantize(w))
    shift = NVFP4_SHIFT if algo == "W4A16_NVFP4" else ROW_SHIFT
    resolution = group_len(algo, w.shape) * s_rtn**2 * 2.0**-shift
    assert torch.all(err_s <= err_r + resolution), f"{algo}: searched error above RTN in {int((err_s > err_r + resolution).sum())} group(s)"


@pytest.mark.parametrize("algo", ALGOS)
def test_exact_round_to_nearest_is_kept(algo):
    """Rows of ±amax and zeros: RTN has zero error, every tie goes to RTN: the same bytes."""
    g = torch.Generator().manual_seed(0)
    w = torch.sign(torch.randn(128, 256, generator=g)) * torch.exp2(torch.randint(-4, 4, (128, 1), generator=g).float())
    w[:, ::3] = 0.0
    a, b = with_scale_search(SCHEMES[algo], "mse").quantize(w), SCHEMES[algo].quantize(w)
    for key in a:
        assert_same_bytes(a[key], b[key], f"{algo} {key}")


@pytest.mark.parametrize("algo", ALGOS + ("NVFP4",))
def test_gaussian_error_goes_down(algo):
    """On Gaussian weights (like real ones) the search lowers the total error, and some scales move."""
    w = torch.randn(256, 512, generator=torch.Generator().manual_seed(1)).bfloat16()
    base, searched = SCHEMES[algo], with_scale_search(SCHEMES[algo], "mse")
    a, b = searched.quantize(w), base.quantize(w)
    e_s = (searched.dequantize(a) - w.float()).double().square().sum()
    e_r = (base.dequantize(b) - w.float()).double().square().sum()
    assert e_s < e_r, f"{algo}: {e_s:.4g} vs RTN {e_r:.4g}"
    assert list(a) == list(b) and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape for k in a)
    assert not torch.equal(a["weight_scale"].float(), b["weight_scale"].float())


def test_nvfp4_keeps_the_global_scale_and_chunks_concatenate():
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(2)).bfloat16()
    gamax = w.float().abs().amax() * 2  # a fused group's larger amax
    s = with_scale_search(SCHEMES["NVFP4"], "mse")
    full = s.quantize(w, gamax)
    assert_same_bytes(full["weight_scale_2"], SCHEMES["NVFP4"].quantize(w, gamax)["weight_scale_2"])
    parts = [s.quantize(w[:32], gamax), s.quantize(w[32:], gamax)]
    for key in ("weight", "weight_scale"):
        assert_same_bytes(torch.cat([p[key] for p in parts]), full[key], key)


def test_usage_errors_and_identity():
    s = with_scale_search(SCHEMES["W4A16_NVFP4"], "MSE")
    assert isinstance(s, Searched) and s.algo == "W4A16_NVFP4" and s.quant_algo == "W4A16_NVFP4" and s.group_size == 16
    assert s.outputs((4, 32)) == SCHEMES["W4A16_NVFP4"].outputs((4, 32))
    assert s.shape_problem((4, 24)) == SCHEMES["W4A16_NVFP4"].shape_problem((4, 24))
    with pytest.raises(UsageError, match="--scale-search mse --algo FP8: this format.s scales are not searched"):
        with_scale_search(SCHEMES["FP8"], "mse")
    with pytest.raises(UsageError, match="choose none or mse"):
        with_scale_search(SCHEMES["INT8"], "gptq")
