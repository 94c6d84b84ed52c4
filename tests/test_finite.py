"""NaN/Inf detection (finite.py, numerics.abs_max): the fast reductions find every NaN/Inf the
full-size checks find, in every dtype a checkpoint holds, and give the same amax bits."""

from __future__ import annotations

import pytest
import torch

from quantize_cli.schemes.numerics import all_finite
from quantize_cli.schemes.numerics import abs_max

FLOATS = [torch.bfloat16, torch.float16, torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_all_finite_finds_each_bad_value_anywhere(dtype, bad):
    torch.manual_seed(0)
    for pos in (0, 1, 257, 64 * 33 - 1):
        x = torch.randn(64, 33).to(dtype)
        assert all_finite(x)
        x.view(-1)[pos] = bad
        assert not all_finite(x), (dtype, bad, pos)
        assert not all_finite(x[pos // 33 : pos // 33 + 1])  # a row slice too


def test_all_finite_other_dtypes_and_shapes():
    assert all_finite(torch.tensor(1.0)) and not all_finite(torch.tensor(float("nan")))  # 0-d
    assert all_finite(torch.empty(0, 8))
    assert all_finite(torch.randint(-128, 127, (8, 8), dtype=torch.int8))  # integers cannot be NaN
    e4m3 = torch.randn(8, 8).to(torch.float8_e4m3fn)
    assert all_finite(e4m3)
    e4m3.view(torch.uint8)[0, 0] = 0x7F  # e4m3's NaN
    assert not all_finite(e4m3)


@pytest.mark.parametrize("dtype", FLOATS)
def test_abs_max_equals_abs_amax_bit_for_bit(dtype):
    torch.manual_seed(1)
    x = torch.randn(6, 40, 3, 16).to(dtype)
    x[0, 0, 0, 0] = -0.0
    x[1] = -x[1].abs()  # a block whose max |x| is its minimum
    for dim in (None, (1, 3), (3,)):
        want = x.abs().amax() if dim is None else x.abs().amax(dim=dim)
        got = abs_max(x, dim)
        assert got.dtype == want.dtype and torch.equal(got, want) and not torch.signbit(got).any()
    x[3] = 0.0  # all +0.0: max(-(+0.0), +0.0) alone would give -0.0
    x[4] = -0.0
    for dim in (None, (1, 3), (3,)):
        want = x.abs().amax() if dim is None else x.abs().amax(dim=dim)
        assert torch.equal(abs_max(x, dim), want) and not torch.signbit(abs_max(x, dim)).any()
    x[2, 5, 1, 7] = float("nan")
    assert torch.isnan(abs_max(x)) and torch.isnan(abs_max(x, (1, 3))[2, 1])


@pytest.mark.parametrize("devices", ["cpu", "cpu,cpu"])
@pytest.mark.parametrize("where", ["first", "last"])
def test_a_nan_in_the_first_or_last_quantized_task_is_refused(make_checkpoint, tmp_path, devices, where):
    """The NaN/Inf check runs one task behind (run/compute.py: the host never waits for the device
    between tasks): a NaN in the first or in the very last quantized task is still refused, by the
    local executor and by the per-shard streams of --device a,b, and nothing is published."""
    import os

    from quantize_cli import api
    from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors
    from quantize_cli.errors import NumericsError
    from quantize_cli.plan.options import ConvertOptions
    from quantize_cli.plan.steps import prepare

    cfg = llama_config()
    t = llama_tensors(cfg)
    t = {**{k: t.pop(k) for k in ("model.norm.weight", "lm_head.weight")}, **t}  # the copies first: the last task quantizes
    src = make_checkpoint(t, cfg, shards=2)
    tasks = prepare(src, "FP8_PB_WO").tasks  # no shared amax: its Share step would check at once
    assert tasks[-1].kind == "quantize"  # its check is finish()'s
    quantized = [task for task in tasks if task.kind == "quantize"]
    member = (quantized[0] if where == "first" else quantized[-1]).members[-1].source.name
    t[member][1, 2] = float("nan")
    src = make_checkpoint(t, cfg, shards=2, name="bad")
    with pytest.raises(NumericsError, match=member.replace(".", r"\.")):
        api.convert(ConvertOptions(src, str(tmp_path / "out"), algo="FP8_PB_WO", device=devices, quiet=True))
    assert not os.path.exists(tmp_path / "out")
