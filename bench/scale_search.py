"""--scale-search on the GPU: kernel throughput, and whole conversions with and without the search.

1. Kernels: for each searchable algorithm and a few Llama-8B weight shapes (bf16, on the GPU),
   the plain kernel, the searched kernel and the activation-weighted searched kernel (channel
   weights like a calibration's E[x^2], given as a CPU tensor as the executor does), timed with
   CUDA events (median of ``--reps``), as GB/s of bf16 input. The searched outputs are first
   checked byte for byte against the CPU reference on the smallest shape.
2. Conversions: the Llama-3-8B-shaped synthetic checkpoint of ``bench/e2e.py`` (16 layers, 9.1 GB
   by default), input in the page cache (read once before each run), ``quantize convert`` in this
   process with ``--scale-search none``, ``mse`` and ``mse`` with ``--act-scales`` (a synthetic
   version-2 SCALES.json: the weighted search) interleaved ``--runs`` times; median wall time,
   input GB/s and the ratios to none.

    python bench/scale_search.py --json /tmp/scale_search.json          # GPU machine, full
    python bench/scale_search.py --skip-e2e                               # kernels only
    python bench/scale_search.py --layers 4 --vocab 32000 --runs 1        # a quick pass
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proc  # noqa: E402  (bench/proc.py: every command with a timeout)

HERE = os.path.dirname(os.path.abspath(__file__))
ALGOS = ("W4A16_NVFP4", "INT8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO")
SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336))


def time_cuda(fn, reps: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def channel_weights(k: int, gen):
    """fp32 CPU ``[K]`` like a calibration's E[x^2]: a wide range and one massive channel."""
    import torch

    cw = torch.exp2(torch.randn(k, generator=gen) * 4)
    cw[k // 3] = 1e7
    return cw


def same(out: dict, ref: dict) -> bool:
    import torch

    return all((torch.equal(out[k].cpu().reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)) if v.element_size() == 1
                else torch.equal(out[k].cpu(), v)) for k, v in ref.items())


def bench_kernels(reps: int) -> list[dict]:
    import torch

    from quantize_cli import kernels
    from quantize_cli.schemes import SCHEMES
    from quantize_cli.schemes.searched import with_scale_search

    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    cpu_gen = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        w = (torch.randn(*shape, device="cuda", generator=gen) * 0.02).bfloat16()
        cw = channel_weights(shape[1], cpu_gen)
        for algo in ALGOS:
            plain, searched = SCHEMES[algo], with_scale_search(SCHEMES[algo], "mse")
            if shape == SHAPES[0]:  # sanity: the GPU kernels equal the CPU reference
                assert same(kernels.quantize(searched, w), searched.quantize(w.cpu())), f"{algo} {shape}: kernel != reference"
                assert same(kernels.quantize(searched, w, channel_weights=cw), searched.quantize(w.cpu(), None, cw)), \
                    f"{algo} {shape}: weighted kernel != reference"
            t_plain = time_cuda(lambda: kernels.quantize(plain, w), reps)
            t_mse = time_cuda(lambda: kernels.quantize(searched, w), reps)
            t_w = time_cuda(lambda: kernels.quantize(searched, w, channel_weights=cw), reps)
            gb = w.numel() * 2 / 1e9
            rows.append(dict(algo=algo, shape=list(shape), none_ms=t_plain * 1e3, mse_ms=t_mse * 1e3, weighted_ms=t_w * 1e3,
                             none_gbps=gb / t_plain, mse_gbps=gb / t_mse, weighted_gbps=gb / t_w))
            print(f"kernel {algo:<26} {str(shape):<14} none {t_plain * 1e3:8.3f} ms ({gb / t_plain:7.1f} GB/s)  "
                  f"mse {t_mse * 1e3:8.3f} ms ({gb / t_mse:7.1f} GB/s)  weighted {t_w * 1e3:8.3f} ms ({gb / t_w:7.1f} GB/s)", flush=True)
        del w
    return rows


def bench_e2e(args) -> list[dict]:
    sys.path.insert(0, HERE)
    from e2e import make_checkpoint  # the shared synthetic checkpoint builder

    from quantize_cli.api import convert
    from quantize_cli.plan.options import ConvertOptions

    src, dst = os.path.join(args.work, "src"), os.path.join(args.work, "dst")
    make_checkpoint(src, args.layers, args.vocab, "cuda")
    scales = synthetic_scales(src, os.path.join(args.work, "SCALES.json"))
    rows = []
    for algo in args.algos.split(","):
        times: dict[str, list[float]] = {"none": [], "mse": [], "weighted": []}
        for _ in range(args.runs):
            for method in ("none", "mse", "weighted"):
                proc.run(f"cat {src}/*.safetensors > /dev/null", shell=True, check=True)
                os.sync()
                t = time.perf_counter()
                res = convert(ConvertOptions(src, dst, algo=algo, device="cuda", quiet=True, overwrite=True,
                                             scale_search=method if method != "weighted" else "mse",
                                             act_scales=scales if method == "weighted" else None))
                os.sync()
                times[method].append(time.perf_counter() - t)
                bytes_in = res.plan.bytes_in
                assert (res.plan.search_weights is not None) == (method == "weighted")
        med = {m: statistics.median(v) for m, v in times.items()}
        row = dict(algo=algo, bytes_in=bytes_in, none_s=med["none"], mse_s=med["mse"], weighted_s=med["weighted"],
                   ratio=med["mse"] / med["none"], weighted_ratio=med["weighted"] / med["none"],
                   none_gbps=bytes_in / 1e9 / med["none"], mse_gbps=bytes_in / 1e9 / med["mse"], all_s=times)
        rows.append(row)
        print(f"convert {algo:<26} none {med['none']:6.2f} s ({row['none_gbps']:.2f} GB/s)  mse {med['mse']:6.2f} s "
              f"({row['mse_gbps']:.2f} GB/s)  weighted {med['weighted']:6.2f} s  mse/none {row['ratio']:.3f}  "
              f"weighted/none {row['weighted_ratio']:.3f}  runs {times}", flush=True)
    return rows


def synthetic_scales(src: str, path: str) -> str:
    """A version-2 SCALES.json for the synthetic checkpoint (no forward: random E[x^2] per channel)."""
    import torch

    from quantize_cli.calibration.document import ScalesDoc, fingerprint
    from quantize_cli.checkpoint.source import open_source

    source = open_source(src)
    gen = torch.Generator().manual_seed(1)
    modules, channels = {}, {}
    for name, info in sorted(source.tensors.items()):
        if name.endswith(".weight") and len(info.shape) == 2 and "norm" not in name and "embed" not in name:
            modules[name[:-7]] = {"amax": 10.0, "tokens": 65536}
            channels[name[:-7]] = channel_weights(info.shape[1], gen)
    ScalesDoc({"label": source.label, **fingerprint(source.config, source.tensors)}, {"spec": "synthetic"}, {}, modules, {},
              channels=channels).save(path)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/tmp/quantize-scale-search")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--algos", default=",".join(ALGOS))
    p.add_argument("--runs", type=int, default=2, help="conversions per method (interleaved)")
    p.add_argument("--reps", type=int, default=10, help="kernel timings per case")
    p.add_argument("--skip-kernels", action="store_true")
    p.add_argument("--skip-e2e", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()
    import torch

    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if not args.skip_kernels:
        res["kernels"] = bench_kernels(args.reps)
    if not args.skip_e2e:
        res["e2e"] = bench_e2e(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
