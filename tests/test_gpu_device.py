"""On the GPU machine (-m gpu): the whole conversion gives the same bytes on CUDA and on the CPU."""

import os

import pytest

from tests.conftest import output_files
import torch

from tests.conftest import convert
from quantize_cli.schemes import SCHEMES

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def files(folder):
    return output_files(folder)


@pytest.mark.parametrize("algo", list(SCHEMES))
def test_torch_reference_on_cuda_equals_cpu(algo):
    """The references avoid torch's reciprocal-multiply division on CUDA (numerics.div_exact)."""
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(512, 768, generator=g) * torch.logspace(-3, 1, 768)).to(torch.bfloat16)
    cpu = SCHEMES[algo].quantize(w)
    gpu = SCHEMES[algo].quantize(w.cuda())
    for k, v in cpu.items():
        assert torch.equal(v.reshape(-1).view(torch.uint8), gpu[k].cpu().reshape(-1).view(torch.uint8)), k


@pytest.mark.parametrize("example,algo,layout", [
    ("tiny-llama", "FP8", "plain"), ("tiny-llama", "FP8_PER_CHANNEL_PER_TOKEN", "plain"), ("tiny-llama", "FP8_PB_WO", "plain"),
    ("tiny-llama", "NVFP4", "plain"), ("tiny-llama", "W4A16_NVFP4", "plain"), ("tiny-llama", "INT8", "plain"),
    ("tiny-deepseek", "NVFP4", "plain"), ("tiny-qwen3-moe-fused", "FP8", "plain"),
    ("tiny-llama", "NVFP4", "marlin"), ("tiny-llama", "FP8_PB_WO", "marlin"), ("tiny-llama", "NVFP4", "cutlass"),
    ("tiny-qwen3-moe", "NVFP4", "flashinfer"),
    ("tiny-llama", "MXFP8", "plain"), ("tiny-qwen3-moe-fused", "MXFP8", "plain"), ("tiny-llama", "MXFP8", "marlin"),
    ("tiny-qwen3-moe", "MXFP8", "marlin"),
    ("tiny-llama", "INT4", "plain"), ("tiny-qwen3-moe-fused", "INT4", "plain"), ("tiny-llama", "INT4", "marlin"),
])
def test_conversion_on_cuda_equals_cpu(tmp_path, example, algo, layout):
    convert(f"example:{example}", str(tmp_path / "cpu"), algo=algo, layout=layout, device="cpu", quiet=True)
    convert(f"example:{example}", str(tmp_path / "gpu"), algo=algo, layout=layout, device="cuda", quiet=True)
    assert files(tmp_path / "cpu") == files(tmp_path / "gpu")


@pytest.mark.parametrize("example,algo", [("tiny-llama", "INT4"), ("tiny-llama", "INT4_ASYM"), ("tiny-qwen3-moe", "INT4_ASYM")])
def test_compressed_tensors_int4_on_cuda_equals_cpu(tmp_path, example, algo):
    """pack-quantized INT4 on the GPU (the torch reference in the weight dtype) gives llm-compressor's CPU bytes."""
    for dev in ("cpu", "cuda"):
        convert(f"example:{example}", str(tmp_path / dev), algo=algo, format="compressed-tensors", device=dev, quiet=True)
    assert files(tmp_path / "cpu") == files(tmp_path / "cuda")


@pytest.mark.parametrize("example,algo,rule", [
    ("tiny-llama", "NVFP4", "self_attn*=FP8_PB_WO"), ("tiny-qwen3-moe", "FP8_PB_WO", "*experts*=NVFP4"),
    ("tiny-llama", "MXFP8", "mlp*=NVFP4"),
])
def test_mixed_precision_on_cuda_equals_cpu(tmp_path, example, algo, rule):
    for dev in ("cpu", "cuda"):
        convert(f"example:{example}", str(tmp_path / dev), algo=algo, algo_for=[rule], device=dev, quiet=True)
    assert files(tmp_path / "cpu") == files(tmp_path / "cuda")
