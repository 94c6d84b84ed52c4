"""GPTQ / AWQ beside round to nearest and llm-compressor, every output measured by ``quantize eval``.

One evaluator for every output (ours ModelOpt or compressed-tensors, llm-compressor's
compressed-tensors): ``quantize eval DST --source SRC --data default`` (the tool's held-out text,
no window shared with the calibration text) with the same samples; small counts so that it
finishes on a loaded CPU. Steps (each skips what exists; ``--work`` keeps everything)::

    python bench/gptq_smol.py data  --model /root/smol-model --work /tmp/gq-smol --calib-samples 16 --calib-seq-len 256
    python bench/gptq_smol.py ours  --model /root/smol-model --work /tmp/gq-smol --algos W4A16_NVFP4 INT4 NVFP4
    /root/llmc-venv/bin/python bench/gptq_llmc.py --model /root/smol-model --work /tmp/gq-smol \\
        --algos W4A16_NVFP4 INT4 NVFP4 --variants gptq awq --seq-len 256
    python bench/gptq_smol.py eval  --model /root/smol-model --work /tmp/gq-smol --samples 16 --seq-len 256
    python bench/gptq_smol.py table --work /tmp/gq-smol

``data`` writes calib.jsonl: the tokens of ``--calib-data default`` as token ids, which ours and
llm-compressor both calibrate on (one sample per batch for llm-compressor, padding-free batches
for ours: same tokens).

Any decoder folder works as ``--model``: Gemma 3 270M (issue 37; bench/gemma3_from_gguf.py builds it)
is measured with ``--algos INT4 INT4@ct INT4_ASYM W4A16_NVFP4 NVFP4`` (INT4's dimensions must divide
128). An algorithm name ``ALGO@ct`` writes ``--format compressed-tensors`` (INT4: pack-quantized, as
llm-compressor writes it; INT4_ASYM is compressed-tensors only and gets it anyway).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

VARIANTS = {  # name -> convert keywords (every variant gets --calib-data calib.jsonl)
    "rtn": {},
    "gptq": {"rounding": "gptq"},
    "awq": {"smooth": "awq"},
    "awq-gptq": {"smooth": "awq", "rounding": "gptq"},
    # the activation-weighted search (issue 28): group scales weighted by the calibration's E[x_j^2]
    "mse": {"scale_search": "mse"},
    "gptq-mse": {"rounding": "gptq", "scale_search": "mse"},
    "awq-mse": {"smooth": "awq", "scale_search": "mse"},
    "awq-gptq-mse": {"smooth": "awq", "rounding": "gptq", "scale_search": "mse"},
    "sq": {"smooth": "smoothquant"},
    "sq-gptq": {"smooth": "smoothquant", "rounding": "gptq"},
    "sq-gptq-mse": {"smooth": "smoothquant", "rounding": "gptq", "scale_search": "mse"},
}


def _levers(a) -> str:
    """Apply the bench-only levers (monkeypatched, never package defaults); the output name's suffix."""
    tag = ""
    if a.damp is not None:  # GPTQ's damping, relative to mean(diag H): solve() binds DAMP as a default argument
        from quantize_cli.calibration import gptq

        solve = gptq.solve
        gptq.solve = lambda *args, **kw: solve(*args, **{**kw, "damp": a.damp})
        tag += f"-d{a.damp:g}"
    if a.awq_grid is not None:  # AWQ's number of candidate scales (llm-compressor's 20)
        from quantize_cli.calibration import smooth

        smooth.N_GRID = a.awq_grid
        tag += f"-g{a.awq_grid}"
    return tag


def data(a) -> None:
    from quantize_cli.calibration.data import load_samples

    os.makedirs(a.work, exist_ok=True)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    ids, meta = load_samples(a.calib_data, a.model, cfg.get("vocab_size"), a.calib_samples, a.calib_seq_len)
    with open(os.path.join(a.work, "calib.jsonl"), "w") as f:
        f.writelines(json.dumps({"input_ids": s}) + "\n" for s in ids)
    print(f"calibration: {meta['samples']} samples, {meta['tokens']} tokens")


def ours(a) -> None:
    from quantize_cli import api
    from quantize_cli.plan.options import ConvertOptions

    calib = os.path.join(a.work, "calib.jsonl")
    out = os.path.join(a.work, "outputs")
    os.makedirs(out, exist_ok=True)
    tag = _levers(a)
    times = _load(os.path.join(a.work, "times.json"))
    for token in a.algos:
        algo, fmt = _algo_format(token)
        for name in a.variants:
            dst = os.path.join(out, f"ours-{token}-{name}{tag}")
            if os.path.isdir(dst):
                continue
            # NVFP4 calibrates its static input scales in every variant; the weight-only formats only need data for GPTQ / AWQ
            data = calib if name != "rtn" or algo == "NVFP4" else None
            t0, cpu0 = time.perf_counter(), time.process_time()
            api.convert(ConvertOptions(a.model, dst, algo=algo, device=a.device, quiet=True, calib_data=data,
                                       report=dst + ".report.json", format=fmt, **VARIANTS[name]))
            key = os.path.basename(dst)
            times = _load(os.path.join(a.work, "times.json"))  # another process may have added rows meanwhile
            times[key] = {"seconds": round(time.perf_counter() - t0, 1), "cpu_seconds": round(time.process_time() - cpu0, 1)}
            json.dump(times, open(os.path.join(a.work, "times.json"), "w"), indent=1)
            print(f"{key}: {times[key]}", flush=True)


