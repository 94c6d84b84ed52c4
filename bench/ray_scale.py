"""Scale-out benchmark: ``quantize convert --executor local`` vs ``--executor ray`` with 1..N workers.

Each run is a whole ``quantize convert`` process, timed from start to exit (plan, conversion,
fsync, metadata, rename), on the same synthetic bf16 checkpoint (bench/e2e.py's Llama-8B-shaped
layers; ``--layers 2 --vocab 32000`` is ~1.5 GB). For ``ray-N`` a Ray head with N workers (N CPUs,
or N GPUs with ``--device cuda``) is started first (not timed, as a running cluster would be) and
the command joins it with ``--ray-address``; ``ray-auto`` times the command
that starts its own local instance (the one-machine default), so its startup cost is included.
The output shards are kept small (``--max-shard-size``) so that there are enough tasks to share.

Every output is compared byte for byte with the local one. Prints a markdown table and the load.
Every command runs with a timeout (``--timeout``, bench/proc.py); the Ray head's output goes to a
log file in the work folder (a pipe nobody reads blocks the head once it is full).

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

import proc  # noqa: E402


def same_tree(a: str, b: str) -> bool:
    names = sorted(os.listdir(a))
    return names == sorted(os.listdir(b)) and all(filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False) for n in names)


def convert(args, src: str, dst: str, extra: list[str]) -> float:
    """One whole ``quantize convert`` process; returns its wall seconds."""
    shutil.rmtree(dst, ignore_errors=True)
    cmd = [sys.executable, "-m", "quantize_cli", "convert", src, "-o", dst, "--algo", args.algo, "--device", args.device,
           "--max-shard-size", args.max_shard_size, "-q", "--report", dst + ".json", *extra]
    t = time.perf_counter()
    proc.run(cmd, timeout=args.timeout, check=True, cwd=ROOT)
    return time.perf_counter() - t


_HEAD = """
import os, sys, time, ray
ray.init(address="local", num_cpus=int(sys.argv[1]), num_gpus=int(sys.argv[2]), include_dashboard=False)
with open(sys.argv[3] + ".tmp", "w") as f:
    f.write(ray.get_runtime_context().gcs_address)
os.replace(sys.argv[3] + ".tmp", sys.argv[3])
try:
    while True:
        time.sleep(60)
except KeyboardInterrupt:  # the benchmark stops this head with SIGINT: ray.shutdown() runs at exit
    pass
"""


def ray_head(args, workers: int) -> tuple[subprocess.Popen, str]:
    """A fresh Ray head with `workers` CPUs (or GPUs), owned by a child process (stopped with
    SIGINT: its ray.shutdown stops that cluster and nothing else). Its output goes to a log file;
    its address comes back in a file. Returns it and its address."""
    gpus = workers if args.device.startswith("cuda") else 0
    cpus = max(workers, os.cpu_count() or 1) if gpus else workers
    where = os.path.join(args.workdir, f"head-{workers}.address")
    if os.path.exists(where):
        os.unlink(where)
    head = proc.start([sys.executable, "-c", _HEAD, str(cpus), str(gpus), where], os.path.join(args.workdir, "ray-head.log"))
    deadline = time.monotonic() + args.timeout
    while not os.path.exists(where):
        if head.poll() is not None or time.monotonic() > deadline:
            proc.stop(head)
            raise RuntimeError(f"the Ray head did not start; see {args.workdir}/ray-head.log")
        time.sleep(0.2)
    with open(where) as f:
        return head, f.read().strip()


def stop(head: subprocess.Popen) -> None:
    proc.stop(head)


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
    p.add_argument("--timeout", type=float, default=proc.TIMEOUT_S, help="seconds any one command may take")
    args = p.parse_args()
    # Ray >= 2.5x starts new clusters with token authentication, but a driver joining by address
    # sends the token only in token mode: the head and every command run in it.
    os.environ.setdefault("RAY_AUTH_MODE", "token")

    from e2e import du, make_checkpoint

    src = os.path.join(args.workdir, "src")
    make_checkpoint(src, args.layers, args.vocab, "cpu")
    gb = du(src) / 1e9
    proc.run(["cat"] + [os.path.join(src, f) for f in os.listdir(src)], timeout=args.timeout, stdout=subprocess.DEVNULL,
             check=True)  # warm cache
    rows = []
    ref = os.path.join(args.workdir, "out-local")

    def record(name: str, runs: list[float], dst: str) -> None:
        best = min(runs)
        same = True if dst == ref else same_tree(dst, ref)
        with open(dst + ".json") as f:
            rep = json.load(f)
        # Busy: the shard tasks' seconds added up, over the whole command's (the last run's): how
        # many tasks ran at once on average, Ray's start-up and the driver's own work included.
        tasks = sum(t["seconds"] for t in (rep.get("ray") or {}).get("shards", []))
        busy = round(tasks / runs[-1], 2) if tasks else None
        rows.append({"run": name, "seconds": round(best, 2), "input_gb_per_s": round(gb / best, 3), "identical": same,
                     "tasks_busy": busy, "load": os.getloadavg()[0]})
        print(f"{name}: {best:.2f} s, {gb / best:.3f} GB/s, identical to local: {same}, tasks busy {busy}, "
              f"load {os.getloadavg()[0]:.1f}", flush=True)

    record("local", [convert(args, src, ref, ["--executor", "local"]) for _ in range(args.repeat)], ref)
    for n in [int(w) for w in args.workers.split(",")]:
        head, address = ray_head(args, n)
        try:
            dst = os.path.join(args.workdir, f"out-ray-{n}")
            record(f"ray-{n}", [convert(args, src, dst, ["--executor", "ray", "--ray-address", address]) for _ in range(args.repeat)], dst)
        finally:
            stop(head)
    env_free = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    dst = os.path.join(args.workdir, "out-ray-auto")
    runs = []
    for _ in range(args.repeat):
        shutil.rmtree(dst, ignore_errors=True)
        t = time.perf_counter()
        proc.run([sys.executable, "-m", "quantize_cli", "convert", src, "-o", dst, "--algo", args.algo, "--device", args.device,
                  "--max-shard-size", args.max_shard_size, "-q", "--executor", "ray", "--report", dst + ".json"],
                 timeout=args.timeout, check=True, cwd=ROOT, env=env_free)
        runs.append(time.perf_counter() - t)
    record(f"ray-auto ({os.cpu_count()} CPUs, starts Ray)", runs, dst)
    print(f"\ninput {gb:.2f} GB bf16, --algo {args.algo}, --device {args.device}, --max-shard-size {args.max_shard_size}, "
          f"{os.cpu_count()} CPUs\n")
    print("| run | seconds | input GB/s | identical | tasks busy | load (1 min) |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['seconds']} | {r['input_gb_per_s']} | {r['identical']} | {r['tasks_busy'] or '-'} | {r['load']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"input_gb": gb, "args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
