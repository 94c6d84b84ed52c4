"""``--executor ray``: one conversion as Ray tasks across processes, GPUs and machines, same bytes.

The driver keeps every decision that spans shards: it splits the plan into one unit per output
shard (:mod:`.partition`), computes the shared amax of fused groups split across units with small
amax tasks, and hands it to the shard tasks. Each shard task (:mod:`.ray_tasks`) writes its shard
into the shared work folder with the local executor and writer, on whatever node Ray places it, and
returns the digest of every output tensor it wrote. The driver joins them per plan task and journals
each task once all of its parts are in, exactly as the local executor does (``--resume`` after a
driver crash skips the tasks whose bytes still match). Like every executor it only produces bytes:
the output lifecycle (output/workfolder.py) finishes, verifies, seals and commits.

Ray retries a task whose worker or node died (``max_retries``); an error raised by the
conversion itself (NaN, a bad tensor) is not retried and stops the run with its own message.
"""

from __future__ import annotations

import os
import sys
import time
import uuid

from ..errors import DestinationError, QuantizeError, UsageError
from . import ray_tasks
from .context import executor_sizes
from .execute import RunStats
from .partition import group_amax_sources, partition

MAX_RETRIES = 3  # per task, for dead workers or nodes (Ray's own retry)
WAIT_S = 0.5  # how often the driver refreshes the progress bar


class RayRunError(DestinationError):
    """The Ray cluster failed the run (unreachable, lost, tasks out of retries). The work folder
    is kept (hence a :class:`DestinationError`): rerun with ``--resume``."""


def import_ray():
    """The ray module, or a usage error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray: Ray is not installed; pip install 'quantize-cli[ray]'") from None
    return ray


def check_options(executor: str, device: str) -> str:
    """Usage errors first: the executor's name, the extra installed, the device."""
    if executor != "ray":
        raise UsageError(f"--executor {executor!r}: choose local or ray")
    import_ray()
    return check_device(device)


def produce(plan, work, done: set[int], ctx):
    """Write `plan`'s tasks not in `done` into ``work.partial`` with Ray tasks; journal each task.

    Returns merged :class:`RunStats` with a ``ray`` attribute for the report."""
    ray = import_ray()
    started = connect(ray, ctx.ray_address, ctx.info)
    try:
        device = _pick_device(ray, ctx.ray_device or "auto")
        nodes = _probe(ray, plan, work.partial, ctx.hub)
        units = partition(plan)
        uctx = ray_tasks.UnitContext(work.partial, device, ctx.budget, ctx.measure, ctx.hub,
                                     executor_sizes=executor_sizes(ctx.budget), kernels=ctx.kernels)
        results = _run_units(ray, plan, units, uctx, done, work.journal, ctx)
    finally:
        if started:
            ray.shutdown()
    stats = _merge([r.get("stats") for r in results.values()])
    address = ctx.ray_address or os.environ.get("RAY_ADDRESS") or "local"
    stats.ray = {"address": address, "device": device, "nodes": nodes,
                 "shards": [{k: r[k] for k in ("shard", "host", "node_id", "bytes_in", "seconds", "skipped")}
                            | {"input_gb_per_s": (r["bytes_in"] / 1e9 / r["seconds"]) if r["seconds"] and not r["skipped"] else None}
                            for _, r in sorted(results.items())]}
    return stats


def check_device(device: str) -> str:
    """``--device`` for Ray tasks: ``cpu``, ``cuda`` (a GPU per task; ``cuda:N`` means the same:
    Ray picks the GPU) or ``auto`` (GPUs when the cluster has any). The driver needs no GPU."""
    d = (device or "auto").lower()
    if d in ("auto", "cpu") or d == "cuda" or (d.startswith("cuda:") and d[5:].isdigit()):
        return "cuda" if d.startswith("cuda") else d
    raise UsageError(f"--device {device!r} is not a device; use auto, cpu, cuda or cuda:N")


class _Progress:
    """Per-run, per-shard consumed source bytes, set by the shard tasks, read by the driver's bar.

    One named actor per Ray session serves every run (starting an actor process costs seconds)."""

    def __init__(self):
        self.done: dict[str, dict[int, int]] = {}

    def set(self, run: str, shard: int, n: int) -> None:
        self.done.setdefault(run, {})[shard] = n

    def total(self, run: str) -> int:
        return sum(self.done.get(run, {}).values())

    def drop(self, run: str) -> None:
        self.done.pop(run, None)


