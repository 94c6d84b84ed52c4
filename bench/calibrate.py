"""Calibration benchmark: time and peak GPU / host memory of ``quantize calibrate`` on the
Llama-3-8B-shaped synthetic checkpoint that ``bench/e2e.py`` makes (H 4096, I 14336, random bf16
weights), with N x L random token ids (seed 0; the synthetic checkpoint has no tokenizer).

The calibration runs in a fresh process, so its peak RSS (VmHWM) and peak GPU memory
(``torch.cuda.max_memory_allocated``) are its own. Prints one JSON line; ``--json`` saves it.

    python bench/calibrate.py --json /tmp/calib.json                        # GPU machine: 16 layers, 128 x 512
    python bench/calibrate.py --layers 32 --json /tmp/calib32.json          # the full 8B depth
    python bench/calibrate.py --offload --json /tmp/calib-offload.json      # hidden states in pinned host memory
    python bench/calibrate.py --device cpu --layers 1 --vocab 32000 --samples 2 --seq-len 64   # smoke test
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
import json, sys, time
t0 = time.perf_counter()
src, data, out, device, samples, seq_len, budget, offload = sys.argv[1:9]
import torch
import quantize_cli.calibration as calib
from quantize_cli.api import calibrate
if offload == "1":  # force the hidden states to pinned host memory between blocks (the path taken when they are large)
    decide = calib.offload_decision
    calib.offload_decision = lambda dev, nbytes, budget, forced: decide(dev, nbytes, budget, True)
doc = calibrate(src, calib_data=data, output=out, calib_samples=int(samples), calib_seq_len=int(seq_len),
                device=device, memory_budget=budget, quiet=True)
rss = max(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
gpu = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
print("RESULT " + json.dumps({"wall_s": time.perf_counter() - t0, "calibrate_s": doc.run["seconds"],
      "forward_s": doc.run["forward_seconds"], "blocks": doc.run["blocks"], "tokens": doc.data["tokens"],
      "batches": doc.run["batches"], "activations_on": doc.run["activations_on"],
      "peak_rss_GB": rss / 1e9, "peak_gpu_GB": gpu / 1e9, "device": doc.run["device"],
      "gpu_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
      "torch": torch.__version__, "transformers": doc.run["transformers"]}))
sys.stdout.flush()
import os
os._exit(0)
"""


def main() -> None:
    from e2e import synthetic_args, synthetic_input

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    synthetic_args(p, "/tmp/quantize-e2e", 128)
    p.add_argument("--budget", default="4GB")
    p.add_argument("--offload", action="store_true", help="hidden states in pinned host memory between blocks")
    p.add_argument("--json")
    a = p.parse_args()
    src, data = synthetic_input(a, "calib", 0)
    layer_bytes = 2 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096)
    child = proc.result([sys.executable, "-c", _CHILD, src, data, os.path.join(a.work, "scales.json"), a.device,
                         str(a.samples), str(a.seq_len), a.budget, "1" if a.offload else "0"], "calibration", cwd=ROOT)
    res = {**child, "layers": a.layers, "samples": a.samples, "seq_len": a.seq_len,
           "one_layer_GB": layer_bytes / 1e9, "hidden_states_GB": a.samples * a.seq_len * 4096 * 2 / 1e9,
           "checkpoint_GB": sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src)) / 1e9}
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
