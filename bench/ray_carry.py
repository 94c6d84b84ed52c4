"""Build `.whl-ray/`: Ray for the GPU machines (CPython 3.12, no Ray, no network), slimmed and
xz-compressed so that it fits a device call's carry (64 MiB for every carried path together; Ray's
cp312 wheel alone is ~79 MB).

    python3 bench/ray_carry.py                  # downloads ray==2.60.0 (docs/performance.md) and its deps
    python3 bench/ray_carry.py --dry-run        # says what it would download and drop
    python3 bench/ray_carry.py --wheel ray-...whl --no-deps   # from a wheel at hand

On the GPU machine (carry .whl-ray; bench/gpu_batch.sh's `scale` step does this):

    python3 .whl-ray/unpack.py && export PYTHONPATH=/tmp/rayenv/site:$PYTHONPATH

What the executor does not need is dropped (DROP: the libraries on top of Ray core, the Java jars,
the dashboard's web UI, tests); the dashboard's Python stays (the raylet starts its agent from it).
Ray's own requirements come as wheels in `deps/`; unpack.py installs only those the machine lacks,
so its own packages win. File modes are kept (the raylet and GCS binaries must stay executable).
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

VERSION = "2.60.0"  # the Ray of docs/performance.md's GPU runs
PYTHON, PLATFORM = "3.12", "manylinux2014_x86_64"
CARRY_LIMIT = 64 << 20  # a device call carries 64 MiB in all
# Paths inside the wheel that --executor ray never imports or runs (checked: Ray 2.60.0's installed tree
# without them starts, runs tasks, and passes tests/test_ray_executor.py's same-bytes tests; `ray.widgets`
# must stay: ray._private.worker imports it).
DROP = ("ray/rllib/", "ray/tune/", "ray/train/", "ray/serve/", "ray/data/", "ray/llm/", "ray/air/", "ray/workflow/",
        "ray/jars/", "ray/dashboard/client/", "ray/cpp/")
DROP_PARTS = ("/tests/", "/__pycache__/")

UNPACK = '''"""Unpack the slimmed Ray (bench/ray_carry.py) into $RAYENV (default /tmp/rayenv/site):
    python3 .whl-ray/unpack.py && export PYTHONPATH=/tmp/rayenv/site:$PYTHONPATH
Ray's requirements (deps/*.whl) are unpacked only where this Python lacks them."""
import glob, importlib.metadata as md, os, re, sys, tarfile, zipfile

here = os.path.dirname(os.path.abspath(__file__))
site = os.environ.get("RAYENV", "/tmp/rayenv/site")
os.makedirs(site, exist_ok=True)
with tarfile.open(os.path.join(here, "ray.tar.xz")) as t:
    t.extractall(site, filter="tar") if hasattr(tarfile, "tar_filter") else t.extractall(site)
added = []
for whl in sorted(glob.glob(os.path.join(here, "deps", "*.whl"))):
    dist = os.path.basename(whl).split("-")[0]
    try:
        md.version(re.sub(r"[-_.]+", "-", dist))
        continue  # the machine has it
    except md.PackageNotFoundError:
        zipfile.ZipFile(whl).extractall(site)
        added.append(dist)
print(f"ray unpacked into {site}; requirements added: {', '.join(added) or 'none'}")
'''


def pip_download(args: list[str], dest: str, no_deps: bool) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", PYTHON, "--platform", PLATFORM,
            *(["--no-deps"] if no_deps else []), "-d", dest, *args]


def kept(name: str) -> bool:
    return not name.startswith(DROP) and not any(p in "/" + name for p in DROP_PARTS)


def slim(wheel: str, out: str) -> tuple[int, int]:
    """Write the kept members of `wheel` to `out` (tar.xz, modes kept); (files kept, files dropped)."""
    n_kept = n_dropped = 0
    with zipfile.ZipFile(wheel) as z, tarfile.open(out, "w:xz", preset=9) as tar:
        for info in z.infolist():
            if info.is_dir():
                continue
            if not kept(info.filename):
                n_dropped += 1
                continue
            ti = tarfile.TarInfo(info.filename)
            ti.size = info.file_size
            ti.mode = (info.external_attr >> 16) & 0o777 or 0o644
            ti.mtime = 0
            with z.open(info) as f:
                tar.addfile(ti, io.BytesIO(f.read()))
            n_kept += 1
    return n_kept, n_dropped


def requirements(wheel: str) -> list[str]:
    """Ray's unconditional Requires-Dist lines (no extras), from the wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    return [line.split(":", 1)[1].split(";")[0].strip() for line in lines
            if line.startswith("Requires-Dist:") and "extra ==" not in line]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", default=VERSION, help=f"Ray version (default {VERSION})")
    ap.add_argument("--out", default=".whl-ray", help="the folder to carry (default .whl-ray)")
    ap.add_argument("--wheel", help="a Ray wheel at hand instead of downloading one")
    ap.add_argument("--no-deps", action="store_true", help="no deps/: the machine has Ray's requirements")
    ap.add_argument("--dry-run", action="store_true", help="say what would be downloaded and dropped; write nothing")
    a = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="ray-carry-")
    try:
        get = pip_download([f"ray=={a.version}"], work, no_deps=True)
        if a.dry_run:
            print(" ".join(get) if not a.wheel else f"wheel: {a.wheel}")
            print("drop:", " ".join(DROP), "and every", " ".join(p.strip("/") for p in DROP_PARTS), "folder")
            print(f"write: {a.out}/ray.tar.xz, {a.out}/unpack.py" + ("" if a.no_deps else f", {a.out}/deps/*.whl"))
            return 0
        wheel = a.wheel
        if wheel is None:
            subprocess.run(get, check=True, timeout=1800)
            wheel = glob.glob(os.path.join(work, "ray-*.whl"))[0]
        os.makedirs(a.out, exist_ok=True)
        n_kept, n_dropped = slim(wheel, os.path.join(a.out, "ray.tar.xz"))
        with open(os.path.join(a.out, "unpack.py"), "w") as f:
            f.write(UNPACK)
        if not a.no_deps:
            deps = os.path.join(a.out, "deps")
            os.makedirs(deps, exist_ok=True)
            subprocess.run(pip_download(requirements(wheel), deps, no_deps=False), check=True, timeout=1800)
        total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(a.out, "**"), recursive=True) if os.path.isfile(p))
        print(f"{a.out}: {total / 2**20:.1f} MiB ({os.path.getsize(wheel) / 2**20:.1f} MiB wheel; {n_kept} files kept, "
              f"{n_dropped} dropped)")
        if total > CARRY_LIMIT:
            print(f"too large: a device call carries {CARRY_LIMIT >> 20} MiB in all", file=sys.stderr)
            return 1
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
