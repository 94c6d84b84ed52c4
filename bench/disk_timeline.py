"""When the disk is busy during a command (issue 34): the block device's written and read bytes, the
page cache's dirty and writeback bytes, and the command's CPU, sampled every few milliseconds.

    python bench/disk_timeline.py --path DST_DIR --json OUT.json -- quantize convert SRC -o DST ...

A whole command that trails the I/O floor does so where the disk that holds ``--path`` writes less
than it can; this shows when (start-up, steady state, the end). Prints one line per ``--bucket``
seconds: MB the device wrote, MB dirty and under writeback at its end, the command tree's CPU
seconds and MB the device read in it; ``--json`` keeps the raw samples. Linux only (/proc/diskstats, /proc/meminfo).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time


def device_of(path: str) -> str:
    """The /proc/diskstats name of the block device holding `path` (its whole disk when a partition)."""
    st = os.stat(path)
    sysdir = os.path.realpath(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    if not os.path.exists(sysdir):
        raise SystemExit(f"{path}: no block device behind it (tmpfs or overlay on nothing?): pass --device NAME")
    name = os.path.basename(sysdir)
    parent = os.path.basename(os.path.dirname(sysdir))
    return parent if os.path.exists(f"/sys/block/{parent}") else name


def sectors(dev: str) -> tuple[int, int]:
    """(sectors read, sectors written) of `dev` so far."""
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if p[2] == dev:
                return int(p[5]), int(p[9])
    raise SystemExit(f"{dev}: not in /proc/diskstats")


def dirty_kb() -> tuple[int, int]:
    got = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            if k in ("Dirty", "Writeback"):
                got[k] = int(v.split()[0])
    return got["Dirty"], got["Writeback"]


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of `pid` and its live children (utime + stime from /proc; children as far as seen)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / tick


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", required=True, help="a folder on the disk the command writes to")
    p.add_argument("--device", help="the /proc/diskstats name (default: the one holding --path)")
    p.add_argument("--every", type=float, default=0.02)
    p.add_argument("--bucket", type=float, default=0.25)
    p.add_argument("--json")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    dev = a.device or device_of(a.path)
    samples = []
    t0 = time.perf_counter()
    r0, s0 = sectors(dev)
    proc = subprocess.Popen(cmd)
    done = threading.Event()

    def sample():
        while not done.is_set():
            d, w = dirty_kb()
            cpu = max(tree_cpu_s(proc.pid), samples[-1][4] if samples else 0.0)  # 0 once it has exited
            r, w_ = sectors(dev)
            samples.append((time.perf_counter() - t0, (w_ - s0) * 512, d * 1024, w * 1024, cpu, (r - r0) * 512))
            time.sleep(a.every)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    rc = proc.wait()
    t_exit = time.perf_counter() - t0
    os.sync()  # what the command left dirty is part of its cost, as in the floor's conv=fsync
    t_sync = time.perf_counter() - t0
    time.sleep(a.every * 2)
    done.set()
    th.join()
    total = samples[-1][1] if samples else 0
    read = samples[-1][5] if samples else 0
    print(f"device {dev}: command exit {t_exit:.2f} s (rc {rc}), + sync {t_sync:.2f} s, {total / 1e9:.2f} GB written, "
          f"{read / 1e9:.2f} GB read")
    print("  t_end s | MB written | MB/s | dirty MB | writeback MB | cpu s | MB read")
    edge, prev_b, prev_c, prev_r = a.bucket, 0, 0.0, 0
    last = None
    for s in samples + [(float("inf"), 0, 0, 0, 0, 0)]:
        while s[0] > edge and last is not None:
            print(f"  {edge:6.2f} | {(last[1] - prev_b) / 1e6:7.0f} | {(last[1] - prev_b) / 1e6 / a.bucket:6.0f} | "
                  f"{last[2] / 1e6:6.0f} | {last[3] / 1e6:6.0f} | {last[4] - prev_c:5.2f} | {(last[5] - prev_r) / 1e6:6.0f}")
            prev_b, prev_c, prev_r = last[1], last[4], last[5]
            edge += a.bucket
            if edge > samples[-1][0] + a.bucket:
                break
        last = s
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev, "cmd": cmd, "rc": rc, "exit_s": t_exit, "sync_s": t_sync,
                       "samples": samples}, f)
    sys.exit(rc)


if __name__ == "__main__":
    main()
