"""Regenerate the INT4 (W4A16, group 128) golden vectors with the upstream libraries (NOT run by the tests).

Run in the scratch environment (``/work/shared/tools/upstream-env.sh``: nvidia-modelopt 0.47.0,
vllm 0.33.0, compressed-tensors, torch CPU)::

    /root/upstream-venv/bin/python tests/golden/int4/generate.py

Writes ``int4_<case>.safetensors`` (``input.weight`` -> ModelOpt's ``expected.weight`` /
``expected.weight_scale``), ``marlin_int4_<case>.safetensors`` (vLLM's Marlin preparation of the
same codes and scales) and ``../checkpoints/tiny-llama-INT4/`` (ModelOpt's ``export_hf_checkpoint``
of the golden tiny-llama with ``INT4_BLOCKWISE_WEIGHT_ONLY_CFG``). Deterministic: fixed seeds, CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..")
GROUP = 128


def modelopt_export(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """ModelOpt's exporter on a bare nn.Linear holding `w` (what export_hf_checkpoint does per module)."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export.unified_export_hf import _export_quantized_weight

    n, k = w.shape
    lin = torch.nn.Linear(k, n, bias=False, dtype=w.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
    model = torch.nn.Sequential(lin)
    mtq.quantize(model, mtq.INT4_BLOCKWISE_WEIGHT_ONLY_CFG, forward_loop=lambda m: m(torch.randn(2, k, dtype=w.dtype)))
    _export_quantized_weight(model[0], w.dtype)
    sd = model[0].state_dict()
    assert set(sd) == {"weight", "weight_scale", "weight_quantizer._amax"}, sorted(sd)  # no pre_quant_scale without AWQ
    return {"weight": sd["weight"].contiguous(), "weight_scale": sd["weight_scale"].contiguous()}


def crafted(n: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Groups of very different magnitudes, an all-zero group and row, exact rounding ties, -0.0, clamps."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    w *= torch.exp2(torch.randint(-12, 4, (n, k // GROUP), generator=g).float()).repeat_interleave(GROUP, dim=1)
    w[0, :GROUP] = 0.0  # all-zero group -> scale 1.0, codes 0
    w[1] = 0.0  # all-zero row
    # row 2: group maxima 7 * 2^e (scale exactly 2^e) and every code's tie (c + 0.5) * 2^e, both signs
    for b in range(k // GROUP):
        e = 2 * b - 6
        grp = torch.zeros(GROUP)
        ties = torch.arange(-7, 7).float() + 0.5  # -6.5 .. 6.5: round half to even
        grp[: len(ties)] = ties
        grp[len(ties): 2 * len(ties)] = ties + 2.0**-6  # just above each tie
        grp[2 * len(ties): 3 * len(ties)] = ties - 2.0**-6  # just below
        grp[-1], grp[-2] = 7.0, -7.0
        w[2, b * GROUP: (b + 1) * GROUP] = grp * 2.0**e
    w[3, :GROUP] = -0.0
    w[4] *= 2.0**-60  # tiny groups
    w[5, :GROUP] = torch.linspace(-1, 1, GROUP) * 3e-3  # evenly spaced
    return w.to(dtype)


def write_case(out: str, name: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
    exp = modelopt_export(w)
    save_file({"input.weight": w, "expected.weight": exp["weight"], "expected.weight_scale": exp["weight_scale"]},
              os.path.join(out, f"{name}.safetensors"), metadata={"case": name})
    return exp


def codes_of(weight: torch.Tensor) -> torch.Tensor:
    """int4 codes [N, K] of a ModelOpt packed weight [N/2, K] (row 2i low nibble, sign-extended)."""
    p = weight.view(torch.uint8)
    c = torch.stack(((p & 0xF), (p >> 4)), dim=1).reshape(2 * p.shape[0], p.shape[1]).to(torch.int16)
    return torch.where(c > 7, c - 16, c)


def marlin_case(out: str, name: str, exp: dict[str, torch.Tensor], act: torch.dtype) -> None:
    """vLLM 0.33's MarlinLinearKernel.process_weights_after_loading (the kernel CompressedTensorsWNA16
    and gptq_marlin use for uint4b8, group 128) on a stand-in layer holding the ModelOpt codes in
    compressed-tensors' layout; the CUDA op gptq_marlin_repack replaced by vLLM's own reference for
    it (marlin_utils_test.marlin_weights + get_weight_perm), as in the other Marlin goldens."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from vllm.model_executor.kernels.linear import MarlinLinearKernel, MPLinearLayerConfig
    from vllm.model_executor.kernels.linear.mixed_precision import marlin as mk
    from vllm.model_executor.layers.quantization.utils import marlin_utils_test as mt
    from vllm.model_executor import parameter as vp
    from vllm.model_executor.parameter import GroupQuantScaleParameter, PackedvLLMParameter
    from vllm.scalar_type import scalar_types

    vp.get_tensor_model_parallel_rank = lambda: 0  # one rank; no process group on the CPU
    vp.get_tensor_model_parallel_world_size = lambda: 1

    q = codes_of(exp["weight"])
    n, k = q.shape
    scale = exp["weight_scale"]

    def repack(b_q_weight, size_k, size_n, num_bits, is_a_8bit=False):
        # the op's input is the GPTQ packing [K/8, N] int32: 8 codes along K per int, LSB first
        u = b_q_weight.contiguous()
        codes = torch.stack([(u >> (4 * i)) & 0xF for i in range(8)], dim=1).reshape(size_k, size_n)
        return mt.marlin_weights(codes.to(torch.int32), size_k, size_n, num_bits, mt.get_weight_perm(num_bits, is_a_8bit), is_a_8bit)

    def loader(*args, **kwargs):
        raise AssertionError("not loading")

    layer = torch.nn.Module()
    layer.weight_packed = PackedvLLMParameter(input_dim=1, output_dim=0, packed_dim=1, packed_factor=8, weight_loader=loader,
                                              data=pack_to_int32(q.to(torch.int8), 4))
    layer.weight_scale = GroupQuantScaleParameter(output_dim=0, input_dim=1, weight_loader=loader, data=scale.to(act))
    cfg = MPLinearLayerConfig(full_weight_shape=(k, n), partition_weight_shape=(k, n), weight_type=scalar_types.uint4b8,
                              act_type=act, group_size=GROUP, zero_points=False)
    kernel = MarlinLinearKernel(cfg, w_q_param_name="weight_packed", w_s_param_name="weight_scale", w_zp_param_name=None)
    orig = mk.ops.gptq_marlin_repack
    mk.ops.gptq_marlin_repack = repack
    try:
        kernel.process_weights_after_loading(layer)
    finally:
        mk.ops.gptq_marlin_repack = orig
    tensors = {"input.weight": exp["weight"], "input.weight_scale": scale,
               "expected.marlin_qweight": layer.weight_packed.data.contiguous(),
               "expected.marlin_scales": layer.weight_scale.data.contiguous()}
    save_file(tensors, os.path.join(out, f"{name}.safetensors"), metadata={"case": name, "act_dtype": str(act)})


def tiny_llama_export(out: str) -> None:
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoModelForCausalLM

    src = os.path.join(GOLDEN, "checkpoints", "tiny-llama")
    model = AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.bfloat16)
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    mtq.quantize(model, mtq.INT4_BLOCKWISE_WEIGHT_ONLY_CFG, forward_loop=lambda m: m(ids))
    dst = os.path.join(out, "tiny-llama-INT4")
    shutil.rmtree(dst, ignore_errors=True)
    export_hf_checkpoint(model, export_dir=dst)


def main(out: str) -> None:
    torch.manual_seed(0)
    os.makedirs(out, exist_ok=True)
    e1 = write_case(out, "int4_256x384", crafted(256, 384, torch.bfloat16, 1))
    write_case(out, "int4_fp16_128x256", crafted(128, 256, torch.float16, 2))
    write_case(out, "int4_fp32_64x128", crafted(64, 128, torch.float32, 3))
    e2 = write_case(out, "int4_200x256", crafted(200, 256, torch.bfloat16, 4))
    marlin_case(out, "marlin_int4_256x384", e1, torch.bfloat16)
    marlin_case(out, "marlin_int4_fp16_256x384", e1, torch.float16)
    marlin_case(out, "marlin_int4_200x256", e2, torch.bfloat16)  # padded by marlin_padded_nk
    tiny_llama_export(os.path.join(GOLDEN, "checkpoints") if out == HERE else out)
    print(json.dumps(sorted(os.listdir(out))))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else HERE)
