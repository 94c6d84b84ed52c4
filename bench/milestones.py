"""When each step of one ``quantize convert`` first starts and last ends, in wall seconds since the
process started (issue 34: what stands between the I/O floor and the whole command).

    python bench/milestones.py convert SRC -o DST --algo NVFP4 --overwrite --quiet

Runs the CLI in this process with light wrappers around the steps below (first entry, first and
last exit, calls; printed to stderr at exit, and to ``MILESTONES_JSON`` when set). Unlike a
sampling profiler it does not slow the threads down, so the times line up with
bench/disk_timeline.py's. Wrapped steps that a run never calls are left out.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import importlib.abc
import importlib.util
import json
import os
import sys
import threading
import time

T0 = time.perf_counter()
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

STEPS = [
    "quantize_cli.run.options:resolve_run",  # imports torch, resolves the device
    "quantize_cli.run.startup:warm",  # CUDA context, the kernels' import
    "quantize_cli.run.startup:triton_version_key",
    "quantize_cli.run.context:triton_version_key",
    "quantize_cli.run.copy_ahead:copy_ahead",
    "quantize_cli.run.startup:Resolution.result",
    "quantize_cli.run.local:produce",
    "quantize_cli.run.pipeline:load",  # one read into a (pinned) buffer
    "quantize_cli.run.compute:ComputeStage.run_task",
    "quantize_cli.run.pipeline:AsyncWriter.write",
    "quantize_cli.run.pipeline:AsyncWriter.task_done",
    "quantize_cli.run.pipeline:AsyncWriter.flush",
    "quantize_cli.checkpoint.writer:ShardWriter.write_bytes",
    "quantize_cli.checkpoint.writer:ShardWriter.close",
    "quantize_cli.output.card:render_card",
]
seen: dict[str, list] = {}
lock = threading.Lock()


def wrap(key: str, fn):
    @functools.wraps(fn)
    def inner(*a, **k):
        t = time.perf_counter() - T0
        with lock:
            rec = seen.setdefault(key, [t, None, None, 0])
            rec[3] += 1
        try:
            return fn(*a, **k)
        finally:
            t = time.perf_counter() - T0
            with lock:
                rec[1] = t if rec[1] is None else rec[1]
                rec[2] = t

    return inner


def patch(mod) -> None:
    """Wrap the steps that live in module `mod`, right after it is imported."""
    for spec in STEPS:
        mod_name, attr = spec.split(":")
        if mod_name == mod.__name__:
            owner, name = (mod, attr) if "." not in attr else (getattr(mod, attr.split(".")[0]), attr.split(".")[1])
            setattr(owner, name, wrap(mod_name.split(".")[-1] + ":" + attr, getattr(owner, name)))


class Hook(importlib.abc.MetaPathFinder):
    """Patches each wrapped module as the CLI imports it: importing them all up front would import
    torch before the CLI does, and move the start-up this script is here to time."""

    targets = {spec.split(":")[0] for spec in STEPS}

    def find_spec(self, name, path, target=None):
        if name not in self.targets:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    sys.meta_path.insert(0, Hook())


def report() -> None:
    rows = sorted(seen.items(), key=lambda kv: kv[1][0])
    out = {k: {"first_in": v[0], "first_out": v[1], "last_out": v[2], "calls": v[3]} for k, v in rows}
    out["atexit"] = {"first_in": time.perf_counter() - T0}
    print("milestones (s since start): step | first in | first out | last out | calls", file=sys.stderr)
    for k, v in rows:
        print(f"  {k:45s} {v[0]:7.3f} {v[1] or 0:7.3f} {v[2] or 0:7.3f} {v[3]:6d}", file=sys.stderr)
    print(f"  {'atexit':45s} {out['atexit']['first_in']:7.3f}", file=sys.stderr)
    if os.environ.get("MILESTONES_JSON"):
        with open(os.environ["MILESTONES_JSON"], "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    install()
    atexit.register(report)
    from quantize_cli import cli

    exit_now = os._exit  # the CLI leaves by os._exit after a GPU run (cli._fast_exit): report first
    os._exit = lambda code: (report(), sys.stderr.flush(), exit_now(code))
    main = cli.main

    sys.argv = ["quantize"] + sys.argv[1:]
    main()
