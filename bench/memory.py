"""Peak host memory does not grow with model size: convert a synthetic checkpoint 1x and 4x as
large (same tensor shapes, 4x the layers) and print each whole process's peak RSS.

    python bench/memory.py [--layers 6] [--hidden 2048] [--algo FP8_PB_WO] [--budget 1GB] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proc  # noqa: E402  (bench/proc.py: every command with a timeout)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import json, sys, time

def peak_rss_gb():
    # VmHWM: this process's own peak RSS. (ru_maxrss would include the parent's RSS at fork time.)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e9

t = time.perf_counter()
from quantize_cli.api import ConvertOptions, convert
convert(ConvertOptions(sys.argv[1], sys.argv[2], algo=sys.argv[3], memory_budget=sys.argv[4], device=sys.argv[5], quiet=True))
print("RESULT " + json.dumps({"s": time.perf_counter() - t, "rss_GB": peak_rss_gb()}))
"""


def make(root: str, layers: int, hidden: int) -> int:
    """A Llama-shaped bf16 checkpoint with `layers` layers (one shard per 4 layers)."""
    sys.path.insert(0, ROOT)
    from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors, write_checkpoint

    cfg = llama_config(hidden=hidden, intermediate=4 * hidden, layers=layers, heads=hidden // 128, kv_heads=max(1, hidden // 512), vocab=32000)
    tensors = llama_tensors(cfg)
    write_checkpoint(root, tensors, cfg, shards=max(1, layers // 4), sidecars=False)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--algo", default="FP8_PB_WO")
    p.add_argument("--budget", default="1GB")
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="quantize-mem-")
    rows = []
    try:
        for scale in (1, 4):
            src, dst = os.path.join(work, f"src{scale}"), os.path.join(work, f"dst{scale}")
            size = make(src, a.layers * scale, a.hidden)
            env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
            out = proc.run([sys.executable, "-c", _CHILD, src, dst, a.algo, a.budget, a.device], capture_output=True, text=True, env=env)
            if out.returncode:
                sys.exit(out.stderr)
            r = json.loads(out.stdout.split("RESULT ")[-1])
            rows.append({"scale": scale, "input_GB": size / 1e9, **r})
            shutil.rmtree(src)
            shutil.rmtree(dst)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"algo {a.algo}, --memory-budget {a.budget}, device {a.device} (peak RSS = the converting process's VmHWM)")
    print("| model | input GB | seconds | peak RSS GB |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['scale']}x | {r['input_GB']:.2f} | {r['s']:.1f} | {r['rss_GB']:.2f} |")


if __name__ == "__main__":
    main()
