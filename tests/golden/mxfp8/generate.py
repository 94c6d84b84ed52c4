"""Regenerate the MXFP8 golden vectors with the upstream libraries (NOT run by the tests).

Run in the scratch environment (``/work/shared/tools/upstream-env.sh``: nvidia-modelopt 0.47.0,
vllm 0.33.0, torch CPU)::

    /root/upstream-venv/bin/python tests/golden/mxfp8/generate.py tests/golden/mxfp8

Writes ``mxfp8_<case>.safetensors`` (``input.weight`` -> ModelOpt's ``expected.weight`` /
``expected.weight_scale``), ``marlin_mxfp8_<case>.safetensors`` (vLLM's Marlin preparation of a
ModelOpt export) and ``tiny-llama-MXFP8/`` (ModelOpt's ``export_hf_checkpoint`` of the golden
tiny-llama). Deterministic: fixed seeds, CPU.
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


def modelopt_export(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """ModelOpt's exporter on a bare nn.Linear holding `w` (what export_hf_checkpoint does per module)."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export.unified_export_hf import _export_quantized_weight

    n, k = w.shape
    lin = torch.nn.Linear(k, n, bias=False, dtype=w.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
    model = torch.nn.Sequential(lin)
    mtq.quantize(model, mtq.MXFP8_DEFAULT_CFG, forward_loop=lambda m: m(torch.randn(2, k, dtype=w.dtype)))
    _export_quantized_weight(model[0], w.dtype)
    sd = model[0].state_dict()
    return {"weight": sd["weight"].contiguous(), "weight_scale": sd["weight_scale"].contiguous()}


def crafted(n: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Blocks of very different magnitudes, an all-zero block and row, power-of-two maxima, e4m3 ties."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    w *= torch.exp2(torch.randint(-12, 4, (n, k // 32), generator=g).float()).repeat_interleave(32, dim=1)
    w[0, :32] = 0.0  # all-zero block -> scale byte 0
    w[1] = 0.0  # all-zero row
    # row 2: block maxima exactly 448 * 2^e (d a power of two) and e4m3 rounding ties below them
    for b in range(k // 32):
        e = b - 8
        blk = torch.linspace(-1, 1, 32) * 400 * 2.0**e
        blk[0] = 448 * 2.0**e
        blk[1] = 9.5 * 2.0**e  # halfway between e4m3 9 and 10 after scaling: ties to even
        blk[2] = 2.0 ** (e - 9) * 1.5  # e4m3 sub-normal tie
        w[2, b * 32 : (b + 1) * 32] = blk
    w[3, :32] = -0.0
    w[4, :] *= 2.0**-100  # tiny blocks: very negative exponents
    return w.to(dtype)


def near_pow2_fp32(n: int = 64, k: int = 64) -> torch.Tensor:
    """fp32 blocks whose amax / 448 lies m ulps above a power of two (m = 0..31): the ceil(log2)
    rounding quirk; rows at many exponents, some sub-normal."""
    g = torch.Generator().manual_seed(7)
    w = torch.rand(n, k, generator=g) * 0.9
    for r in range(n):
        e = [-120, -64, -33, -20, -15, -9, -5, -3, -1, 0, 2, 5, 9, 17, 40, -127][r % 16]
        for b in range(k // 32):
            m = (r // 16) * 8 + b * 4 + (r % 4)
            bits = torch.tensor(((min(max(e, -126), 127) + 127) << 23) + m, dtype=torch.int32)
            d = bits.view(torch.float32)
            amax = (d.double() * 448).float()  # the division back may round: what ModelOpt sees is recorded
            w[r, b * 32 : (b + 1) * 32] *= amax
            w[r, b * 32] = amax
    w[-1] *= 2.0**-20  # sub-normal d
    return w


def write_case(out: str, name: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
    exp = modelopt_export(w)
    save_file({"input.weight": w, "expected.weight": exp["weight"], "expected.weight_scale": exp["weight_scale"]},
              os.path.join(out, f"{name}.safetensors"), metadata={"case": name})
    return exp


def marlin_case(out: str, name: str, exp: dict[str, torch.Tensor], act: torch.dtype) -> None:
    """vLLM 0.33's prepare_mxfp8_layer_for_marlin on a stand-in layer; the CUDA repack op replaced
    by vLLM's own reference (marlin_utils_test.marlin_weights), as in the existing Marlin goldens."""
    from vllm.model_executor.layers.quantization.utils import marlin_utils_fp8 as m8
    from vllm.model_executor.layers.quantization.utils import marlin_utils_test as mt

    w, s = exp["weight"], exp["weight_scale"]
    n, k = w.shape

    def repack(b_q_weight, size_k, size_n, num_bits, is_a_8bit=False):
        # the op's input is the GPTQ packing [K/4, N] int32 of the raw e4m3 bytes
        codes = b_q_weight.contiguous().view(torch.uint8).reshape(size_k // 4, size_n, 4).permute(0, 2, 1).reshape(size_k, size_n)
        return mt.marlin_weights(codes.to(torch.int32), size_k, size_n, num_bits, mt.get_weight_perm(num_bits, is_a_8bit), is_a_8bit)

    class Layer(torch.nn.Module):
        pass

    layer = Layer()
    layer.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(s.view(torch.float8_e8m0fnu).clone(), requires_grad=False)
    layer.output_size_per_partition, layer.input_size_per_partition = n, k
    layer.orig_dtype = act
    layer.params_dtype = act
    orig = m8.ops.gptq_marlin_repack
    m8.ops.gptq_marlin_repack = repack
    try:
        m8.prepare_mxfp8_layer_for_marlin(layer)
    finally:
        m8.ops.gptq_marlin_repack = orig
    tensors = {"input.weight": w, "input.weight_scale": s, "expected.marlin_qweight": layer.weight.data.contiguous(),
               "expected.marlin_scales": layer.weight_scale.data.contiguous().view(torch.uint8)}
    save_file(tensors, os.path.join(out, f"{name}.safetensors"), metadata={"case": name, "act_dtype": str(act)})


def marlin_moe_case(out: str, name: str, e: int, i: int, h: int) -> None:
    """vLLM 0.33's prepare_mxfp8_moe_layer_for_marlin on ModelOpt-quantized experts (MXFP8QTensor,
    the exporter's numerics): w13 = [gate ; up] ``[E, 2I, H]``, w2 ``[E, H, I]``; the CUDA repack op
    replaced by vLLM's reference, as in :func:`marlin_case`."""
    from modelopt.torch.quantization.qtensor import MXFP8QTensor
    from vllm.model_executor.layers.quantization.utils import marlin_utils_fp8 as m8
    from vllm.model_executor.layers.quantization.utils import marlin_utils_test as mt

    g = torch.Generator().manual_seed(11)
    w13 = torch.randn(e, 2 * i, h, generator=g) * torch.exp2(torch.randint(-10, 2, (e, 2 * i, 1), generator=g).float())
    w2 = torch.randn(e, h, i, generator=g) * torch.exp2(torch.randint(-10, 2, (e, h, 1), generator=g).float())
    w13[0, 0, :32] = 0.0
    q13, s13 = MXFP8QTensor.quantize(w13.to(torch.bfloat16))
    q2, s2 = MXFP8QTensor.quantize(w2.to(torch.bfloat16))
    q13, q2 = q13._quantized_data, q2._quantized_data

    def repack(b_q_weight, size_k, size_n, num_bits, is_a_8bit=False):
        codes = b_q_weight.contiguous().view(torch.uint8).reshape(size_k // 4, size_n, 4).permute(0, 2, 1).reshape(size_k, size_n)
        return mt.marlin_weights(codes.to(torch.int32), size_k, size_n, num_bits, mt.get_weight_perm(num_bits, is_a_8bit), is_a_8bit)

    orig, dtype = m8.ops.gptq_marlin_repack, torch.get_default_dtype()
    m8.ops.gptq_marlin_repack = repack
    torch.set_default_dtype(torch.bfloat16)  # vLLM's param dtype at load time
    try:
        a, b, sa, sb = m8.prepare_mxfp8_moe_layer_for_marlin(None, q13, q2, s13, s2)
    finally:
        m8.ops.gptq_marlin_repack = orig
        torch.set_default_dtype(dtype)
    save_file({"input.w13.weight": q13, "input.w13.weight_scale": s13, "input.w2.weight": q2, "input.w2.weight_scale": s2,
               "expected.w13.marlin_qweight": a.contiguous(), "expected.w2.marlin_qweight": b.contiguous(),
               "expected.w13.marlin_scales": sa.contiguous().view(torch.uint8), "expected.w2.marlin_scales": sb.contiguous().view(torch.uint8)},
              os.path.join(out, f"{name}.safetensors"), metadata={"case": name, "act_dtype": "torch.bfloat16"})


def tiny_llama_export(out: str) -> None:
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoModelForCausalLM

    src = os.path.join(GOLDEN, "checkpoints", "tiny-llama")
    model = AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.bfloat16)
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    mtq.quantize(model, mtq.MXFP8_DEFAULT_CFG, forward_loop=lambda m: m(ids))
    dst = os.path.join(out, "tiny-llama-MXFP8")
    shutil.rmtree(dst, ignore_errors=True)
    export_hf_checkpoint(model, export_dir=dst)


def main(out: str) -> None:
    torch.manual_seed(0)
    os.makedirs(out, exist_ok=True)
    marlin_moe_case(out, "marlin_mxfp8_moe_e3_i64_h128", 3, 64, 128)
    if os.environ.get("ONLY_MOE"):
        return
    e1 = write_case(out, "mxfp8_256x384", crafted(256, 384, torch.bfloat16, 1))
    write_case(out, "mxfp8_200x96", crafted(200, 96, torch.bfloat16, 2))
    write_case(out, "mxfp8_fp16_128x128", crafted(128, 128, torch.float16, 3))
    write_case(out, "mxfp8_fp32_near_pow2", near_pow2_fp32())
    marlin_case(out, "marlin_mxfp8_256x384", e1, torch.bfloat16)
    e2 = write_case(out, "mxfp8_192x160", crafted(192, 160, torch.bfloat16, 4))
    marlin_case(out, "marlin_mxfp8_192x160", e2, torch.bfloat16)  # needs padding (N%64, K%128 / N%128, K%64)
    tiny_llama_export(os.path.join(GOLDEN, "checkpoints") if out == HERE else out)
    print(json.dumps(sorted(os.listdir(out))))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else HERE)
