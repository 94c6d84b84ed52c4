"""Regenerate the MIXED_PRECISION golden export with ModelOpt 0.47 (NOT run by the tests).

    /root/upstream-venv/bin/python tests/golden/mixed/generate.py

ModelOpt's ``export_hf_checkpoint`` of the golden tiny-llama quantized with NVFP4 everywhere
except the attention projections, which get FP8 128x128 blocks weight-only (``fp8_pb_wo``): the
NVFP4-MLP + block-FP8-attention trade. Writes ``checkpoints/tiny-llama-NVFP4-attn-FP8_PB_WO/``.
NVFP4 ``input_scale`` values come from a 2-sequence calibration (seed 0): not comparable to a
data-free converter's constant.
"""

from __future__ import annotations

import copy
import os
import shutil

import torch

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def main() -> None:
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
    cfg["quant_cfg"] += [
        {"quantizer_name": "*self_attn*weight_quantizer", "cfg": {"num_bits": (4, 3), "axis": None, "block_sizes": {-1: 128, -2: 128}}},
        {"quantizer_name": "*self_attn*input_quantizer", "enable": False},
    ]
    src = os.path.join(GOLDEN, "checkpoints", "tiny-llama")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    mtq.quantize(model, cfg, forward_loop=lambda m: m(ids))
    dst = os.path.join(GOLDEN, "checkpoints", "tiny-llama-NVFP4-attn-FP8_PB_WO")
    shutil.rmtree(dst, ignore_errors=True)
    export_hf_checkpoint(model, export_dir=dst)
    print(sorted(os.listdir(dst)))


if __name__ == "__main__":
    main()
