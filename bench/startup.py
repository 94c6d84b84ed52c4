"""The fixed cost of a ``quantize convert`` process, in parts, cold and warm.

A user times the whole command. Before the first byte is converted a fresh process pays for the
Python start, importing torch (and with it the CUDA libraries it links), creating the CUDA
context and loading the Triton kernels; none of it depends on the model. This script times each
step in its own fresh process, so the parts add up to what ``bench/e2e.py`` sees as the gap
between the whole command and the in-process time:

- ``python``: the interpreter alone (``python -c pass``);
- ``import torch``;
- ``torch + CUDA context``: import torch and create the context (``torch.zeros(1, device="cuda")``);
- ``quantize --help``: the CLI's own import path (must not import torch);
- ``quantize convert (tiny)``: the whole command on the embedded 2-layer example, i.e. the fixed
  cost with almost no bytes to move (start-up, plan, kernels' first launch, write, fsync).

Cold = page cache dropped before each run (needs root), so the torch and CUDA libraries are read
from disk, as on a freshly started CI machine; warm = the same command run just before. Each cell
is the median of ``--repeat`` runs. Prints a markdown table; ``--json`` saves the numbers.

    python bench/startup.py --json /tmp/startup.json            # GPU machine, as root
    python bench/startup.py --phases warm --device cpu           # anywhere
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proc  # noqa: E402  (bench/proc.py: every command with a timeout)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def steps(device: str, out: str) -> dict[str, list[str]]:
    py = sys.executable
    cuda = "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"
    convert = [py, "-m", "quantize_cli", "convert", "example:tiny-llama", "-o", out, "--algo", "NVFP4",
               "--device", device, "--overwrite", "-q"]
    s = {"python": [py, "-c", "pass"], "import torch": [py, "-c", "import torch"]}
    if device != "cpu":
        s["torch + CUDA context"] = [py, "-c", cuda]
    s["quantize --help"] = [py, "-m", "quantize_cli", "--help"]
    s["quantize convert (tiny)"] = convert
    return s


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def timed(cmd: list[str], cold: bool) -> float:
    if cold:
        drop_caches()
    t = time.perf_counter()
    proc.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--phases", default="cold,warm")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for phase in a.phases.split(","):
            for name, cmd in steps(a.device, os.path.join(tmp, "out")).items():
                if phase == "warm":
                    timed(cmd, cold=False)  # the warm-up run
                runs = [timed(cmd, cold=phase == "cold") for _ in range(a.repeat)]
                rows.append({"phase": phase, "step": name, "median_s": statistics.median(runs), "runs_s": runs})
    print("| phase | step | median s | runs s |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['phase']} | {r['step']} | {r['median_s']:.2f} | {', '.join(f'{x:.2f}' for x in r['runs_s'])} |")
    if a.json:
        import platform

        meta = {"python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
        try:
            import torch

            meta.update(torch=torch.__version__, gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None)
        except ImportError:
            pass
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
