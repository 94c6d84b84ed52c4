"""llm-compressor's model_free_ptq on a GPU vs our compressed-tensors output (bytes that differ).

Our output equals llm-compressor's CPU output byte for byte (tests/test_ct_golden.py). Its GPU
path (Triton, fp32 quotient) is expected to differ in a few percent of the payload bytes
(docs/formats.md, emulated in bench/ct_byte_differences.py); this script measures it for real.
Run on the GPU machine in a venv with llmcompressor 0.14.0.1 (../shared/bench/wheels) and this
package installed:

    python bench/ct_llmc_gpu.py tests/golden/checkpoints/tiny-llama /tmp/ct-gpu
"""

import glob
import os
import sys

import torch
from safetensors.torch import load_file

PRESETS = {"FP8_BLOCK": "FP8_PB_WO", "FP8_DYNAMIC": "FP8_PER_CHANNEL_PER_TOKEN", "W8A8": "INT8", "NVFP4A16": "W4A16_NVFP4"}


def load(folder):
    out = {}
    for f in glob.glob(os.path.join(folder, "*.safetensors")):
        out.update(load_file(f))
    return out


def main(src: str, work: str) -> None:
    from llmcompressor import model_free_ptq

    from quantize_cli.api import ConvertOptions, convert

    for preset, algo in PRESETS.items():
        theirs_dir, ours_dir = os.path.join(work, f"llmc-{preset}"), os.path.join(work, f"ours-{preset}")
        model_free_ptq(src, theirs_dir, scheme=preset, ignore=["lm_head"], device="cuda:0")
        convert(ConvertOptions(src, ours_dir, algo=algo, format="compressed-tensors", device="cuda", quiet=True, overwrite=True))
        theirs, ours = load(theirs_dir), load(ours_dir)
        diff = total = 0
        for name, t in theirs.items():
            if name.startswith("model.embed_tokens") or name not in ours or t.dtype == torch.bfloat16 and t.dim() == 2 and t.shape[1] > 1 and "scale" not in name:
                continue
            a, b = t.contiguous().view(torch.uint8).reshape(-1), ours[name].contiguous().view(torch.uint8).reshape(-1)
            diff += int((a != b).sum()) if a.shape == b.shape else a.numel()
            total += a.numel()
        print(f"{preset}: llm-compressor on {torch.cuda.get_device_name()} vs ours: {diff} of {total} bytes differ "
              f"({100 * diff / max(total, 1):.2f}%)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
