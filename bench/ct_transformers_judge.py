"""A second judge for compressed-tensors outputs (issue 37): transformers loads each one itself (its
compressed-tensors integration decompresses the weights) and its perplexity is computed on the same
held-out samples as ``quantize eval --data default --samples N --seq-len L``.

    python bench/ct_transformers_judge.py --model SRC --samples 16 --seq-len 256 OUT1 OUT2 ... [--json F]

Not a test dependency: needs transformers and compressed-tensors (the test extra has both). Weight-only
outputs only (W4A16 / W4A16_ASYM / NVFP4A16): transformers' compressed-tensors models run their
activations unquantized, which is how these formats are served. Prints one line per output with the
perplexity, beside ``quantize eval``'s from ``OUT.eval.json`` when present.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, ROOT)


def perplexity(model, samples, torch) -> tuple[float, int]:
    """exp(mean next-token nll) over every position of every sample (fp32 log-softmax), and the count."""
    nll, n = 0.0, 0
    with torch.no_grad():
        for ids in samples:
            x = torch.tensor([ids])
            logits = model(input_ids=x).logits[0, :-1].float()
            nll += torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item()
            n += len(ids) - 1
    return math.exp(nll / n), n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outputs", nargs="+")
    p.add_argument("--model", required=True, help="the source folder (its tokenizer makes the samples)")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--json")
    a = p.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    from quantize_cli.eval.data import load_eval_samples

    cfg = json.load(open(os.path.join(a.model, "config.json")))
    vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    samples, meta = load_eval_samples("default", a.model, vocab, a.samples, a.seq_len)
    rows = {}
    for out in a.outputs:
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()  # fp32 as quantize eval computes
        ppl, n = perplexity(model, samples, torch)
        ours = None
        if os.path.exists(out.rstrip("/") + ".eval.json"):
            ev = json.load(open(out.rstrip("/") + ".eval.json"))
            ours = (ev.get("metrics") or ev)["perplexity"]
        rows[os.path.basename(out.rstrip("/"))] = {"transformers_perplexity": ppl, "positions": n,
                                                   "quantize_eval_perplexity": ours, "seconds": round(time.perf_counter() - t0, 1)}
        print(f"{os.path.basename(out.rstrip('/'))}: transformers {ppl:.4g} ({n} positions)"
              + (f", quantize eval {ours:.4g}" if ours is not None else ""), flush=True)
        del model
    if a.json:
        json.dump({"samples": meta, "rows": rows}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
