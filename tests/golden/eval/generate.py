"""Regenerate ModelOpt 0.47's fake-quant logits for the golden exports (NOT run by the tests).

    /root/upstream-venv/bin/python tests/golden/eval/generate.py

For each golden export ``checkpoints/tiny-llama-<ALGO>`` this re-runs what made it (the golden
``tiny-llama`` in bf16, ``mtq.quantize(<preset>)`` calibrated on ``checkpoints/calibration.jsonl``,
``export_hf_checkpoint``), checks that the re-export equals the golden one tensor for tensor (so
the in-memory quantizers are the ones that wrote those bytes), then casts the model to fp32 and
records ModelOpt's fake-quant logits on ``eval_ids.jsonl`` (2 sequences x 24 tokens, seed 1).
ModelOpt's NVFP4 / MXFP8 block fake-quant op is CUDA-only (Triton or its CUDA extension); on the
CPU it is replaced by the same quantize -> dequantize through ModelOpt's own torch tensors
(``NVFP4QTensor`` with the quantizer's global amax, ``MXFP8QTensor``), the math its exporter uses.
Writes ``modelopt_fakequant.safetensors`` (``<ALGO>``: fp32 [2, 24, 512]) and ``eval_ids.jsonl``.
tests/eval/test_modelopt_golden.py compares ``quantize eval`` on the same exports with them.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "checkpoints")


def presets():
    import modelopt.torch.quantization as mtq

    mixed = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
    mixed["quant_cfg"] += [
        {"quantizer_name": "*self_attn*weight_quantizer", "cfg": {"num_bits": (4, 3), "axis": None, "block_sizes": {-1: 128, -2: 128}}},
        {"quantizer_name": "*self_attn*input_quantizer", "enable": False},
    ]
    return {"FP8": (mtq.FP8_DEFAULT_CFG, "calib"), "FP8_PER_CHANNEL_PER_TOKEN": (mtq.FP8_PER_CHANNEL_PER_TOKEN_CFG, "calib"),
            "FP8_PB_WO": (mtq.FP8_2D_BLOCKWISE_WEIGHT_ONLY_CFG, "calib"), "NVFP4": (mtq.NVFP4_DEFAULT_CFG, "calib"),
            "W4A16_NVFP4": (mtq.W4A16_NVFP4_CFG, "calib"), "MXFP8": (mtq.MXFP8_DEFAULT_CFG, "calib"),
            "NVFP4-attn-FP8_PB_WO": (mixed, "mixed")}


def cpu_block_fake_quant(inputs, block_size, amax, num_bits, exponent_bits, scale_num_bits, scale_exponent_bits):
    """ModelOpt's ``dynamic_block_quantize_op`` on the CPU, by ModelOpt's QTensor classes."""
    from modelopt.torch.quantization.qtensor.mxfp8_tensor import MXFP8QTensor
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    x = inputs.float()
    if (num_bits, exponent_bits) == (4, 2) and (scale_num_bits, scale_exponent_bits) == (8, 4):
        wsf2 = amax.float().amax() / (6.0 * 448.0)
        q, s, s2 = NVFP4QTensor.quantize(x, block_size, weights_scaling_factor_2=wsf2)
        return q.dequantize(dtype=torch.float32, scale=s, double_scale=s2, block_sizes={-1: block_size}).to(inputs.dtype)
    if (num_bits, exponent_bits) == (8, 4) and scale_exponent_bits == 8:
        q, s = MXFP8QTensor.quantize(x)
        return q.dequantize(dtype=torch.float32, scale=s).to(inputs.dtype)
    raise NotImplementedError((num_bits, exponent_bits, scale_num_bits, scale_exponent_bits))


def main() -> None:
    import modelopt.torch.quantization as mtq
    from modelopt.torch.quantization import tensor_quant

    tensor_quant.dynamic_block_quantize_op = cpu_block_fake_quant
    from modelopt.torch.export import export_hf_checkpoint
    from modelopt.torch.export.unified_export_hf import requantize_resmooth_fused_llm_layers
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    src = os.path.join(GOLDEN, "tiny-llama")
    calib = [json.loads(line)["input_ids"] for line in open(os.path.join(GOLDEN, "calibration.jsonl"))]
    mixed_ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))  # tests/golden/mixed/generate.py
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(1))
    with open(os.path.join(HERE, "eval_ids.jsonl"), "w") as f:
        for row in ids.tolist():
            f.write(json.dumps({"input_ids": row}) + "\n")
    out, facts = {}, {}
    for algo, (cfg, how) in presets().items():
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)

        def loop(m):
            if how == "mixed":
                m(mixed_ids)
            else:
                for s in calib:
                    m(torch.tensor([s]))

        mtq.quantize(model, cfg, forward_loop=loop)
        with tempfile.TemporaryDirectory() as tmp:
            export_hf_checkpoint(model, export_dir=tmp)
            mine = load_file(os.path.join(tmp, "model.safetensors"))
        golden = load_file(os.path.join(GOLDEN, f"tiny-llama-{algo}", "model.safetensors"))
        same = set(mine) == set(golden) and all(torch.equal(mine[k].reshape(-1).view(torch.uint8), golden[k].reshape(-1).view(torch.uint8)) for k in golden)
        print(algo, "re-export equals the golden export:", same)
        if not same:
            raise SystemExit(f"{algo}: the re-export differs from the golden one; the logits would not belong to it")
        # The export replaced the weights by packed ones: quantize a fresh copy the same way and
        # apply only the export's fused-layer step (shared q/k/v and gate/up amax), as the
        # exported bytes have it, then run the fake-quant model in fp32.
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
        mtq.quantize(model, cfg, forward_loop=loop)
        requantize_resmooth_fused_llm_layers(model)
        model = model.float().eval()
        with torch.no_grad():
            out[algo] = model(ids).logits.float().contiguous()
            facts[algo] = weight_differences(model, os.path.join(GOLDEN, f"tiny-llama-{algo}"))
        print(algo, facts[algo])
    save_file(out, os.path.join(HERE, "modelopt_fakequant.safetensors"), metadata={"modelopt": "0.47.0"})
    with open(os.path.join(HERE, "modelopt_fakequant.json"), "w") as f:
        json.dump(facts, f, indent=1, sort_keys=True)
        f.write("\n")


def weight_differences(model, export: str) -> dict:
    """Elements where ModelOpt's fake-quant weight differs (beyond fp32 rounding) from the weight vLLM serves from the
    export (quantize eval's weights.py, this checkout), and whether ModelOpt quantizes inputs."""
    import importlib.util
    import sys

    root = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
    sys.path.insert(0, root)
    if "quantize_cli.recipes" not in sys.modules:  # the checkout's recipes/ ships as quantize_cli.recipes
        spec = importlib.util.spec_from_file_location("quantize_cli.recipes", os.path.join(root, "recipes", "__init__.py"),
                                                      submodule_search_locations=[os.path.join(root, "recipes")])
        sys.modules["quantize_cli.recipes"] = mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    from quantize_cli.eval.weights import open_served

    served = open_served(export)
    diff = total = 0
    inputs = False
    for name, mod in model.named_modules():
        if name in served.linears:
            fq, w = mod.weight_quantizer(mod.weight.float()), served.weight(name)
            diff += int(((fq - w).abs() > 1e-6 * w.abs()).sum())  # a different code, not an fp32 ulp
            total += fq.numel()
            inputs |= bool(mod.input_quantizer.is_enabled)
    return {"weight_elements_differing": diff, "weight_elements": total, "modelopt_quantizes_inputs": inputs}


if __name__ == "__main__":
    main()
