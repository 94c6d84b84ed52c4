"""What activation quantization alone costs: ``quantize eval`` of a W4A4 output with the source's weights.

An NVFP4 (W4A4) output's perplexity gap has two parts: the 4-bit weights and the 4-bit inputs. Any
method that changes only the weights (GPTQ, the scale search) can at best remove the first; this
measures the second. It runs ``quantize eval DST --source SRC`` with one change: every quantized
Linear computes with the source's own weight (read from SRC's safetensors, fp32) instead of DST's
dequantized one, while its inputs are still quantized as served with DST's calibrated
``input_scale`` (eval/weights.Served.weight is replaced in this process only).

    python bench/act_only_floor.py DST SRC OUT.json [--samples 16 --seq-len 256]

docs/accuracy.md ("NVFP4: the activations' share") uses it on Gemma 3 270M and SmolLM2-135M.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dst", help="a quantized output whose activations are quantized at serve time (NVFP4)")
    p.add_argument("src", help="its bf16 source folder")
    p.add_argument("json", help="where quantize eval writes its result")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()

    from safetensors import safe_open

    import quantize_cli.eval.weights as served
    from quantize_cli.cli import main as cli

    where = {}
    for f in glob.glob(os.path.join(a.src, "*.safetensors")):
        with safe_open(f, "pt") as h:
            where.update({k: f for k in h.keys()})

    def source_weight(self, name: str, device=None):
        with safe_open(where[f"{name}.weight"], "pt") as h:
            w = h.get_tensor(f"{name}.weight").float()
        return w.to(device) if device is not None else w

    served.Served.weight = source_weight
    sys.argv = ["quantize", "eval", a.dst, "--source", a.src, "--data", "default", "--samples", str(a.samples),
                "--seq-len", str(a.seq_len), "--device", a.device, "--quiet", "--json", a.json]
    cli()


if __name__ == "__main__":
    main()
