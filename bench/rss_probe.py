"""Where a conversion's resident memory goes: RSS and torch's pinned-host pool, sampled during a run.

Runs ``api.convert`` in this process (a fresh one) with a sampler thread that records, every
20 ms, the RSS (``VmRSS``), its anonymous part (``RssAnon`` in ``/proc/self/status``:
what is not a mapped library file) and the bytes of the blocks torch's pinned host caching
allocator owns, in use and cached (``torch.cuda.host_memory_stats``). Prints the peaks next to the report's own
``bytes`` (peak in flight, the baseline it measured), so RSS can be split into baseline, bytes in
flight and allocator slack.

    python bench/rss_probe.py SRC --algo FP8_PB_WO --budget 4GB --warm      # GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proc  # noqa: E402  (bench/proc.py: every command with a timeout)


def status_kb(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("--algo", default="FP8_PB_WO")
    ap.add_argument("--budget", default="4GB")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--warm", action="store_true", help="read the input once first (page cache warm)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.warm:
        proc.run(f"cat {a.src}/*.safetensors > /dev/null", shell=True, check=True)
    t0 = time.perf_counter()
    import torch

    from quantize_cli.api import convert
    from quantize_cli.plan.options import ConvertOptions

    samples, stop = [], threading.Event()

    def pinned() -> int:
        """Bytes of pinned blocks torch's host allocator owns (in use + cached)."""
        try:
            return torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
        except Exception:  # no CUDA, or a torch without the call
            return 0

    def sample():
        while not stop.is_set():
            samples.append((time.perf_counter() - t0, status_kb("VmRSS") << 10, status_kb("RssAnon") << 10, pinned()))
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(a.src))) as tmp:
        res = convert(ConvertOptions(a.src, os.path.join(tmp, "out"), algo=a.algo, device=a.device, memory_budget=a.budget, quiet=True))
    stop.set()
    time.sleep(0.05)
    gb = 1e9
    peak = max(samples, key=lambda s: s[1])
    out = {
        "algo": a.algo, "budget": a.budget, "warm": a.warm, "total_s": res.report["timings_s"]["total_s"],
        "report_bytes": res.report["bytes"],
        "peak_rss_GB": peak[1] / gb, "at_peak": {"t_s": peak[0], "rss_anon_GB": peak[2] / gb, "pinned_pool_GB": peak[3] / gb},
        "max_pinned_pool_GB": max(s[3] for s in samples) / gb,
        "vm_hwm_GB": (status_kb("VmHWM") << 10) / gb,
        "timeline": [(round(t, 2), round(r / gb, 2), round(an / gb, 2), round(p / gb, 2))
                     for t, r, an, p in samples[:: max(1, len(samples) // 40)]],
    }
    print(json.dumps({k: v for k, v in out.items() if k != "timeline"}, indent=1))
    print("t_s, rss, rss_anon, pinned_pool (GB):", out["timeline"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
