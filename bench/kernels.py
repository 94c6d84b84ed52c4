"""Benchmark the Triton quantize kernels against device memory bandwidth and the torch references.

    python bench/kernels.py [--check] [--json FILE] [--sweep] [--shapes 8192x8192,moe]

In one run: the device-to-device copy bandwidth (``clone`` of a 2 GiB buffer, read + write bytes),
then for every kernel and shape the achieved GB/s, where the bytes are what the scheme must move:
the input once per pass it needs (twice where a whole-tensor amax comes first: ``FP8``, ``NVFP4``)
plus every output once. Reported: GB/s, the ratio to the copy bandwidth, and the speed-up over the
torch reference (``scheme.quantize``) on the same GPU. Times are medians of
``triton.testing.do_bench`` (warm-up, L2 flushed between runs). ``--check`` asserts that every
benchmarked output equals the reference byte for byte: the reference run on the CPU (on CUDA torch
divides by a Python scalar through a rounded reciprocal), on three 128-row slices of each weight
(rows are independent given the global amax, itself checked). ``--sweep`` times launch variants.

Works installed (``pip install -e .``) or from a checkout with ``PYTHONPATH=.``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import traceback

import torch


def _import_kernels():
    """``quantize_cli.kernels``; from a bare checkout the ``kernels/`` folder is mapped by hand
    (pyproject's package-dir mapping only exists once the package is installed)."""
    try:
        import quantize_cli.kernels as k

        return k
    except ModuleNotFoundError:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        spec = importlib.util.spec_from_file_location(
            "quantize_cli.kernels", os.path.join(root, "kernels", "__init__.py"),
            submodule_search_locations=[os.path.join(root, "kernels")],
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["quantize_cli.kernels"] = module
        spec.loader.exec_module(module)
        return module


K = _import_kernels()
from quantize_cli.algorithms import ALGOS as ALL_ALGOS  # noqa: E402
from quantize_cli.schemes import SCHEMES  # noqa: E402

import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

SHAPES = {"8192x8192": (8192, 8192), "28672x8192": (28672, 8192), "151936x4096": (151936, 4096), "moe": (128, 1536, 4096)}
ALGOS = tuple(a for a in ALL_ALGOS if a not in ("W4A16_NVFP4", "INT4_ASYM"))  # NVFP4 / INT4 kernels; INT4_ASYM is compressed-tensors only (torch reference)
NEEDS_AMAX = ("FP8", "NVFP4")


def ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """GB/s of ``clone`` on the device, counting the bytes read plus the bytes written."""
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    t = ms(lambda: x.clone())
    del x
    return 2 * nbytes / t / 1e6


def out_bytes(out: dict) -> int:
    return sum(v.numel() * v.element_size() for k, v in out.items() if v.is_cuda)


def same(a: dict, b: dict) -> bool:
    if list(a) != list(b):
        return False
    for key in a:
        x, y = a[key], b[key]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if not torch.equal(x.reshape(-1).view(torch.uint8), y.to(x.device).reshape(-1).view(torch.uint8)):
            return False
    return True


def reference_stack(scheme, w3, gamax=None):
    """The torch reference over a stack: one ``scheme.quantize`` per item (how it would run)."""
    outs = [scheme.quantize(w3[e], gamax) for e in range(w3.shape[0])]
    return {k: outs[0][k] if k == "input_scale" else torch.stack([o[k] for o in outs]) for k in outs[0]}


def check_rows(scheme, w: torch.Tensor, out: dict, gamax) -> bool:
    """Kernel output of ``w [N, K]`` vs the reference run on the CPU (the specification: on CUDA,
    torch divides by a Python scalar through a rounded reciprocal) for three 128-row slices. Rows
    are independent given the global amax, which is checked against torch's (exact anywhere)."""
    if scheme.shares_global_amax:
        gamax = K.global_amax(w) if gamax is None else gamax
        if gamax.item() != w.abs().amax().float().item():
            return False
    else:
        gamax = None
    n = w.shape[0]
    for start in sorted({0, (n // 2) // 128 * 128, max(0, n - 128)}):
        rows = slice(start, min(n, start + 128))
        ref = scheme.quantize(w[rows].cpu(), None if gamax is None else gamax.cpu())
        got = {}
        for key, v in out.items():
            if key == "input_scale" or v.dim() == 0:
                got[key] = v
            elif v.dim() == 4:  # FP8_PB_WO scales [N/128, 1, K/128, 1]
                got[key] = v[start // 128 : start // 128 + 1]
            elif scheme.algo == "INT4" and key == "weight":  # [N/2, K]: two rows per byte
                got[key] = v[rows.start // 2 : rows.stop // 2]
            else:
                got[key] = v[rows]
        if not same(got, ref):
            return False
    return True


def check(scheme, w: torch.Tensor, out: dict, gamax) -> bool:
    if w.dim() == 2:
        return check_rows(scheme, w, out, gamax)
    items = (0, w.shape[0] - 1)  # a stack: its first and last weights
    return all(
        check_rows(scheme, w[e], {k: v if k == "input_scale" else v[e] for k, v in out.items()}, None if gamax is None else gamax[e])
        for e in items
    )


def bench_case(algo: str, name: str, w: torch.Tensor, copy_bw: float, do_check: bool, given_amax: bool) -> dict:
    scheme = SCHEMES[algo]
    stack = w.dim() == 3
    gamax = None
    if given_amax:  # the executor's fused-group path: the amax pass was done beforehand
        gamax = K.stack_global_amax(w) if stack else K.global_amax(w)
    run = (lambda: K.quantize_stack(scheme, w, gamax)) if stack else (lambda: K.quantize(scheme, w, gamax))
    ref = (lambda: reference_stack(scheme, w)) if stack else (lambda: scheme.quantize(w))
    out = run()
    passes = 2 if (algo in NEEDS_AMAX and not given_amax) else 1
    nbytes = passes * w.numel() * w.element_size() + out_bytes(out)
    row = {"kernel": algo + (" (given amax)" if given_amax else ""), "shape": name, "dtype": str(w.dtype).replace("torch.", ""),
           "bytes": nbytes, "passes": passes}
    if do_check:
        row["check"] = "exact" if check(scheme, w, out, gamax) else "MISMATCH"
    del out
    t = ms(run)
    row.update(ms=t, GBps=nbytes / t / 1e6)
    row["of_copy"] = row["GBps"] / copy_bw
    if not given_amax:
        t_ref = ms(ref)
        row.update(ref_ms=t_ref, speedup=t_ref / t)
    return row


def bench_amax(name: str, w: torch.Tensor, copy_bw: float, check: bool) -> dict:
    scheme = SCHEMES["FP8"]
    stack = w.dim() == 3
    run = (lambda: K.stack_global_amax(w)) if stack else (lambda: K.global_amax(w))
    ref = (lambda: w.abs().amax(dim=(1, 2)).float()) if stack else (lambda: scheme.global_amax(w))
    row = {"kernel": "amax", "shape": name, "dtype": str(w.dtype).replace("torch.", ""), "bytes": w.numel() * w.element_size(), "passes": 1}
    if check:
        row["check"] = "exact" if torch.equal(run(), ref()) else "MISMATCH"
    t, t_ref = ms(run), ms(ref)
    row.update(ms=t, GBps=row["bytes"] / t / 1e6, ref_ms=t_ref, speedup=t_ref / t)
    row["of_copy"] = row["GBps"] / copy_bw
    return row


def moe_per_expert_calls(algo: str, w3: torch.Tensor, copy_bw: float) -> dict:
    """The MoE stack quantized one expert per call (2-D API): shows the per-call overhead."""
    scheme = SCHEMES[algo]
    run = lambda: [K.quantize(scheme, w3[e]) for e in range(w3.shape[0])]  # noqa: E731
    out = K.quantize_stack(scheme, w3)
    passes = 2 if algo in NEEDS_AMAX else 1
    nbytes = passes * w3.numel() * w3.element_size() + out_bytes(out)
    t = ms(run)
    return {"kernel": algo + " (per-expert calls)", "shape": "moe", "dtype": "bfloat16", "bytes": nbytes, "passes": passes,
            "ms": t, "GBps": nbytes / t / 1e6, "of_copy": nbytes / t / 1e6 / copy_bw}


def sweep(w: torch.Tensor, copy_bw: float) -> list[dict]:
    """Time launch-shape variants of each kernel on `w` (results never depend on them)."""
    from quantize_cli.kernels import amax, fp8_quant, int8_quant, nvfp4_quant

    variants = [
        ("amax", amax, [dict(AMAX_BLOCK=b, AMAX_WARPS=nw, AMAX_PROGRAMS_PER_SM=p) for b, nw, p in ((8192, 8, 4), (16384, 8, 2), (8192, 4, 8), (4096, 4, 8))]),
        ("FP8", fp8_quant, [dict(TENSOR_BLOCK=b, TENSOR_WARPS=nw) for b, nw in ((8192, 8), (4096, 4), (16384, 8), (16384, 16))]),
        ("FP8_PER_CHANNEL_PER_TOKEN", fp8_quant, [dict(ROW_TILE=t, ROW_WARPS=nw) for t in (4096, 8192) for nw in (4, 8)]),
        ("FP8_PB_WO", fp8_quant, [dict(BLOCK_WARPS=nw) for nw in (8, 16, 32)]),
        ("NVFP4", nvfp4_quant, [dict(GROUPS_PER_PROGRAM=g, NVFP4_WARPS=nw, FAST_DIV=f) for f in (True, False)
                                for g, nw in ((256, 4), (128, 4), (512, 4), (512, 8))]),
        ("INT8", int8_quant, [dict(ROW_TILE=t, ROW_WARPS=nw) for t in (4096, 8192, 16384) for nw in (8, 16)]),
    ]
    rows = []
    for algo, module, configs in variants:
        saved = {k: getattr(module, k) for k in configs[0]}
        gamax = K.global_amax(w)
        for cfg in configs:
            for k, v in cfg.items():
                setattr(module, k, v)
            try:
                if algo == "amax":
                    fn, nbytes = (lambda: K.global_amax(w)), w.numel() * w.element_size()
                else:
                    scheme = SCHEMES[algo]
                    g = gamax if algo in NEEDS_AMAX else None
                    fn = lambda scheme=scheme, g=g: K.quantize(scheme, w, g)  # noqa: E731
                    nbytes = w.numel() * w.element_size() + out_bytes(fn())
                t = ms(fn)
                rows.append({"kernel": algo, "config": cfg, "ms": t, "GBps": nbytes / t / 1e6, "of_copy": nbytes / t / 1e6 / copy_bw})
            except Exception as exc:  # a variant that does not compile (registers) is reported, not fatal
                rows.append({"kernel": algo, "config": cfg, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
        for k, v in saved.items():
            setattr(module, k, v)
    return rows


def markdown(rows: list[dict]) -> str:
    head = "| kernel | shape | GB moved | passes | ms | GB/s | of copy | torch ms | speed-up | check |"
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['kernel']} | {r['shape']} | | | | | | | | ERROR {r['error']} |")
            continue
        ref = f"{r['ref_ms']:.3f} | {r['speedup']:.1f}x" if "ref_ms" in r else " | "
        lines.append(f"| {r['kernel']} | {r['shape']} | {r['bytes'] / 1e9:.2f} | {r['passes']} | {r['ms']:.3f} | "
                     f"{r['GBps']:.0f} | {r['of_copy']:.0%} | {ref} | {r.get('check', '')} |")
    return "\n".join(lines)


def make_weight(shape) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(shape, dtype=torch.bfloat16, device="cuda")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="assert kernel output == reference, byte for byte")
    p.add_argument("--json", help="also write the results as JSON to this file")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated subset of {','.join(SHAPES)}, or none")
    p.add_argument("--sweep", action="store_true", help="time launch-shape variants on 151936x4096")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2

    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "python": platform.python_version()}
    copy_bw = copy_bandwidth()
    print(f"{env['device']} | torch {env['torch']} | triton {env['triton']} | CUDA {env['cuda']} | Python {env['python']}")
    print(f"device-to-device copy (clone, read + write): {copy_bw:.0f} GB/s\n", flush=True)

    rows = []
    for name in [s for s in args.shapes.split(",") if s and s != "none"]:
        w = make_weight(SHAPES[name])
        cases = [("amax", False)] + [(a, False) for a in ALGOS] + [(a, True) for a in NEEDS_AMAX]
        for algo, given in cases:
            try:
                row = bench_amax(name, w, copy_bw, args.check) if algo == "amax" else bench_case(algo, name, w, copy_bw, args.check, given)
            except Exception as exc:
                traceback.print_exc()
                row = {"kernel": algo, "shape": name, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            rows.append(row)
            print(markdown([row]).splitlines()[-1], flush=True)
            torch.cuda.empty_cache()
        if name == "moe":
            for algo in ("FP8", "FP8_PB_WO"):
                rows.append(moe_per_expert_calls(algo, w, copy_bw))
        del w
        torch.cuda.empty_cache()

    print("\n" + markdown(rows))
    result = {"env": env, "copy_GBps": copy_bw, "rows": rows}
    if args.sweep:
        result["sweep"] = sweep(make_weight(SHAPES["151936x4096"]), copy_bw)
        print("\nsweep (151936x4096 bf16; per-tensor schemes given their amax):")
        for r in result["sweep"]:
            print(f"  {r['kernel']:28s} {json.dumps(r['config'])}: " + (r["error"] if "error" in r else f"{r['GBps']:.0f} GB/s ({r['of_copy']:.0%})"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    bad = [r for r in rows if r.get("check") == "MISMATCH" or "error" in r]
    if bad:
        print(f"\n{len(bad)} case(s) failed: " + ", ".join(f"{r['kernel']} {r['shape']}" for r in bad), file=sys.stderr)
    return 1 if (bad and args.check) or any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
