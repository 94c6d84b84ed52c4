"""``quantize eval`` speed and memory on the GPU: the Llama-3-8B-shaped synthetic checkpoint of
``bench/e2e.py`` (H 4096, I 14336, 16 layers by default, random bf16 weights), converted on the GPU,
then evaluated against its source on N x L random token ids (the checkpoint has no tokenizer).

Each eval runs in a fresh process (its own peak RSS and peak GPU memory). Before it, the same
process reads every tensor of SRC and DST once through the project's reader (page cache warm, as
eval finds it after a conversion): ``read_s``; the issue's budget is the eval's time beyond that.

    python bench/eval_speed.py --json /tmp/eval-speed.json                       # GPU machine: 64 x 512, FP8 and NVFP4
    python bench/eval_speed.py --layers 32 --json /tmp/eval-speed32.json         # the full 8B depth
    python bench/eval_speed.py --device cpu --layers 1 --vocab 32000 --samples 2 --seq-len 64 --algos FP8   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import proc  # noqa: E402  (bench/proc.py: every command with a timeout)

_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
src, dst, data, device, samples, seq_len, weights_only = sys.argv[1:8]
import torch
from quantize_cli.checkpoint.source import open_source
from quantize_cli.checkpoint.safetensors_io import read_tensor
t_read = time.perf_counter()
for path in (src, dst):
    for info in open_source(path, allow_quantized=True).tensors.values():
        read_tensor(info)
read_s = time.perf_counter() - t_read
from quantize_cli.eval import run_eval
t_eval = time.perf_counter()
r = run_eval(dst, source=src, data=data, samples=int(samples), seq_len=int(seq_len), device=device, weights_only=weights_only == "1")
eval_s = time.perf_counter() - t_eval
rss = max(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
gpu = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
print("RESULT " + json.dumps({"eval_s": eval_s, "read_s": read_s, "eval_beyond_read_s": eval_s - read_s,
      "forward_s": r.run["forward_seconds"], "peak_blocks": r.run["peak_blocks_materialized"], "batches": r.run["batches"],
      "positions": r.metrics["positions"], "kl_mean": r.metrics["kl_mean"], "perplexity_increase_pct": r.metrics["perplexity_increase_pct"],
      "peak_rss_GB": rss / 1e9, "peak_gpu_GB": gpu / 1e9, "device": r.run["device"],
      "gpu_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
      "torch": r.run["torch"], "transformers": r.run["transformers"], "process_s": time.perf_counter() - t0}))
sys.stdout.flush()
os._exit(0)
"""


def main() -> None:
    from e2e import synthetic_args, synthetic_input

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    synthetic_args(p, "/tmp/quantize-eval-speed", 64)
    p.add_argument("--algos", default="FP8,NVFP4")
    p.add_argument("--weights-only", action="store_true")
    p.add_argument("--json")
    a = p.parse_args()
    sys.path.insert(0, ROOT)
    from quantize_cli import api

    src, data = synthetic_input(a, "eval", 1)
    results = []
    for algo in a.algos.split(","):
        dst = os.path.join(a.work, f"{algo}-l{a.layers}")
        if not os.path.isdir(dst):
            api.convert(api.ConvertOptions(src, dst, algo=algo, device=a.device, quiet=True))
        child = proc.result([sys.executable, "-c", _CHILD, src, dst, data, a.device, str(a.samples), str(a.seq_len),
                             "1" if a.weights_only else "0"], f"{algo}: eval", cwd=ROOT)
        results.append({"algo": algo, "layers": a.layers, "samples": a.samples, "seq_len": a.seq_len, **child})
        print(json.dumps(results[-1]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
