"""GPTQ / AWQ / SmoothQuant against round to nearest and against llm-compressor, on one model.

Three steps, each a sub-command (the same calibration tokens and the same evaluation for every
method; the peers' outputs are made by ``bench/gptq_llmc.py`` in their own scratch venv):

    python bench/gptq_accuracy.py data --model /root/smol-model --work /tmp/gq-bench
        calib.jsonl: the project's ``--calib-data default`` samples as token ids (29 x <= 512)
        eval.jsonl:  windows of 512 tokens (BOS + 511) of Python's own reference documentation
                     (``pydoc_data.topics``, in the standard library: English technical prose with
                     code; not in the calibration text), the first --eval-windows of them
    python bench/gptq_accuracy.py ours --model /root/smol-model --work /tmp/gq-bench [--algos ...]
        outputs/ours-<ALGO>-<variant>: ``quantize convert`` with --calib-data calib.jsonl
    /root/llmc-venv/bin/python bench/gptq_llmc.py --model /root/smol-model --work /tmp/gq-bench
        outputs/llmc-<ALGO>-<variant>: llm-compressor 0.14 oneshot on the same samples
    python bench/gptq_accuracy.py eval --model /root/smol-model --work /tmp/gq-bench --json out.json

Evaluation (one function for every output, ModelOpt or compressed-tensors): the unquantized
model in fp32; every tensor of the output that is a model parameter replaces it (smoothed norms);
every quantized Linear computes ``linear(act(x), W_deq)`` with ``W_deq`` dequantized from the
written tensors by the project's schemes and ``act`` the serving engine's activation quantization
(NVFP4: static global scale from the written input scale, dynamic e4m3 16-group scales, E2M1;
W4A16: none). Next-token loss over the eval windows, perplexity, and per method the paired
per-token difference to round to nearest with two standard errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from gptq_smol import VARIANTS  # noqa: E402  (name -> convert keywords, plus calib_data: one list for both benches)

WINDOW = 512


def data(a) -> None:
    import pydoc_data.topics as topics
    from transformers import AutoTokenizer

    from quantize_cli.calibration.data import load_samples

    os.makedirs(a.work, exist_ok=True)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    ids, meta = load_samples("default", a.model, cfg.get("vocab_size"), 128, 512)
    with open(os.path.join(a.work, "calib.jsonl"), "w") as f:
        f.writelines(json.dumps({"input_ids": s}) + "\n" for s in ids)
    tok = AutoTokenizer.from_pretrained(a.model)
    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    body = tok(text, add_special_tokens=False)["input_ids"]
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    step = WINDOW - len(bos)
    windows = [bos + body[i : i + step] for i in range(0, len(body) - step + 1, step)][: a.eval_windows]
    with open(os.path.join(a.work, "eval.jsonl"), "w") as f:
        f.writelines(json.dumps({"input_ids": w}) + "\n" for w in windows)
    print(f"calibration: {meta['samples']} samples, {meta['tokens']} tokens; eval: {len(windows)} windows, "
          f"{sum(map(len, windows))} tokens of {len(body)} available")


def ours(a) -> None:
    from quantize_cli import api
    from quantize_cli.plan.options import ConvertOptions

    calib = os.path.join(a.work, "calib.jsonl")
    os.makedirs(os.path.join(a.work, "outputs"), exist_ok=True)
    for algo in a.algos:
        for name in a.variants:
            if name == "sq-gptq" and algo != "NVFP4":
                continue
            dst = os.path.join(a.work, "outputs", f"ours-{algo}-{name}")
            if os.path.isdir(dst) and not a.again:
                continue
            t0 = time.perf_counter()
            api.convert(ConvertOptions(a.model, dst, algo=algo, device=a.device, quiet=True, overwrite=True,
                                       calib_data=calib if (name != "rtn" and name != "mse") or algo == "NVFP4" else None,
                                       **VARIANTS[name]))
            print(f"ours {algo} {name}: {time.perf_counter() - t0:.1f} s", flush=True)


# -- evaluation ------------------------------------------------------------------------------
def _served_linears(folder: str) -> tuple[dict, dict]:
    """(module -> (fp32 weight, activation quantizer or None), plain tensors) of an output folder."""
    from safetensors.torch import load_file

    from quantize_cli.calibration.fake_quant import nvfp4
    from quantize_cli.formats import CT_SCHEMES
    from quantize_cli.schemes import get_scheme

    t = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            t.update(load_file(os.path.join(folder, f)))
    qc = json.load(open(os.path.join(folder, "config.json")))["quantization_config"]
    ct = qc.get("quant_method") == "compressed-tensors"
    if ct:
        group = next(iter(qc["config_groups"].values()))
        w4a4 = group.get("input_activations") is not None
        scheme = CT_SCHEMES["NVFP4" if w4a4 else "W4A16_NVFP4"]
        payload, keys = "weight_packed", ("weight_packed", "weight_scale", "weight_global_scale")
    else:
        scheme = get_scheme(qc["quant_algo"])
        w4a4 = scheme.static_input_scale is not None
        payload, keys = "weight", ("weight", "weight_scale", "weight_scale_2")
    lin, used = {}, set()
    for name in t:
        if not name.endswith("." + payload) or (not ct and t[name].dtype != torch.uint8):
            continue
        m = name[: -len(payload) - 1]
        if not all(f"{m}.{k}" in t for k in keys):
            continue
        w = scheme.dequantize({k: t[f"{m}.{k}"] for k in keys}).float()
        act = None
        if w4a4:
            amax = float(2688.0 / t[f"{m}.input_global_scale"].float()) if ct else float(t[f"{m}.input_scale"].float() * 2688.0)
            act = (lambda x, amax=amax: nvfp4(x, amax))
        lin[m] = (w, act)
        used.update(f"{m}.{k}" for k in keys + ("input_scale", "input_global_scale"))
    plain = {k: v for k, v in t.items() if k not in used and v.is_floating_point()}
    return lin, plain


def _evaluate(model, windows, lin: dict | None, plain: dict | None) -> torch.Tensor:
    """Per-token next-token loss over `windows` with the output's served Linears (None: unquantized)."""
    saved_state, saved_fwd = {}, []
    if plain:
        state = model.state_dict()
        for k, v in plain.items():
            if k in state and state[k].shape == v.shape:
                saved_state[k] = state[k].clone()
                state[k].copy_(v.float())
    if lin:
        for name, mod in model.named_modules():
            if name in lin:
                w, act = lin[name]

                def fwd(x, w=w, act=act, b=mod.bias):
                    x = x.float()
                    return torch.nn.functional.linear(act(x) if act else x, w, b)

                saved_fwd.append((mod, mod.forward))
                mod.forward = fwd
        assert len(saved_fwd) == len(lin), f"{len(lin) - len(saved_fwd)} quantized Linears not in the model"
    try:
        losses = []
        with torch.no_grad():
            for ids in windows:
                x = torch.tensor(ids)[None]
                logits = model(input_ids=x).logits[0].float()
                losses.append(torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:], reduction="none"))
        return torch.cat(losses)
    finally:
        for mod, f in saved_fwd:
            mod.forward = f
        if saved_state:
            state = model.state_dict()
            for k, v in saved_state.items():
                state[k].copy_(v)


