"""--scale-search mse --algo INT4 / INT4_ASYM end to end (ModelOpt W4A16_AWQ, compressed-tensors
W4A16 / W4A16_ASYM): the same files, tensors, dtypes and shapes as round to nearest with searched
group scales (the reference's, weighted by the calibration's E[x_j^2] when given); under
--rounding gptq the fixed scales are the searched ones; verify accepts every output."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from quantize_cli.cli import main
from quantize_cli.schemes import SCHEMES
from quantize_cli.formats.compressed_tensors import CT_SCHEMES
from quantize_cli.schemes.searched import with_scale_search
from tests.calibration.test_gptq_convert import calib_jsonl, convert
from tests.conftest import load_all

OUTPUTS = [("INT4", "modelopt"), ("INT4", "compressed-tensors"), ("INT4_ASYM", "compressed-tensors")]


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A 1-layer Llama whose Linears have K = 128 or 256 (whole INT4 groups), saved in fp32
    (compressed-tensors' scales take the source dtype), and its calibration .jsonl."""
    from tests.calibration import builders

    folder = tmp_path_factory.mktemp("int4-mse")
    model = builders.wide_llama(1, seed=2)
    src = str(folder / "src")
    model.save_pretrained(src, max_shard_size="200KB")
    builders.tokenizer(src)
    return src, calib_jsonl(folder / "calib.jsonl")


def scheme(algo, fmt):
    return with_scale_search(SCHEMES[algo] if fmt == "modelopt" else CT_SCHEMES[algo], "mse")


def specs(tensors: dict) -> dict:
    return {k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()}


def scales(tensors: dict) -> list[str]:
    return sorted(k for k in tensors if k.endswith(".weight_scale"))


@pytest.mark.parametrize("algo,fmt", OUTPUTS)
def test_searched_scales_same_format_verify_accepts(wide, tmp_path, algo, fmt):
    src, data = wide
    rtn = load_all(convert(src, tmp_path / "rtn", algo=algo, format=fmt).dst)
    free = load_all(convert(src, tmp_path / "free", algo=algo, format=fmt, scale_search="mse").dst)
    weighted = load_all(convert(src, tmp_path / "w", algo=algo, format=fmt, scale_search="mse", calib_data=data, verify=True).dst)
    assert specs(free) == specs(rtn) == specs(weighted)
    assert json.load(open(tmp_path / "w" / "config.json"))["quantization_config"] == \
        json.load(open(tmp_path / "rtn" / "config.json"))["quantization_config"]
    names = scales(rtn)
    assert len(names) == 7 and rtn[names[0]].dtype == (torch.float32)
    assert all(not torch.equal(free[n], rtn[n]) for n in names)
    assert any(not torch.equal(weighted[n], free[n]) for n in names), "the calibration must weight the search"
    source = load_all(src)
    for n in names:  # the data-free output is the reference's bytes
        ref = scheme(algo, fmt).quantize(source[n[: -len("_scale")]])
        assert torch.equal(free[n], ref["weight_scale"]), n
    r = CliRunner().invoke(main, ["verify", str(tmp_path / "w"), "--source", src])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("algo,fmt", OUTPUTS)
def test_gptq_rounds_on_the_searched_scales(wide, tmp_path, algo, fmt):
    """--rounding gptq --scale-search mse: the fixed scales are the search's weighted by diag(H), not
    round to nearest's; the tensors are RTN's; deterministic; verify accepts it."""
    src, data = wide
    g = load_all(convert(src, tmp_path / "g", algo=algo, format=fmt, calib_data=data, rounding="gptq").dst)
    gm = load_all(convert(src, tmp_path / "gm", algo=algo, format=fmt, calib_data=data, rounding="gptq", scale_search="mse",
                          verify=True).dst)
    assert specs(gm) == specs(g)
    names = scales(g)
    assert all(not torch.equal(gm[n], g[n]) for n in names), "mse must choose other scales than round to nearest"
    again = load_all(convert(src, tmp_path / "gm2", algo=algo, format=fmt, calib_data=data, rounding="gptq", scale_search="mse").dst)
    assert all(torch.equal(gm[k], again[k]) for k in gm)
    r = CliRunner().invoke(main, ["verify", str(tmp_path / "gm"), "--source", src])
    assert r.exit_code == 0, r.output


def test_other_compressed_tensors_algorithms_still_refused(wide, tmp_path):
    src, _ = wide
    r = CliRunner().invoke(main, ["convert", src, "-o", str(tmp_path / "o"), "--algo", "INT8", "--format",
                                  "compressed-tensors", "--scale-search", "mse"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "--scale-search mse --format compressed-tensors" in r.output and "INT4 and INT4_ASYM" in r.output
    assert not (tmp_path / "o").exists()
