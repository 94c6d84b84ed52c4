"""Probe: a block-local Hessian objective for the NVFP4 block-scale search (ModelOpt's "local_hessian").

Our ``--scale-search mse`` with calibration data picks, per 16-group of a weight row, among the 6
e4m3 candidates of ``search.nvfp4_block_scales`` (RTN code + (0, +1, -1, -2, -3, -4)) the one
minimizing ``sum_j E[x_j^2] (w_j - q_j)^2``. ModelOpt's local_hessian uses the group's full 16x16
``H_b = E[x_b x_b^T]`` instead: ``e_b^T H_b e_b``. This script tries that objective with our
candidate list unchanged, on top of an existing RTN output (same ``weight_scale_2``):

    python bench/local_hessian_probe.py --rtn /tmp/gq-smol2/outputs/ours-W4A16_NVFP4-rtn \
        --mse /tmp/gq-smol2/outputs/ours-W4A16_NVFP4-mse --source /root/smol-model \
        --calib /tmp/gq-smol2/calib.jsonl --out /tmp/lh-probe --variants diag,full,ridge

Variants (written as copies of the RTN folder with only ``weight`` / ``weight_scale`` of the quantized
Linears rewritten in place, every other byte identical):
    diag   H_b -> diag(H_b): must reproduce the mse output (sanity check of the pipeline)
    full   e^T H_b e (local Hessian)
    ridge  e^T (H_b + 0.01 * mean(diag H_b) I) e

Errors in fp64; candidates scanned in order, a later one must be strictly smaller (ties to RTN).
Only for measurement: nothing in quantize_cli depends on this file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import time

import torch

from quantize_cli.schemes.numerics import NVFP4_GROUP, e2m1_codes, e2m1_values
from quantize_cli.schemes.nvfp4 import block_scales
from quantize_cli.schemes.search import E4M3_CODE_MAX, E4M3_CODE_MIN, NVFP4_CODE_STEPS, _e4m3, nvfp4_payload

G = NVFP4_GROUP
STEPS = list(NVFP4_CODE_STEPS)  # the candidates, as e4m3 code steps from RTN's (--steps: a wider list, a what-if)


def collect_hessians(source: str, calib: str, dtype: torch.dtype):
    """{linear name: (fp64 [K/16, 16, 16] sum x_b x_b^T, tokens)} over the calibration samples."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    model.eval()
    acc: dict[str, list] = {}
    handles = []
    for name, mod in model.model.layers.named_modules():
        if isinstance(mod, torch.nn.Linear):
            full = f"model.layers.{name}"

            def hook(m, inp, out, full=full):
                x = inp[0].detach().reshape(-1, inp[0].shape[-1]).double()  # fp32/bf16 -> fp64 exactly
                k = x.shape[1]
                xb = x.t().reshape(k // G, G, -1)
                h = xb @ xb.transpose(1, 2)
                if full in acc:
                    acc[full][0] += h
                    acc[full][1] += x.shape[0]
                else:
                    acc[full] = [h, x.shape[0]]

            handles.append(mod.register_forward_hook(hook))
    with torch.no_grad():
        for line in open(calib):
            ids = json.loads(line)["input_ids"]
            model(torch.tensor([ids]))
    for h in handles:
        h.remove()
    return {n: (v[0], v[1]) for n, v in acc.items()}


def search_groups(w: torch.Tensor, wsf2: torch.Tensor, hb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 [N, K/16] block scales, candidate index [N, K/16]) minimizing e^T hb e per group.

    w fp32 [N, K]; wsf2 fp32 0-d; hb fp64 [K/16, 16, 16] (any positive scale: only ratios matter)."""
    n, k = w.shape
    b = k // G
    rtn = block_scales(w, wsf2)  # [N, B] e4m3
    code0 = rtn.view(torch.uint8).long()
    xg = w.float().reshape(n, b, G)
    x64 = xg.double()
    best = torch.zeros(n, b, dtype=torch.int64)
    best_err = None
    for c, step in enumerate(STEPS):
        code = code0 + step
        valid = (code >= E4M3_CODE_MIN) & (code <= E4M3_CODE_MAX)
        code = code.clamp(E4M3_CODE_MIN, E4M3_CODE_MAX)
        bs = _e4m3(code).float()  # [N, B]
        v = e2m1_values(e2m1_codes(xg / (bs * wsf2)[:, :, None]))  # as the library: fp32 division
        e = x64 - v.double() * (bs.double() * wsf2.double())[:, :, None]  # [N, B, 16]
        eh = torch.einsum("nbi,bij->nbj", e, hb)
        err = (eh * e).sum(-1)  # [N, B]
        if best_err is None:
            best_err = err
            continue
        better = (err < best_err) & valid
        best_err = torch.where(better, err, best_err)
        best = torch.where(better, torch.full_like(best, c), best)
    codes = code0 + torch.tensor(STEPS)[best]
    return _e4m3(codes), best


def objectives(w: torch.Tensor, wsf2: torch.Tensor, bs8: torch.Tensor, h: torch.Tensor) -> tuple[float, float]:
    """(sum e^T H e, sum e^T diag(H) e) over all groups of `w` dequantized with block scales `bs8`."""
    n, k = w.shape
    xg = w.float().reshape(n, k // G, G)
    v = e2m1_values(e2m1_codes(xg / (bs8.float() * wsf2)[:, :, None]))
    e = xg.double() - v.double() * (bs8.double() * wsf2.double())[:, :, None]
    full = float((torch.einsum("nbi,bij->nbj", e, h) * e).sum())
    diag = float((e * e * torch.diagonal(h, dim1=1, dim2=2)[None]).sum())
    return full, diag


def variant_h(h: torch.Tensor, variant: str, ridge: float) -> torch.Tensor:
    if variant == "diag":
        return torch.diag_embed(torch.diagonal(h, dim1=1, dim2=2))
    if variant == "full":
        return h
    if variant == "ridge":
        d = torch.diagonal(h, dim1=1, dim2=2)
        return h + ridge * d.mean(-1)[:, None, None] * torch.eye(G, dtype=h.dtype)
    raise ValueError(variant)


def read_header(path: str):
    with open(path, "rb") as f:
        hlen = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(hlen))
    return 8 + hlen, header


def write_in_place(path: str, tensors: dict[str, torch.Tensor]) -> None:
    """Overwrite the data of `tensors` (same dtype and shape) in the safetensors file `path`."""
    base, header = read_header(path)
    with open(path, "r+b") as f:
        for name, t in tensors.items():
            s, e = header[name]["data_offsets"]
            raw = t.contiguous().view(torch.uint8).numpy().tobytes()
            assert len(raw) == e - s, name
            f.seek(base + s)
            f.write(raw)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rtn", required=True)
    p.add_argument("--mse", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--calib", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--variants", default="diag,full,ridge")
    p.add_argument("--ridge", type=float, default=0.01)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", help="candidate e4m3 code steps from RTN's, comma-separated, 0 first (default: the data-free "
                   "search's 0,1,-1,-2,-3,-4); output folders get the suffix -steps<N>")
    a = p.parse_args()
    tag = ""
    if a.steps:
        STEPS[:] = [int(x) for x in a.steps.split(",")]
        assert STEPS[0] == 0, "candidate 0 must be RTN's code (step 0)"
        tag = f"-steps{len(STEPS)}"
    torch.set_num_threads(a.threads)
    from safetensors import safe_open

    t0 = time.perf_counter()
    hess = collect_hessians(a.source, a.calib, getattr(torch, a.dtype))
    t_cal = time.perf_counter() - t0
    print(f"hessians: {len(hess)} linears, {t_cal:.1f}s", flush=True)

    src = safe_open(os.path.join(a.source, "model.safetensors"), "pt")
    rtn = safe_open(os.path.join(a.rtn, "model.safetensors"), "pt")
    mse = safe_open(os.path.join(a.mse, "model.safetensors"), "pt")
    names = sorted(n for n in hess if f"{n}.weight_scale" in rtn.keys())
    variants = a.variants.split(",")
    os.makedirs(a.out, exist_ok=True)
    choices: dict[str, dict[str, torch.Tensor]] = {v: {} for v in variants}
    summary = {"dtype": a.dtype, "linears": len(names), "calib_seconds": round(t_cal, 1), "variants": {}}
    for v in variants:
        t1 = time.perf_counter()
        out_dir = os.path.join(a.out, (f"lh-{v}" if v != "ridge" else f"lh-ridge{a.ridge:g}") + tag)
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        shutil.copytree(a.rtn, out_dir)
        new = {}
        eq_mse = eq_rtn_payload = total = eq_mse_payload = 0
        r_full, r_diag = [], []
        for n in names:
            w = src.get_tensor(f"{n}.weight").float()
            wsf2 = rtn.get_tensor(f"{n}.weight_scale_2").float()
            h, tok = hess[n]
            bs8, idx = search_groups(w, wsf2, variant_h(h / tok, v, a.ridge))
            q = nvfp4_payload(w, bs8, wsf2)
            choices[v][n] = idx
            hn = h / tok
            f1, d1 = objectives(w, wsf2, bs8, hn)
            f0, d0 = objectives(w, wsf2, block_scales(w, wsf2), hn)
            r_full.append(f1 / f0)
            r_diag.append(d1 / d0)
            ms = mse.get_tensor(f"{n}.weight_scale")
            eq_mse += int((bs8.view(torch.uint8) == ms.view(torch.uint8)).sum())
            eq_mse_payload += int((q == mse.get_tensor(f"{n}.weight")).sum())
            total += bs8.numel()
            new[f"{n}.weight"], new[f"{n}.weight_scale"] = q, bs8
        write_in_place(os.path.join(out_dir, "model.safetensors"), new)
        moved = sum(int((choices[v][n] != 0).sum()) for n in names)
        summary["variants"][v] = {
            "dir": out_dir, "groups": total,
            "scale_bytes_equal_to_mse": eq_mse / total,
            "groups_moved_from_rtn": moved / total,
            "payload_bytes_equal_to_mse": eq_mse_payload / (total * G // 2),
            "mean_full_objective_vs_rtn": sum(r_full) / len(r_full),
            "mean_diag_objective_vs_rtn": sum(r_diag) / len(r_diag),
            "seconds": round(time.perf_counter() - t1, 1),
        }
        print(v, json.dumps(summary["variants"][v]), flush=True)
    if "diag" in choices:
        for v in variants:
            if v == "diag":
                continue
            diff = sum(int((choices[v][n] != choices["diag"][n]).sum()) for n in names)
            summary["variants"][v]["choice_differs_from_diag"] = diff / summary["variants"][v]["groups"]
            # histogram of chosen candidates
            hist = torch.zeros(len(STEPS), dtype=torch.int64)
            for n in names:
                hist += torch.bincount(choices[v][n].reshape(-1), minlength=len(STEPS))
            summary["variants"][v]["candidate_hist"] = hist.tolist()
        hist = torch.zeros(len(STEPS), dtype=torch.int64)
        for n in names:
            hist += torch.bincount(choices["diag"][n].reshape(-1), minlength=len(STEPS))
        summary["variants"]["diag"]["candidate_hist"] = hist.tolist()
    # check: every tensor other than the replaced ones is byte-identical to the rtn output
    rb, rh = read_header(os.path.join(a.rtn, "model.safetensors"))
    for v, info in summary["variants"].items():
        ob, oh = read_header(os.path.join(info["dir"], "model.safetensors"))
        assert ob == rb and oh == rh
        with open(os.path.join(a.rtn, "model.safetensors"), "rb") as f1, open(os.path.join(info["dir"], "model.safetensors"), "rb") as f2:
            d1, d2 = f1.read(), f2.read()
        replaced = {f"{n}.weight" for n in names} | {f"{n}.weight_scale" for n in names}
        for name, meta in rh.items():
            if name == "__metadata__" or name in replaced:
                continue
            s, e = meta["data_offsets"]
            assert d1[rb + s: rb + e] == d2[ob + s: ob + e], name
        info["other_tensors_identical"] = True
    summary["total_seconds"] = round(time.perf_counter() - t0, 1)
    with open(os.path.join(a.out, f"summary-{a.dtype}.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
