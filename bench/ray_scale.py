"""Scale-out benchmark: ``quantize convert --executor local`` vs ``--executor ray`` with 1..N workers.

Each run is a whole ``quantize convert`` process, timed from start to exit (plan, conversion,
fsync, metadata, rename), on the same synthetic bf16 checkpoint (bench/e2e.py's Llama-8B-shaped
layers; ``--layers 2 --vocab 32000`` is ~1.5 GB). For ``ray-N`` a Ray head with N workers (N CPUs,
or N GPUs with ``--device cuda``) is started first with ``ray start --head`` (not timed, as on a
real cluster) and the command joins it with ``--ray-address``; ``ray-auto`` times the command
that starts its own local instance (the one-machine default), so its startup cost is included.
The output shards are kept small (``--max-shard-size``) so that there are enough tasks to share.

Every output is compared byte for byte with the local one. Prints a markdown table and the load.

    python bench/ray_scale.py                                   # CPU: local, ray-1, ray-2, ray-auto
    python bench/ray_scale.py --device cuda --workers 1,2,4,8 --layers 16 --vocab 128256 \
        --max-shard-size 2GB --algo NVFP4 --workdir /raid/bench     # GPU machine, 8 GPUs
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
RAY = os.path.join(os.path.dirname(sys.executable), "ray")
PORT = 6399  # the benchmark's own head, away from a default cluster on 6379


def same_tree(a: str, b: str) -> bool:
    names = sorted(os.listdir(a))
    return names == sorted(os.listdir(b)) and all(filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False) for n in names)


def convert(args, src: str, dst: str, extra: list[str]) -> float:
    """One whole ``quantize convert`` process; returns its wall seconds."""
    shutil.rmtree(dst, ignore_errors=True)
    cmd = [sys.executable, "-m", "quantize_cli", "convert", src, "-o", dst, "--algo", args.algo, "--device", args.device,
           "--max-shard-size", args.max_shard_size, "-q", *extra]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    return time.perf_counter() - t


def ray_head(args, workers: int) -> str:
    """Start a fresh Ray head with `workers` CPUs (or GPUs); returns its address."""
    res = ["--num-gpus", str(workers), "--num-cpus", str(max(workers, os.cpu_count() or 1))] if args.device.startswith("cuda") \
        else ["--num-cpus", str(workers), "--num-gpus", "0"]
    subprocess.run([RAY, "stop", "--force"], capture_output=True)
    subprocess.run([RAY, "start", "--head", f"--port={PORT}", "--include-dashboard=false", *res], check=True, capture_output=True)
    return f"127.0.0.1:{PORT}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/quantize-ray-bench")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--algo", default="FP8_PB_WO")
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", default="1,2", help="Ray worker counts (CPUs, or GPUs with --device cuda)")
    p.add_argument("--max-shard-size", default="100MB")
    p.add_argument("--repeat", type=int, default=1, help="runs per configuration (the fastest is reported)")
    p.add_argument("--json")
    args = p.parse_args()
    # The benchmark's head and its drivers run on this machine only: no token authentication, so
    # `ray start` and the drivers agree whatever ~/.ray/auth_token holds.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    from e2e import du, make_checkpoint

    src = os.path.join(args.workdir, "src")
    make_checkpoint(src, args.layers, args.vocab, "cpu")
    gb = du(src) / 1e9
    subprocess.run(["cat"] + [os.path.join(src, f) for f in os.listdir(src)], stdout=subprocess.DEVNULL, check=True)  # warm cache
    rows = []
    ref = os.path.join(args.workdir, "out-local")

    def record(name: str, runs: list[float], dst: str) -> None:
        best = min(runs)
        same = True if dst == ref else same_tree(dst, ref)
        rows.append({"run": name, "seconds": round(best, 2), "input_gb_per_s": round(gb / best, 3), "identical": same,
                     "load": os.getloadavg()[0]})
        print(f"{name}: {best:.2f} s, {gb / best:.3f} GB/s, identical to local: {same}, load {os.getloadavg()[0]:.1f}", flush=True)

    record("local", [convert(args, src, ref, ["--executor", "local"]) for _ in range(args.repeat)], ref)
    try:
        for n in [int(w) for w in args.workers.split(",")]:
            address = ray_head(args, n)
            dst = os.path.join(args.workdir, f"out-ray-{n}")
            record(f"ray-{n}", [convert(args, src, dst, ["--executor", "ray", "--ray-address", address]) for _ in range(args.repeat)], dst)
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True)
    env_free = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    dst = os.path.join(args.workdir, "out-ray-auto")
    runs = []
    for _ in range(args.repeat):
        shutil.rmtree(dst, ignore_errors=True)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "quantize_cli", "convert", src, "-o", dst, "--algo", args.algo, "--device", args.device,
                        "--max-shard-size", args.max_shard_size, "-q", "--executor", "ray"], check=True, cwd=ROOT, env=env_free)
        runs.append(time.perf_counter() - t)
    record(f"ray-auto ({os.cpu_count()} CPUs, starts Ray)", runs, dst)
    print(f"\ninput {gb:.2f} GB bf16, --algo {args.algo}, --device {args.device}, --max-shard-size {args.max_shard_size}, "
          f"{os.cpu_count()} CPUs\n")
    print("| run | seconds | input GB/s | identical | load (1 min) |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['seconds']} | {r['input_gb_per_s']} | {r['identical']} | {r['load']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"input_gb": gb, "args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