def _algo_format(token: str) -> tuple[str, str]:
    """``INT4@ct`` -> (INT4, compressed-tensors); INT4_ASYM, which ModelOpt cannot hold, too; else modelopt."""
    algo, _, fmt = token.partition("@")
    return algo, "compressed-tensors" if fmt == "ct" or algo == "INT4_ASYM" else "modelopt"


def evaluate(a) -> None:
    """``quantize eval`` of every output not yet measured, ``--jobs`` at a time (one process each)."""
    from concurrent.futures import ThreadPoolExecutor

    todo = [d for d in sorted(glob.glob(os.path.join(a.work, "outputs", "*")))
            if os.path.isdir(d) and not os.path.basename(d).startswith(".") and not os.path.exists(d + ".eval.json")]

    def one(dst):
        cmd = [sys.executable, "-m", "quantize_cli.cli", "eval", dst, "--source", a.model, "--data", "default",
               "--samples", str(a.samples), "--seq-len", str(a.seq_len), "--device", a.device, "--quiet",
               "--json", dst + ".eval.json"]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        print(f"{os.path.basename(dst)}: rc {r.returncode} ({time.perf_counter() - t0:.0f} s) {r.stderr.strip()[-300:]}", flush=True)

    with ThreadPoolExecutor(a.jobs) as pool:
        list(pool.map(one, todo))


def table(a) -> None:
    times = {**_load(os.path.join(a.work, "times.json")), **_load(os.path.join(a.work, "llmc_times.json")),
             **_load(os.path.join(a.work, "modelopt_times.json"))}
    rows = []
    for js in sorted(glob.glob(os.path.join(a.work, "outputs", "*.eval.json"))):
        name = os.path.basename(js)[: -len(".eval.json")]
        r = json.load(open(js))
        rows.append((name, r))
    ppl = {name: (r.get("metrics") or r)["perplexity"] for name, r in rows}
    print("| output | perplexity | source | vs rtn | rtn gap closed | KL | top-1 | nll vs source +- 2 se | convert s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        m = r.get("metrics") or r
        t = times.get(name, {})
        se2 = 2 * m["nll_delta_se"] if m.get("nll_delta_se") is not None else None
        algo = name.split("-")[1]
        rtn = ppl.get(f"ours-{algo}-rtn")
        vs = f"{100 * (m['perplexity'] / rtn - 1):+.1f}%" if rtn else ""
        closed = f"{100 * (rtn - m['perplexity']) / (rtn - m['source_perplexity']):.0f}%" if rtn else ""
        print(f"| {name} | {_g(m, 'perplexity')} | {_g(m, 'source_perplexity')} | {vs} | {closed} | "
              f"{_g(m, 'kl_mean')} | {_g(m, 'top1_agreement')} | {_g(m, 'nll_delta')} +- {_g({'x': se2}, 'x')} | "
              f"{t.get('seconds', '')} |")


def _g(m: dict, key: str):
    v = m.get(key)
    return "" if v is None else (f"{v:.4g}" if isinstance(v, float) else v)


def _load(path: str) -> dict:
    return json.load(open(path)) if os.path.exists(path) else {}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=["data", "ours", "eval", "table"])
    p.add_argument("--model", default="/root/smol-model")
    p.add_argument("--work", default="/tmp/gq-smol")
    p.add_argument("--device", default="cpu", help="ours / eval: cpu or cuda")
    p.add_argument("--calib-data", default="default", help="data: the text calib.jsonl is made of")
    p.add_argument("--damp", type=float, help="ours: GPTQ damping (bench-only monkeypatch; package default 0.01)")
    p.add_argument("--awq-grid", type=int, help="ours: AWQ grid points (bench-only monkeypatch; package default 20)")
    p.add_argument("--calib-samples", type=int, default=16)
    p.add_argument("--calib-seq-len", type=int, default=256)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--jobs", type=int, default=1, help="eval: outputs measured at a time")
    p.add_argument("--algos", nargs="+", default=["W4A16_NVFP4", "INT4", "NVFP4"], help="ours: ALGO or ALGO@ct (compressed-tensors)")
    p.add_argument("--variants", nargs="+", default=["rtn", "gptq", "awq"])
    a = p.parse_args()
    {"data": data, "ours": ours, "eval": evaluate, "table": table}[a.step](a)


if __name__ == "__main__":
    main()