def evaluate(a) -> None:
    from transformers import AutoModelForCausalLM

    windows = [json.loads(line)["input_ids"] for line in open(os.path.join(a.work, "eval.jsonl"))]
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    out_dir = os.path.join(a.work, "outputs")
    rows, per_token = [], {}
    t0 = time.perf_counter()
    ref = _evaluate(model, windows, None, None)
    rows.append({"output": "unquantized", "loss": ref.mean().item(), "ppl": ref.mean().exp().item()})
    print(f"unquantized: ppl {rows[-1]['ppl']:.3f} ({time.perf_counter() - t0:.0f} s, {ref.numel()} tokens)", flush=True)
    for name in sorted(os.listdir(out_dir)):
        if a.only and not any(o in name for o in a.only):
            continue
        lin, plain = _served_linears(os.path.join(out_dir, name))
        t0 = time.perf_counter()
        per_token[name] = _evaluate(model, windows, lin, plain)
        loss = per_token[name].mean().item()
        rows.append({"output": name, "loss": loss, "ppl": float(torch.tensor(loss).exp()), "linears": len(lin)})
        print(f"{name}: ppl {rows[-1]['ppl']:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    for r in rows[1:]:  # paired against the same algorithm's round to nearest (ours)
        algo = r["output"].split("-")[1] if r["output"].count("-") >= 2 else None
        base = f"ours-{algo}-rtn"
        if base in per_token and r["output"] != base:
            d = per_token[r["output"]] - per_token[base]
            r["vs_ours_rtn"] = {"mean": d.mean().item(), "2se": 2 * d.std().item() / d.numel() ** 0.5}
        r["gap_closed"] = None
        if base in per_token:
            gap = per_token[base].mean().item() - ref.mean().item()
            r["gap_closed"] = (per_token[base].mean().item() - r["loss"]) / gap if gap > 0 else None
    print("| output | loss | perplexity | loss - ours RTN (2 SE) | share of RTN's loss gap closed |")
    print("|---|---|---|---|---|")
    for r in rows:
        d = r.get("vs_ours_rtn")
        gap = r.get("gap_closed")
        diff = "" if d is None else f"{d['mean']:+.4f} +- {d['2se']:.4f}"
        closed = "" if gap is None else f"{gap:.0%}"
        print(f"| {r['output']} | {r['loss']:.4f} | {r['ppl']:.3f} | {diff} | {closed} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"eval_tokens": int(ref.numel()), "windows": len(windows), "rows": rows,
                       "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=["data", "ours", "eval"])
    p.add_argument("--model", required=True)
    p.add_argument("--work", default="/tmp/gq-bench")
    p.add_argument("--eval-windows", type=int, default=32)
    p.add_argument("--algos", nargs="+", default=["W4A16_NVFP4", "NVFP4"])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--device", default="cpu")
    p.add_argument("--again", action="store_true", help="redo outputs that exist")
    p.add_argument("--only", nargs="*", help="evaluate only outputs whose name contains one of these")
    p.add_argument("--json")
    a = p.parse_args()
    {"data": data, "ours": ours, "eval": evaluate}[a.step](a)


if __name__ == "__main__":
    main()
