"""--kernels auto|triton|torch: the same bytes whichever runs; clear usage errors where one cannot."""

import json

import pytest
import torch

from tests.conftest import convert
from quantize_cli.errors import UsageError
from quantize_cli.run.kernel_choice import check_kernels
from tests.conftest import output_files


@pytest.mark.parametrize("algo", ["FP8_PB_WO", "NVFP4", "INT8"])
def test_torch_and_auto_give_identical_bytes(tmp_path, algo):
    for kernels in ("auto", "torch"):
        convert("example:tiny-llama", str(tmp_path / kernels), algo=algo, device="cpu", kernels=kernels, quiet=True,
                report=str(tmp_path / f"{kernels}.json"))
        assert json.load(open(tmp_path / f"{kernels}.json"))["options"]["kernels"] == kernels  # recorded in the report
    assert output_files(tmp_path / "auto") == output_files(tmp_path / "torch")


def test_triton_on_the_cpu_without_the_interpreter_is_a_usage_error(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from quantize_cli.cli import main

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(UsageError, match="TRITON_INTERPRET=1"):
        convert("example:tiny-llama", str(tmp_path / "o"), algo="NVFP4", device="cpu", kernels="triton", quiet=True)
    r = CliRunner().invoke(main, ["convert", "example:tiny-llama", "-o", str(tmp_path / "o"), "--algo", "NVFP4",
                                  "--device", "cpu", "--kernels", "triton"])
    assert r.exit_code == 2 and "--kernels triton on cpu" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def test_kernel_choices_are_checked():
    with pytest.raises(UsageError, match="choose auto, triton or torch"):
        check_kernels("cuda", torch.device("cpu"))
    with pytest.raises(UsageError, match="compressed-tensors"):
        check_kernels("triton", torch.device("cuda"), ct_format=True)
    assert check_kernels("TORCH", torch.device("cpu")) == "torch"
    assert check_kernels(None, torch.device("cpu")) == "auto"
    assert check_kernels("triton", "auto") == "triton"  # Ray tasks on any device: each checks its own


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("example,algo,layout", [
    ("tiny-llama", "FP8", "plain"), ("tiny-llama", "FP8_PB_WO", "plain"), ("tiny-llama", "NVFP4", "plain"),
    ("tiny-llama", "INT8", "plain"), ("tiny-llama", "MXFP8", "plain"), ("tiny-qwen3-moe", "NVFP4", "flashinfer"),
    ("tiny-llama", "NVFP4", "marlin"),
])
def test_triton_equals_torch_on_the_gpu(tmp_path, example, algo, layout):
    for kernels in ("triton", "torch"):
        convert(f"example:{example}", str(tmp_path / kernels), algo=algo, layout=layout, device="cuda", kernels=kernels,
                quiet=True)
    assert output_files(tmp_path / "triton") == output_files(tmp_path / "torch")
