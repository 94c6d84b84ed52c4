"""How long a process takes to go away after ``os._exit`` with a CUDA context and pinned host memory
(issue 34: the seconds between a conversion's last write and the end of the command).

    python bench/teardown.py --gb 0 4 8 [--blocks-mb 64] [--env PYTORCH_CUDA_ALLOC_CONF=...]

For each size, a child imports torch, creates the context, pins that many GB in blocks (as the
pipeline's buffers are), touches them, prints READY and calls os._exit(0); the parent times READY ->
reaped. Median of ``--repeat``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import os, sys, torch
gb, mb = float(sys.argv[1]), int(sys.argv[2])
torch.empty(1, device="cuda")
keep = []
n = int(gb * 1024 / mb) if gb > 0 else 0
for _ in range(n):
    t = torch.empty(mb << 20, dtype=torch.uint8, pin_memory=True)
    t.fill_(1)
    keep.append(t)
torch.cuda.synchronize()
print("READY", flush=True)
os._exit(0)
"""


def once(gb: float, mb: int, env: dict) -> tuple[float, float]:
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(gb), str(mb)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, **env})
    line = p.stdout.readline()
    t_ready = time.perf_counter()
    assert line.strip() == "READY", line
    p.wait()
    return t_ready - t0, time.perf_counter() - t_ready


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--gb", type=float, nargs="+", default=[0, 4])
    a.add_argument("--blocks-mb", type=int, default=64)
    a.add_argument("--repeat", type=int, default=3)
    a.add_argument("--env", action="append", default=[], help="NAME=VALUE for the child")
    args = a.parse_args()
    env = dict(e.split("=", 1) for e in args.env)
    for gb in args.gb:
        runs = [once(gb, args.blocks_mb, env) for _ in range(args.repeat)]
        up = statistics.median(r[0] for r in runs)
        down = statistics.median(r[1] for r in runs)
        print(f"pinned {gb:g} GB in {args.blocks_mb} MB blocks {env or ''}: start+pin {up:.2f} s, "
              f"os._exit -> reaped {down:.2f} s (runs: {', '.join(f'{r[1]:.2f}' for r in runs)})", flush=True)


if __name__ == "__main__":
    main()
