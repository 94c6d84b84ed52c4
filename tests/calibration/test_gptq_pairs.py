"""--rounding gptq / --smooth with the features they meet: INT4 in both formats, --resume (the run
identity), mixed precision (--algo-for), --scale-search mse (scales weighted by the Hessian's
diagonal), the refusal without data on the command line."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from quantize_cli.cli import main
from quantize_cli.errors import DestinationError
from tests.calibration import builders
from tests.calibration.test_gptq_convert import _convert, calib_jsonl, convert, outlier_llama_and_data, tensors
from tests.conftest import load_all
from tests.test_resume import interrupt_after


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A 2-layer Llama whose Linears have K = 128 or 256: whole INT4 groups of 128."""
    folder = tmp_path_factory.mktemp("gptq-wide")
    return builders.save(builders.wide_llama(2, seed=1), str(folder / "src")), calib_jsonl(folder / "calib.jsonl")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return outlier_llama_and_data(tmp_path_factory.mktemp("gptq-pairs"))


def _payloads(folder) -> dict:
    return {k: v for k, v in load_all(folder).items() if k.endswith((".weight", ".weight_packed")) and v.dtype in (torch.uint8, torch.int32)}


@pytest.mark.parametrize("algo,fmt", [("INT4", "modelopt"), ("INT4", "compressed-tensors"), ("INT4_ASYM", "compressed-tensors")])
def test_int4_gptq_keeps_the_format_and_its_scales(wide, tmp_path, algo, fmt):
    src, data = wide
    rtn = load_all(convert(src, tmp_path / "rtn", algo=algo, format=fmt).dst)
    _convert(src, tmp_path / "gptq", algo, data, rounding="gptq", format=fmt, verify=True)
    out = load_all(tmp_path / "gptq")
    assert {k: (v.dtype, v.shape) for k, v in out.items()} == {k: (v.dtype, v.shape) for k, v in rtn.items()}
    for name, t in rtn.items():
        if name.endswith(("weight_scale", "weight_zero_point", "weight_shape")):
            assert torch.equal(out[name], t), f"{name}: GPTQ keeps the scheme's scales and zero points"
    changed = [n for n, t in _payloads(tmp_path / "rtn").items() if not torch.equal(out[n], t)]
    assert len(changed) == 14, changed  # every quantized Linear of the 2 layers
    if fmt == "modelopt":
        conv = json.load(open(tmp_path / "gptq" / "hf_quant_config.json"))["converter"]["weights"]
        assert 0 < conv["gptq_output_error_vs_rtn"] < 1


def test_resume_with_another_rounding_is_refused(llama, tmp_path, monkeypatch):
    """--rounding is part of the run identity: an interrupted GPTQ run is not finished by round to nearest."""
    src, data = llama
    interrupt_after(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        _convert(src, tmp_path / "out", "W4A16_NVFP4", data, rounding="gptq")
    monkeypatch.undo()
    with pytest.raises(DestinationError, match="used --rounding gptq, this run asks for nearest"):
        _convert(src, tmp_path / "out", "W4A16_NVFP4", data, resume=True)
    with pytest.raises(DestinationError, match="used --smooth none, this run asks for awq"):
        _convert(src, tmp_path / "out", "W4A16_NVFP4", data, rounding="gptq", smooth="awq", resume=True)
    _convert(src, tmp_path / "out", "W4A16_NVFP4", data, rounding="gptq", resume=True)  # the same options finish it
    _convert(src, tmp_path / "ref", "W4A16_NVFP4", data, rounding="gptq")
    assert tensors(tmp_path / "out") == tensors(tmp_path / "ref")


def test_mixed_precision_each_module_on_its_own_grid(llama, tmp_path):
    """--algo-for: GPTQ rounds each Linear to the grid of the algorithm its rule gives it."""
    src, data = llama
    rule = ("*mlp.down_proj=FP8_PER_CHANNEL_PER_TOKEN",)
    rtn = load_all(convert(src, tmp_path / "rtn", algo="W4A16_NVFP4", algo_for=rule).dst)
    _convert(src, tmp_path / "mix", "W4A16_NVFP4", data, rounding="gptq", algo_for=rule, verify=True)
    out = load_all(tmp_path / "mix")
    assert {k: (v.dtype, v.shape) for k, v in out.items()} == {k: (v.dtype, v.shape) for k, v in rtn.items()}
    down = [n for n in rtn if n.endswith("down_proj.weight")]
    assert down and all(out[n].dtype == torch.float8_e4m3fn for n in down)
    assert all(not torch.equal(out[n].view(torch.uint8), rtn[n].view(torch.uint8)) for n in down)  # FP8 rows, rounded by GPTQ
    for name, t in rtn.items():
        if name.endswith(("weight_scale", "weight_scale_2")):
            assert torch.equal(out[name], t), name


def test_scale_search_weighted_by_the_hessian_diagonal(llama, tmp_path):
    """--scale-search mse under GPTQ: the scales are the activation-weighted search's on the inputs GPTQ
    sees (weighted by diag(H) = E[x_j^2]), not the data-free search's, and differ from round to nearest."""
    src, data = llama
    _convert(src, tmp_path / "gm", "W4A16_NVFP4", data, rounding="gptq", scale_search="mse", verify=True)
    _convert(src, tmp_path / "g", "W4A16_NVFP4", data, rounding="gptq")
    free = load_all(convert(src, tmp_path / "free", algo="W4A16_NVFP4", scale_search="mse").dst)
    gm, g = load_all(tmp_path / "gm"), load_all(tmp_path / "g")
    scales = [n for n in g if n.endswith(".weight_scale")]
    assert any(not torch.equal(gm[n], g[n]) for n in scales), "mse must choose other scales than round to nearest"
    assert any(not torch.equal(gm[n], free[n]) for n in scales), "the search must be weighted by the calibration inputs"
    _convert(src, tmp_path / "gm2", "W4A16_NVFP4", data, rounding="gptq", scale_search="mse")
    assert tensors(tmp_path / "gm") == tensors(tmp_path / "gm2")


def test_cli_refuses_without_data_in_one_line(llama, tmp_path):
    src, _ = llama
    for flags in (["--rounding", "gptq"], ["--smooth", "awq"]):
        r = CliRunner().invoke(main, ["convert", src, "-o", str(tmp_path / "x"), "--algo", "INT4", *flags])
        assert r.exit_code == 2, r.output
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and flags[0] in lines[0] and "--calib-data" in lines[0], r.output
    r = CliRunner().invoke(main, ["convert", src, "-o", str(tmp_path / "x"), "--algo", "INT4", "--rounding", "best"])
    assert r.exit_code == 2 and "--rounding" in r.output
    assert not (tmp_path / "x").exists()


def test_llm_compressor_static_actorder_reads_as_its_preset():
    """llm-compressor's GPTQ records actorder "static" (no g_idx): still the preset, so verify and eval
    read its outputs; "group" / "weight" orders (a g_idx tensor) are not a preset."""
    from quantize_cli.formats.ct_config import PRESETS, config_group
    from quantize_cli.formats.ct_verify import group_preset

    for preset in ("NVFP4A16", "W4A16", "NVFP4"):
        group = config_group(preset, ["Linear"])
        q = {"format": PRESETS[preset][0]}
        assert group_preset({**group, "weights": {**group["weights"], "actorder": "static"}}, q) == preset
        assert group_preset({**group, "weights": {**group["weights"], "actorder": "group"}}, q) is None