class _Bar:
    """The driver's progress bar over source bytes, refreshed from the actor without blocking."""

    def __init__(self, ray, plan, run):
        from tqdm import tqdm

        self.ray, self.run = ray, uuid.uuid4().hex
        self.actor = ray.remote(num_cpus=0)(_Progress).options(name="quantize-progress", namespace="quantize",
                                                               get_if_exists=True, lifetime=None).remote()
        self.bar = tqdm(total=plan.bytes_in, unit="B", unit_scale=True, desc="quantize (ray)",
                        disable=run.quiet or not sys.stderr.isatty())
        self._ask = None

    def refresh(self) -> None:
        try:
            if self._ask is not None and self.ray.wait([self._ask], timeout=0)[0]:
                self.bar.update(max(0, self.ray.get(self._ask) - self.bar.n))
                self._ask = None
            if self._ask is None and not self.bar.disable:
                self._ask = self.actor.total.remote(self.run)
        except Exception:  # noqa: BLE001 - the bar is cosmetic; task failures surface elsewhere
            self._ask = None

    def close(self) -> None:
        self.bar.close()
        try:
            self.actor.drop.remote(self.run)
        except Exception:  # noqa: BLE001
            pass


def connect(ray, address: str | None, say) -> bool:
    """Join the cluster at `address` (or ``RAY_ADDRESS``), or start a local instance. Returns
    True when this call started Ray (so the run shuts it down)."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    _reachable(address)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="WARNING",
                 configure_logging=True)
    except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ValueError by version
        where = address or "a local instance"
        raise RayRunError(f"--executor ray: cannot connect to {where} ({type(exc).__name__}: {_first(exc)}); "
                          f"start the cluster (ray start --head) or fix --ray-address") from None
    res = ray.cluster_resources()
    say(f"ray: {'joined ' + address if address else 'started a local instance'}: {len(ray.nodes())} node(s), "
             f"{int(res.get('CPU', 0))} CPU(s), {int(res.get('GPU', 0))} GPU(s)")
    return True


def _reachable(address: str | None, timeout_s: float = 10) -> None:
    """Fail in seconds on a ``host:port`` nobody answers (Ray itself retries for minutes)."""
    import socket

    if not address or address in ("auto", "local") or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise RayRunError(f"--executor ray: cannot connect to {address} ({why}); start the cluster "
                          f"(ray start --head) or fix --ray-address") from None


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


def _pick_device(ray, device: str) -> str:
    gpus = ray.cluster_resources().get("GPU", 0)
    if device == "auto":
        return "cuda" if gpus else "cpu"
    if device == "cuda" and not gpus:
        raise UsageError("--device cuda --executor ray: the Ray cluster has no GPUs; use --device cpu or auto")
    return device


def _probe(ray, plan, folder: str, hub) -> list[str]:
    """One probe task per alive node: each writes a token into the work folder, which the driver
    must then see, and checks that a local source is readable there. Returns the node hosts."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import glob

    for stale in glob.glob(os.path.join(glob.escape(folder), ".ray-probe-*")):  # from a run that failed its probe
        os.unlink(stale)
    token = uuid.uuid4().hex
    sources = [] if hub else sorted({t.path for t in plan.source.tensors.values()})
    probe = ray.remote(ray_tasks.probe)
    refs = [probe.options(num_cpus=0, max_retries=MAX_RETRIES, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(folder, token, sources) for n in ray.nodes() if n.get("Alive")]
    hosts = [w["host"] for w in _get(ray, refs, "probing the Ray nodes")]
    for host in hosts:
        path = os.path.join(folder, f".ray-probe-{token}-{host}")
        try:
            with open(path) as f:
                ok = f.read() == token
            os.unlink(path)
        except OSError:
            ok = False
        if not ok:
            raise DestinationError(f"{folder}: a file written there by node {host} is not visible here; DST must be on "
                                   f"storage every Ray node shares with the driver (NFS, a parallel file system)")
    return sorted(set(hosts))


def _get(ray, refs, what: str):
    """ray.get with the conversion's own errors re-raised as they are and Ray's failures as one line."""
    try:
        return ray.get(refs)
    except Exception as exc:  # noqa: BLE001
        raise _translate(ray, exc, what) from None


def _translate(ray, exc: BaseException, what: str) -> QuantizeError:
    cause = getattr(exc, "cause", None)
    if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(cause, QuantizeError):
        return cause
    if isinstance(exc, QuantizeError):
        return exc
    return RayRunError(f"{what}: Ray failed ({type(exc).__name__}: {_first(exc)}); the work folder is kept: "
                       f"rerun with --resume once the cluster is healthy")


def _run_units(ray, plan, units, ctx, done: set[int], journal, run) -> dict[int, dict]:
    """Submit the amax and shard tasks (none for a unit whose tasks are all done), journal each plan
    task once every part of it is written, drive the progress bar."""
    from . import checksum

    gpu = ctx.device == "cuda"
    task_opts = dict(num_cpus=1, num_gpus=1 if gpu else 0, max_retries=MAX_RETRIES, retry_exceptions=False)
    bar = _Bar(ray, plan, run)
    bar.bar.update(sum(plan.tasks[i].bytes_in for i in done))
    ctx.progress = (bar.actor, bar.run)
    todo = [u for u in units if any(i not in done for i, _ in u.tasks)]
    plan_ref = ray.put(plan)
    amax_task = ray.remote(ray_tasks.group_amax).options(num_cpus=1, max_retries=MAX_RETRIES)
    amax_refs = {i: amax_task.remote(infos, ctx.hub) for i, infos in group_amax_sources(plan, todo).items() if i not in done}
    unit_task = ray.remote(ray_tasks.run_unit).options(**task_opts, scheduling_strategy="SPREAD")
    pending = {}
    for u in todo:
        unit_done = frozenset(k for k, (i, _) in enumerate(u.tasks) if i in done)
        amaxes = [amax_refs[i] if i in amax_refs else None for i in u.needs_amax]
        pending[unit_task.remote(plan_ref, u, ctx, unit_done, *amaxes)] = u
    if done:
        run.info(f"resuming: {len(units) - len(todo)} of {len(units)} shard(s) complete")
    parts: dict[int, dict[str, str]] = {}
    results: dict[int, dict] = {u.shard: {"shard": plan.shard_names[u.shard], "index": u.shard, "bytes_in": u.bytes_in,
                                          "host": None, "node_id": None, "seconds": 0.0, "skipped": True}
                                for u in units if u not in todo}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=WAIT_S)
            for ref in ready:
                unit = pending.pop(ref)
                results[unit.shard] = res = _get(ray, ref, f"shard {plan.shard_names[unit.shard]}")
                for i, got in res["parts"].items():  # a task is journaled once all of its outputs are written
                    parts.setdefault(i, {}).update(got)
                    if set(parts[i]) == set(plan.tasks[i].outputs):
                        journal.append(i, checksum.task_digest(parts.pop(i)))
            bar.refresh()
    except BaseException:
        _cancel(ray, list(pending))
        raise
    finally:
        bar.close()
    return results


def _cancel(ray, refs) -> None:
    """Stop the shard tasks still running (a first error or Ctrl-C ends the run) and wait for them."""
    for ref in refs:
        try:
            ray.cancel(ref, force=True)
        except Exception:  # noqa: BLE001 - already finished or the cluster is gone
            pass
    try:
        ray.wait(refs, num_returns=len(refs), timeout=10)
    except Exception:  # noqa: BLE001
        pass


def _merge(parts) -> RunStats:
    out = RunStats()
    for s in parts:
        if s is None:
            continue
        out.bytes_read += s.bytes_read
        out.peak_inflight = max(out.peak_inflight, s.peak_inflight)
        out.baseline_rss = max(out.baseline_rss, s.baseline_rss)  # the largest task process: what a node must fit per task
        out.pinned_trims += s.pinned_trims
        out.warnings.extend(w for w in s.warnings if w not in out.warnings)  # a task's findings reach the user too
        for k, v in s.errors.items():
            out.errors.setdefault(k, v)
        for k, v in s.stages.items():
            out.stages[k] = round(out.stages.get(k, 0.0) + v, 3)
    return out


__all__ = ["produce", "check_options", "check_device", "import_ray", "RayRunError", "connect"]
