"""What the start-up warm-up (``quantize_cli/prefetch.py``) buys a cold ``quantize convert``.

The whole command, as a user runs it, on a cold page cache (dropped before every run: needs
root), with the warm-up off (``prefetch.start`` replaced by a no-op in the same entry point) and
on, alternating off/on so drift hits both alike; median per side and the pairwise ratio. Each
"on" run's report gives ``bytes.warmed_before_start``.

    python bench/warmup.py --src /tmp/quantize-e2e/src --device cuda --algo NVFP4 --pairs 3
    python bench/warmup.py --src /tmp/cpu-src --device cpu --algo FP8_PB_WO       # 2-core dev box

``--src`` defaults to a checkpoint made with ``bench/e2e.make_checkpoint`` (``--layers``,
Llama-8B-shaped) when the folder has no config.json yet.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proc  # noqa: E402  (bench/proc.py: every command with a timeout)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OFF = "import quantize_cli.run.prefetch as p; p.start = lambda src: None; "
ENTRY = "from quantize_cli.cli import main; main()"


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def run(side: str, a, out: str, report: str) -> tuple[float, int]:
    cmd = [sys.executable, "-c", (OFF if side == "off" else "") + ENTRY, "convert", a.src, "-o", out, "--algo", a.algo,
           "--device", a.device, "--overwrite", "--quiet", "--report", report]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    drop_caches()
    t = time.perf_counter()
    proc.run(cmd, check=True, env=env)
    secs = time.perf_counter() - t
    with open(report) as f:
        warmed = json.load(f)["bytes"].get("warmed_before_start", 0)
    return secs, warmed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default="/tmp/quantize-e2e/src")
    p.add_argument("--layers", type=int, default=16, help="layers of the checkpoint made when --src has none")
    p.add_argument("--device", default="cuda")
    p.add_argument("--algo", default="FP8_PB_WO")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--json", help="save the figures here")
    a = p.parse_args()
    if not os.path.exists(os.path.join(a.src, "config.json")):
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        from e2e import make_checkpoint

        make_checkpoint(a.src, a.layers, 128256, "cuda" if a.device.startswith("cuda") else "cpu")
    work = tempfile.mkdtemp(prefix="quantize-warmup-")
    times: dict[str, list[float]] = {"off": [], "on": []}
    warmed = []
    try:
        for _ in range(a.pairs):
            for side in ("off", "on"):
                secs, w = run(side, a, os.path.join(work, "out"), os.path.join(work, "r.json"))
                times[side].append(secs)
                if side == "on":
                    warmed.append(w)
                print(f"{side:3s} {secs:7.2f} s  warmed {w / 1e9:.2f} GB", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = [on / off for off, on in zip(times["off"], times["on"])]
    res = {"src": a.src, "device": a.device, "algo": a.algo, "pairs": a.pairs, "seconds": times, "warmed_bytes": warmed,
           "median_off_s": statistics.median(times["off"]), "median_on_s": statistics.median(times["on"]),
           "median_ratio_on_off": statistics.median(ratios)}
    print(f"cold whole command: off {res['median_off_s']:.2f} s, on {res['median_on_s']:.2f} s, "
          f"on/off {res['median_ratio_on_off']:.3f} (median of {a.pairs} pairs)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
