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
import random
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
    from e2e import make_checkpoint

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/tmp/quantize-e2e")
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--samples", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--budget", default="4GB")
    p.add_argument("--offload", action="store_true", help="hidden states in pinned host memory between blocks")
    p.add_argument("--json")
    a = p.parse_args()
    src = os.path.join(a.work, f"src-l{a.layers}-v{a.vocab}")
    make_checkpoint(src, a.layers, a.vocab, a.device)
    data = os.path.join(a.work, f"calib-{a.samples}x{a.seq_len}.jsonl")
    rng = random.Random(0)
    with open(data, "w") as f:
        for _ in range(a.samples):
            f.write(json.dumps({"input_ids": [rng.randrange(a.vocab) for _ in range(a.seq_len)]}) + "\n")
    layer_bytes = 2 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096)
    out = proc.run([sys.executable, "-c", _CHILD, src, data, os.path.join(a.work, "scales.json"), a.device,
                    str(a.samples), str(a.seq_len), a.budget, "1" if a.offload else "0"], capture_output=True, text=True, cwd=ROOT)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        sys.exit(f"calibration failed:\n{out.stderr[-3000:]}")
    res = {**json.loads(line[7:]), "layers": a.layers, "samples": a.samples, "seq_len": a.seq_len,
           "one_layer_GB": layer_bytes / 1e9, "hidden_states_GB": a.samples * a.seq_len * 4096 * 2 / 1e9,
           "checkpoint_GB": sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src)) / 1e9}
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
