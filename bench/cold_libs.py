"""How long torch's import takes on a cold page cache, and whether reading its libraries ahead helps.

    python bench/cold_libs.py map --json /tmp/map.json      # what a start-up maps, and how much is read
    python bench/cold_libs.py time --repeat 3 [--map /tmp/map.json] --json F   # needs root (drop_caches)

``map``: a child imports torch, creates the CUDA context and runs one kernel (what convert does before
its first quantized byte); then lists every file mapped into it (/proc/self/maps) with its size and
the bytes of it in the page cache (``mincore``). Run right after dropping the caches, "resident"
is what the start-up read (plus the kernel's read-ahead around it).

``time``: the same child, timed from outside, on a page cache dropped before every run, in turns:
``none`` (as convert starts), ``libs`` (every shared library of torch, the NVIDIA wheels and Triton
advised whole, ``posix_fadvise(WILLNEED)`` from 4 threads, before ``import torch``) and, with ``--map``,
``mapped`` (exactly the files the map saw read, whole). Prints one line per run and the medians.
Result (docs/performance.md, session 11): neither helped, so convert does not do it.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import threading
import time

CHILD = r"""
import os, sys, time, json
t0 = time.perf_counter()
mode, files = {mode!r}, {files!r}
if mode in ("libs", "mapped"):
    sys.path.insert(0, {bench!r})
    import cold_libs
    cold_libs.start(None if mode == "libs" else files)
import torch
t1 = time.perf_counter()
x = torch.ones(1 << 20, device="cuda" if torch.cuda.is_available() else "cpu"); (x * 2).sum().item()
t2 = time.perf_counter()
print(json.dumps({{"import": t1 - t0, "cuda": t2 - t1}}))
"""

MAP_TAIL = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
page = os.sysconf("SC_PAGE_SIZE")
def resident(path):
    size = os.path.getsize(path)
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            return -1
        vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
        rc = libc.mincore(addr, size, vec)
        libc.munmap(addr, size)
        return sum(v & 1 for v in vec) * page if rc == 0 else -1
    finally:
        os.close(fd)
seen = dict.fromkeys(l.split(None, 5)[5].strip() for l in open("/proc/self/maps") if len(l.split(None, 5)) == 6)
rows = [{"path": p, "size": os.path.getsize(p), "resident": resident(p)} for p in seen if p.startswith("/") and os.path.isfile(p)]
print("MAP" + json.dumps(rows))
"""


CHUNK = 32 << 20  # bytes advised per call: small enough that the threads interleave the files
THREADS = 4

_PATTERNS = {  # package -> library globs under it, relative to the package's folder
    "torch": ("lib/*.so*",),
    "nvidia": ("*/lib/*.so*", "*/*/lib/*.so*"),
    "triton": ("_C/*.so*",),
}


def _package_dirs(name: str) -> list[str]:
    """The folders of top-level package `name`, without importing it ([] when absent)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    return list(spec.submodule_search_locations or []) if spec else []


def library_files() -> list[str]:
    """The shared libraries of torch, the NVIDIA wheels and Triton, largest first."""
    files: dict[str, int] = {}
    for pkg, patterns in _PATTERNS.items():
        for root in _package_dirs(pkg):
            for pattern in patterns:
                for path in glob.glob(os.path.join(glob.escape(root), pattern)):
                    try:
                        files.setdefault(os.path.realpath(path), os.path.getsize(path))
                    except OSError:
                        continue
    return sorted(files, key=lambda p: -files[p])


def _advise(queue: list[str], lock: threading.Lock) -> None:
    while True:
        with lock:
            if not queue:
                return
            path = queue.pop(0)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            for off in range(0, size, CHUNK):
                os.posix_fadvise(fd, off, min(CHUNK, size - off), os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


def start(files: list[str] | None = None, threads: int = THREADS) -> list[threading.Thread]:
    """Advise `files` (default :func:`library_files`) on `threads` daemon threads; the threads."""
    if not hasattr(os, "posix_fadvise"):
        return []
    queue, lock = list(library_files() if files is None else files), threading.Lock()
    started = []
    for i in range(min(threads, len(queue))):
        t = threading.Thread(target=_advise, args=(queue, lock), name=f"quantize-libs-{i}", daemon=True)
        t.start()
        started.append(t)
    return started


def drop_caches() -> None:
    subprocess.run(["sync"], check=True, timeout=600)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def child(mode: str, files: list[str], extra: str = "") -> dict:
    code = CHILD.format(bench=os.path.dirname(os.path.abspath(__file__)), mode=mode, files=files) + extra
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(r.stderr[-2000:])
    out = {"wall": wall}
    for line in r.stdout.splitlines():
        if line.startswith("MAP"):
            out["map"] = json.loads(line[3:])
        elif line.startswith("{"):
            out.update(json.loads(line))
    return out


def cmd_map(a) -> None:
    drop_caches()
    res = child("none", [], MAP_TAIL)
    rows = sorted(res.pop("map"), key=lambda r: -r["resident"])
    total = sum(r["size"] for r in rows)
    read = sum(max(r["resident"], 0) for r in rows)
    print(f"cold start {res}: {len(rows)} files mapped, {total / 1e9:.2f} GB, {read / 1e9:.2f} GB of them in the cache")
    for r in rows[:40]:
        print(f"{r['resident'] / 1e6:9.1f} / {r['size'] / 1e6:9.1f} MB  {r['path']}")
    if a.json:
        json.dump({"timing": res, "files": rows}, open(a.json, "w"), indent=1)


def cmd_time(a) -> None:
    files = []
    if a.map:
        files = [r["path"] for r in json.load(open(a.map))["files"] if r["resident"] > 0]
    modes = a.modes.split(",")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for i in range(a.repeat):
        for m in (modes if i % 2 == 0 else modes[::-1]):  # in turns, ABBA
            drop_caches()
            r = child(m, files if m == "mapped" else [])
            runs[m].append(r)
            print(f"{m:7s} wall {r['wall']:.2f} s  import {r['import']:.2f}  cuda {r['cuda']:.2f}", flush=True)
    summary = {m: {k: statistics.median(r[k] for r in rs) for k in ("wall", "import", "cuda")} for m, rs in runs.items()}
    for m, s in summary.items():
        print(f"median {m:7s} wall {s['wall']:.2f} s  import {s['import']:.2f}  cuda {s['cuda']:.2f}")
    if a.json:
        json.dump({"runs": runs, "median": summary}, open(a.json, "w"), indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("map")
    m.add_argument("--json")
    t = sub.add_parser("time")
    t.add_argument("--repeat", type=int, default=3)
    t.add_argument("--modes", default="none,libs")
    t.add_argument("--map")
    t.add_argument("--json")
    a = p.parse_args()
    cmd_map(a) if a.cmd == "map" else cmd_time(a)


if __name__ == "__main__":
    main()
