"""Scale-out on one multi-GPU machine, in one call: Ray with 1 GPU vs local, 1 vs N GPUs, DST in memory and on disk.

Whole commands, as a user types them (``python -m quantize_cli convert ...``, start-up included),
on bench/e2e.py's Llama-8B-shaped inputs (``big``: 16 layers, vocab 128256, 9.08 GB; ``small``: 2
layers, vocab 32000, 1.40 GB), made once in ``--workdir`` and read from the page cache (warm: each
input is read once first). For each algorithm (``--algos ALGO:SHARD,...``):

- ``small`` and ``big``, DST on disk: ``local`` (``--device cuda:0``) and ``ray-1`` (``--executor
  ray --device cuda`` with ``CUDA_VISIBLE_DEVICES=0``: the local Ray instance it starts has one GPU);
- ``big``, DST on disk and DST in ``/dev/shm`` (the disk out of the way, to show the executors'
  own scaling): ``local``, ``ray-1``, and for each N of ``--gpus`` above 1 (default: every GPU)
  ``ray-N`` (``CUDA_VISIBLE_DEVICES=0..N-1``: Ray's instance has N GPUs) and ``local-N``
  (``--device cuda:0,...,cuda:N-1``: one pipeline per GPU in one process); an N above the
  machine's GPU count is skipped with a note;
- ``big``, DST on disk: ``ray-1 joined``: the command joins a Ray head with one GPU started
  beforehand (``--ray-address``, as with a running cluster), so Ray's own start is not in its time.

Every output is compared with the ``local`` output of the same input and algorithm (xxh3 of every
file but the model card) and deleted once hashed. Per run: wall seconds, input GB/s, the report's
``plan_s`` (the driver's start: for local, importing torch is most of it), ``convert_s``, and for
Ray its start (``connect_s``: Ray joined/started; ``ready_s``: every worker probed and holding the
plan; ``warm_s``: a worker's torch + CUDA context + Triton import). Prints a markdown table
after each run and at the end; ``--json`` keeps everything. About 6 minutes on 2x H100 for the
default two algorithms (the inputs are made first: about a minute).

    python bench/scale_gpu.py --workdir /root/quantize-scale --json /root/scale.json
    python bench/scale_gpu.py --algos FP8_PB_WO:1GB --skip small        # quicker
    python bench/scale_gpu.py --gpus 1 2 4 8                             # 1, 2, 4 and 8 GPUs
    python bench/scale_gpu.py --cpu --inputs big=1x4000,small=1x1000 --algos FP8_PB_WO:20MB   # a smoke test without GPU
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

T0 = time.monotonic()  # --deadline counts from here

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import proc  # noqa: E402

# Reads the command's peak RSS (this wrapper imports nothing heavy; the command is its only child).
_WRAP = r"""
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:]).returncode
print("RSS_KB", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True)
sys.exit(rc)
"""


def ray_head(a, env: dict):
    """A Ray head with one GPU (``CUDA_VISIBLE_DEVICES=0``), its output in a log file; (process, address)."""
    where = os.path.join(a.workdir, "head.address")
    if os.path.exists(where):
        os.unlink(where)
    head = proc.start([sys.executable, os.path.join(ROOT, "bench", "ray_head.py"), where, "--gpus", "0" if a.cpu else "1"],
                      os.path.join(a.workdir, "ray-head.log"),
                      env={**env, "CUDA_VISIBLE_DEVICES": "0"})
    deadline = time.monotonic() + min(a.timeout, 120)
    while not os.path.exists(where):
        if head.poll() is not None or time.monotonic() > deadline:
            proc.stop(head, timeout=20)
            print(f"the Ray head did not start (see {a.workdir}/ray-head.log): no 'joined' runs", flush=True)
            return None, None
        time.sleep(0.2)
    with open(where) as f:
        return head, f.read().strip()


def digests(folder: str) -> dict[str, str]:
    """xxh3 of every file of an output but the model card and hidden bookkeeping."""
    import xxhash

    out = {}
    for name in sorted(os.listdir(folder)):
        if name == "README.md" or name.startswith("."):
            continue
        h = xxhash.xxh3_64()
        with open(os.path.join(folder, name), "rb") as f:
            while block := f.read(64 << 20):
                h.update(block)
        out[name] = h.hexdigest()
    return out


class Bench:
    def __init__(self, a, meta: dict):
        self.a, self.meta = a, meta
        self.rows: list[dict] = []
        self.ref: dict[tuple, dict] = {}
        self.env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.env.pop("RAY_ADDRESS", None)  # Ray runs start their own local instance, as a user's one-machine run does
        self.env.setdefault("RAY_AUTH_MODE", "token")  # a driver joining a Ray >= 2.5x head by address sends its token only so

    def run(self, name: str, size: str, src: str, algo: str, shard: str, where: str, args: list[str], env: dict | None = None) -> None:
        root = self.a.shm if where == "shm" else os.path.join(self.a.workdir, "out")
        dst, report = os.path.join(root, f"{size}-{algo}-{name}"), os.path.join(self.a.workdir, "report.json")
        shutil.rmtree(dst, ignore_errors=True)
        os.makedirs(root, exist_ok=True)
        cmd = [sys.executable, "-c", _WRAP, sys.executable, "-m", "quantize_cli", "convert", src, "-o", dst, "--algo", algo,
               "--max-shard-size", shard, "-q", "--report", report, *args]
        row = {"input": size, "algo": algo, "shard": shard, "run": name, "dst": where, "ok": False}
        left = self.a.deadline - (time.monotonic() - T0)
        if left < self.a.min_run_s:  # the whole call must end inside the device tool's limit, table printed
            row["error"] = [f"skipped: {left:.0f} s left of --deadline {self.a.deadline:.0f}"]
            self.emit(row)
            return
        t = time.perf_counter()
        try:
            p = proc.run(cmd, timeout=min(self.a.timeout, left), capture_output=True, text=True, cwd=ROOT, env={**self.env, **(env or {})})
        except subprocess.TimeoutExpired:
            row.update(wall_s=round(time.perf_counter() - t, 2), error=[f"timed out after {min(self.a.timeout, left):.0f} s"])
            self.emit(row)
            return
        wall = time.perf_counter() - t
        row.update(wall_s=round(wall, 2), ok=p.returncode == 0)
        if p.returncode:
            row["error"] = (p.stderr or "").strip().splitlines()[-1:] or [f"exit {p.returncode}"]
            self.emit(row)
            return
        with open(report) as f:
            rep = json.load(f)
        gb = rep["bytes"]["in"] / 1e9
        start = (rep.get("ray") or {}).get("start_s") or {}
        workers = (rep.get("ray") or {}).get("workers") or []
        row.update(gb_in=round(gb, 2), gb_per_s=round(gb / wall, 2), plan_s=round(rep["timings_s"]["plan_s"], 2),
                   convert_s=round(rep["timings_s"]["convert_s"], 2), rss_gb=round(int(p.stdout.split("RSS_KB")[-1]) * 1024 / 1e9, 2),
                   connect_s=start.get("connect_s"), ready_s=start.get("workers_ready_s"),
                   warm_s=max((w.get("warm_s") or 0 for w in workers), default=None) if workers else None,
                   workers=len(workers) or None)
        got = digests(dst)
        key = (size, algo)
        if name == "local" and where == "disk":
            self.ref[key] = got
        row["identical"] = got == self.ref.get(key) if key in self.ref else None
        shutil.rmtree(dst, ignore_errors=True)  # /dev/shm is memory; the disk is not endless either
        self.emit(row)

    def emit(self, row: dict) -> None:
        self.rows.append(row)
        print(_line(row), flush=True)
        self.save()

    def save(self) -> None:
        """--json after every row: what was measured comes back even if the call is cut short."""
        if self.a.json:
            with open(self.a.json + ".tmp", "w") as f:
                json.dump({"meta": self.meta, "rows": self.rows}, f, indent=1)
            os.replace(self.a.json + ".tmp", self.a.json)


HEADER = ("| input | algo | shard | run | DST | wall s | input GB/s | plan s | convert s | Ray connect / ready s | worker warm s "
          "| peak RSS GB (driver) | identical |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def _line(r: dict) -> str:
    if not r.get("ok"):
        return f"| {r['input']} | {r['algo']} | {r['shard']} | {r['run']} | {r['dst']} | failed: {r.get('error')} |"
    ray = f"{r['connect_s']} / {r['ready_s']}" if r.get("connect_s") is not None else "-"
    return (f"| {r['input']} | {r['algo']} | {r['shard']} | {r['run']} | {r['dst']} | {r['wall_s']} | {r['gb_per_s']} | {r['plan_s']} "
            f"| {r['convert_s']} | {ray} | {r.get('warm_s') or '-'} | {r['rss_gb']} | {r['identical']} |")


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/root/quantize-scale", help="the inputs and the on-disk outputs (the machine's disk)")
    ap.add_argument("--shm", default="/dev/shm/quantize-scale", help="where in-memory outputs go")
    ap.add_argument("--algos", default="FP8_PB_WO:1GB,NVFP4:2GB", help="ALGO:MAX_SHARD_SIZE, comma-separated")
    ap.add_argument("--skip", default="", help="comma-separated: small, disk, shm, joined, or a run's name (local-4, ray-2)")
    ap.add_argument("--gpus", type=int, nargs="+", help="GPU counts to run (default: 1 and every GPU); 1 is local / ray-1")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one command may take")
    ap.add_argument("--inputs", default="big=16x128256,small=2x32000", help="NAME=LAYERSxVOCAB of bench/e2e.py's checkpoint")
    ap.add_argument("--cpu", action="store_true", help="CPU stand-ins (cpu, cpu,cpu, Ray --device cpu): to try the script")
    ap.add_argument("--deadline", type=float, default=520,
                    help="seconds for the whole call: no run starts after it, a run is cut at it (the device tool stops a call at 600 s)")
    ap.add_argument("--min-run-s", type=float, default=25, help="a run starts only with at least this many seconds left")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.gpus is not None and any(n < 1 for n in a.gpus):
        ap.error(f"--gpus {' '.join(map(str, a.gpus))}: GPU counts are positive")
    return a


def multi_runs(wanted: list[int] | None, available: int, cpu: bool, skip=()) -> list[tuple[str, list[str], dict | None]]:
    """The runs on N > 1 devices, named by their real N: (name, convert's device options, env or None).
    `wanted`: --gpus (None: every GPU); counts above `available` are said and skipped."""
    runs = []
    for n in sorted(set(wanted if wanted is not None else [available])):
        if n < 2:
            continue
        if n > available:
            print(f"--gpus {n}: this machine has {available}; skipped", flush=True)
            continue
        devs = ",".join(["cpu"] * n) if cpu else ",".join(f"cuda:{i}" for i in range(n))
        visible = None if cpu else {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(n)))}
        if f"ray-{n}" not in skip:
            runs.append((f"ray-{n}", ["--executor", "ray", "--device", "cpu" if cpu else "cuda"], visible))
        if f"local-{n}" not in skip:
            runs.append((f"local-{n}", ["--device", devs], None))
    return runs


def main(argv=None) -> None:
    a = parse(argv)
    skip = set(filter(None, a.skip.split(",")))

    import torch

    from e2e import make_checkpoint

    gpus = (max(a.gpus or [2])) if a.cpu else torch.cuda.device_count()
    inputs = {k: tuple(map(int, v.split("x"))) for k, v in (i.split("=") for i in a.inputs.split(","))}
    srcs = {}
    for size, (layers, vocab) in inputs.items():
        if size in skip:
            continue
        srcs[size] = os.path.join(a.workdir, f"src-{size}")
        t = time.perf_counter()
        make_checkpoint(srcs[size], layers, vocab, "cuda" if torch.cuda.is_available() else "cpu")
        print(f"input {size}: {srcs[size]} ready in {time.perf_counter() - t:.1f} s", flush=True)
        proc.run(f"cat {srcs[size]}/*.safetensors > /dev/null", shell=True, check=True, timeout=a.timeout)  # warm
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None, "gpus": gpus,
            "cpus": os.cpu_count(), "torch": torch.__version__, "python": sys.version.split()[0]}
    try:
        import ray
        import triton

        meta.update(ray=ray.__version__, triton=triton.__version__)
    except ImportError as exc:
        meta["missing"] = str(exc)
    if "shm" not in skip:
        need = 0.7 * _bytes(srcs.get("big")) + (1 << 30)  # the largest output (FP8: about half the bf16 input) and slack
        os.makedirs(a.shm, exist_ok=True)
        free = shutil.disk_usage(a.shm).free
        meta["shm_free_gb"] = round(free / 1e9, 1)
        if free < need:
            print(f"{a.shm}: {free / 1e9:.1f} GB free, {need / 1e9:.1f} GB needed: no DST-in-memory runs", flush=True)
            skip.add("shm")
    print(json.dumps(meta), flush=True)
    b = Bench(a, meta)
    head, address = (None, None) if "joined" in skip else ray_head(a, b.env)
    print(HEADER, flush=True)
    if a.cpu:  # Ray's local instance with one worker (4 CPUs), or as many as the CPUs give
        dev1, ray_dev, one = "cpu", "cpu", {"QUANTIZE_BENCH_NOTE": "cpu"}
    else:
        dev1, ray_dev, one = "cuda:0", "cuda", {"CUDA_VISIBLE_DEVICES": "0"}
    multi = multi_runs(a.gpus, gpus, a.cpu, skip)
    for spec in a.algos.split(","):
        algo, shard = spec.split(":")
        if "small" in srcs:
            b.run("local", "small", srcs["small"], algo, shard, "disk", ["--device", dev1])
            b.run("ray-1", "small", srcs["small"], algo, shard, "disk", ["--executor", "ray", "--device", ray_dev], one)
        for where in ("disk", "shm"):
            if where in skip or "big" not in srcs:
                continue
            b.run("local", "big", srcs["big"], algo, shard, where, ["--device", dev1])
            b.run("ray-1", "big", srcs["big"], algo, shard, where, ["--executor", "ray", "--device", ray_dev], one)
            for name, options, env in multi:
                b.run(name, "big", srcs["big"], algo, shard, where, options, env)
            if where == "disk" and address:
                b.run("ray-1 joined", "big", srcs["big"], algo, shard, where,
                      ["--executor", "ray", "--device", ray_dev, "--ray-address", address])
    if head is not None:
        proc.stop(head, timeout=20)
    shutil.rmtree(a.shm, ignore_errors=True)
    print("\n" + json.dumps(meta) + "\n\n" + HEADER)
    for r in b.rows:
        print(_line(r))
    b.save()
    print(f"\n{time.monotonic() - T0:.0f} s in all", flush=True)


def _bytes(folder: str | None) -> int:
    if not folder:
        return 0
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder) if n.endswith(".safetensors"))


if __name__ == "__main__":
    main()
