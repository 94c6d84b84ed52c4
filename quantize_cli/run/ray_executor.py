"""``--executor ray``: one conversion across processes, GPUs and machines, same bytes.

The driver (this module; it never imports torch) has joined or started Ray and created the workers
on a background thread while it planned (:mod:`.ray_start`): one long-lived actor per GPU, or per
few CPUs of each node (:class:`~.ray_tasks.ShardWorker`). Then each worker probes its node and receives the plan once; the driver splits the plan into one
unit per output shard (:mod:`.partition`) and hands the units out, largest first, from a dynamic
queue (:mod:`.dispatch`); each worker writes its shards into the shared work folder through one
pipeline that streams from shard to shard. The driver joins the per-output digests the workers
return and journals each task once all of its parts are in, exactly as the local executor does
(``--resume`` may switch executors). Like every executor it only produces bytes: the output
lifecycle (output/workfolder.py) finishes, verifies, seals and commits.

A worker that dies (its process, its node) has its shards redone by the others (dispatch.py); an
error raised by the conversion itself (NaN, a bad tensor) stops the run with its own message.
"""

from __future__ import annotations

import os
import sys
import time
import uuid

from ..errors import DestinationError, QuantizeError, UsageError
from .context import executor_sizes
from .dispatch import WAIT_S, WorkerLost, dispatch
from .partition import partition
from .ray_start import Boot, RayRunError, adopt, create, first_line, import_ray
from .stats import merge

STRAGGLER_S = 120  # once one worker is ready, how long the others get to start before the run goes on without them
SAY_WAITING_S = 30  # no worker ready after this long: say why we wait


def check_options(executor: str, device: str) -> str:
    """Usage errors first: the executor's name, the extra installed, the device."""
    if executor != "ray":
        raise UsageError(f"--executor {executor!r}: choose local or ray")
    import_ray()
    return check_device(device)


def check_device(device: str) -> str:
    """``--device`` for Ray workers: ``cpu``, ``cuda`` (a GPU per worker; ``cuda:N`` means the
    same: Ray picks the GPUs) or ``auto`` (GPUs when the cluster has any). The driver needs no GPU."""
    d = (device or "auto").lower()
    if "," in d:
        raise UsageError(f"--device {device} --executor ray: Ray gives every GPU of the cluster a worker; use --device cuda")
    if d in ("auto", "cpu") or d == "cuda" or (d.startswith("cuda:") and d[5:].isdigit()):
        return "cuda" if d.startswith("cuda") else d
    raise UsageError(f"--device {device!r} is not a device; use auto, cpu, cuda or cuda:N")


# -- the run -----------------------------------------------------------------------------------------
def produce(plan, work, done: set[int], ctx):
    """Write `plan`'s tasks not in `done` into ``work.partial`` with Ray workers; journal each task.

    Returns merged :class:`~.stats.RunStats` with a ``ray`` attribute for the report."""
    t0 = time.perf_counter()
    boot = adopt(ctx.ray_address, ctx.ray_device or "auto").wait()
    ctx.info(boot.message)
    ok, bar, pool = False, None, None
    try:
        pool = _Workers(boot, plan, work.partial, ctx)
        boot.timings["workers_ready_s"] = round(time.perf_counter() - boot._t0, 3)
        boot.timings["driver_wait_s"] = round(time.perf_counter() - t0, 3)
        bar = pool.bar = _Bar(boot.ray, plan, pool, ctx.quiet)
        bar.update(sum(plan.tasks[i].bytes_in for i in done))
        ahead = executor_sizes(ctx.budget)["budget_bytes"] * 3 // 5
        t1 = time.perf_counter()
        results = dispatch(pool, plan, partition(plan), done, work.journal, ahead, ctx.warn)
        boot.timings["shards_s"] = round(time.perf_counter() - t1, 3)  # from the first unit handed out to the last one written
        if done:
            ctx.info(f"resuming: {sum(r['skipped'] for r in results.values())} of {len(results)} shard(s) complete")
        stats = merge(_finish(boot.ray, [pool.actors[w] for w in sorted(pool.live)]))
        ok = True
    finally:
        if bar is not None:
            bar.close()
        whole = pool is not None and not pool.replaced and len(pool.live) == len(boot.specs)
        if pool is not None:
            boot.workers = pool.actors
        t2 = time.perf_counter()
        boot.close(reusable=ok and whole)  # warm workers kept for this session's next run only when all are well
        boot.timings["stop_s"] = round(time.perf_counter() - t2, 3)
    address = ctx.ray_address or os.environ.get("RAY_ADDRESS") or "local"
    stats.ray = {"address": address, "device": boot.device, "nodes": sorted({w["host"] for w in pool.where if w}),
                 "workers": [w for w in pool.where if w], "start_s": boot.timings,
                 "shards": [{k: r[k] for k in ("shard", "host", "node_id", "bytes_in", "seconds", "skipped", "kept")}
                            | {"input_gb_per_s": (r["bytes_in"] / 1e9 / r["seconds"]) if r["seconds"] and not r["skipped"] else None}
                            for _, r in sorted(results.items())]}
    return stats


class _Workers:
    """The run's Ray workers as dispatch.py sees them (see dispatch's module docstring).

    Built once every worker has probed its node and taken the plan (:meth:`_start_all`); a lost
    worker is replaced by a new one of the same resources (Ray places it where there is room)."""

    def __init__(self, boot: Boot, plan, folder: str, ctx):
        import glob

        from .ray_tasks import UnitContext

        self.ray, self.boot, self.folder, self.say, self.bar = boot.ray, boot, folder, ctx.info, None
        for stale in glob.glob(os.path.join(glob.escape(folder), ".ray-probe-*")):  # from a run that failed its probe
            os.unlink(stale)
        self.token = uuid.uuid4().hex
        sources = [] if ctx.hub else sorted({t.path for t in plan.source.tensors.values()})
        self.args = (folder, self.token, sources, self.ray.put(plan), UnitContext(folder, ctx.budget, ctx.measure, ctx.hub, ctx.kernels))
        self.actors: list = list(boot.workers)
        self.specs: list = list(boot.specs)
        self.where: list = [None] * len(self.actors)
        self.live: set[int] = set()
        self._owner: dict = {}  # handle -> worker
        self._starting: dict = {}  # prepare ref -> (worker, deadline or None: no worker is ready yet)
        self.replaced, self.why = 0, ""
        try:
            self._start_all(ctx)
        finally:  # a refused probe leaves no token behind in the work folder (it may be resumed, or finished)
            for left in glob.glob(os.path.join(glob.escape(folder), f".ray-probe-{self.token}-*")):
                os.unlink(left)
        self.workers = sorted(self.live)

    # -- starting -----------------------------------------------------------------------------------
    def _start_all(self, ctx) -> None:
        """Wait for every worker's probe: none is ready yet, as long as it takes (the cluster may be
        busy); once one is, the others get STRAGGLER_S, then the run goes on without them. A DST that
        some worker's node does not share is refused here, before any shard is written."""
        for w in range(len(self.actors)):
            self._starting[self.actors[w].prepare.remote(*self.args)] = (w, None)
        said, total = False, len(self.actors)
        while self._starting:
            self.joined(WAIT_S)
            if self.live:
                deadline = time.monotonic() + STRAGGLER_S
                self._starting = {ref: (w, d or deadline) for ref, (w, d) in self._starting.items()}
            elif not said and time.perf_counter() - self.boot._t0 > SAY_WAITING_S:
                ctx.info(f"ray: waiting for {len(self._starting)} worker(s) to start (are the cluster's "
                         f"{'GPUs' if self.boot.device == 'cuda' else 'CPUs'} busy?)")
                said = True
            if not self._starting and not self.live:
                break
        if len(self.live) < total:
            ctx.warn(f"ray: {total - len(self.live)} of {total} worker(s) did not start ({self.why or 'not ready in time'}); "
                     f"going on with {len(self.live)}")
        if not self.live:
            raise RayRunError(f"--executor ray: no worker started ({self.why or 'none ready'}); the work folder is kept: "
                              f"rerun with --resume once the cluster is healthy")

    def _ready(self, w: int, where: dict) -> None:
        _check_probe(self.folder, self.token, where)
        self.where[w] = {k: v for k, v in where.items() if k != "probe"}
        self.live.add(w)

    def _drop(self, w: int) -> None:
        try:
            self.ray.kill(self.actors[w])
        except Exception:  # noqa: BLE001 - already gone
            pass
        self.live.discard(w)

    def replace(self, w: int) -> None:
        """Start a worker like lost worker `w` (at most twice as many replacements as workers)."""
        self._drop(w)
        if self.replaced >= 2 * len(self.specs):
            return
        self.replaced += 1
        spec = self.specs[w]
        self.actors.append(create(self.ray, self.boot.device, spec))
        self.specs.append(spec)
        self.where.append(None)
        self._starting[self.actors[-1].prepare.remote(*self.args)] = (len(self.actors) - 1, time.monotonic() + STRAGGLER_S)

    def joined(self, timeout: float = 0) -> list[int]:
        """Workers that became ready (probed, plan taken) within `timeout` s; one that died while
        starting is replaced, one past its deadline (no room in the cluster) dropped."""
        if not self._starting:
            return []
        ray, new = self.ray, []
        got, rest = ray.wait(list(self._starting), num_returns=1, timeout=timeout)
        if got and rest:
            got += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        for ref in got:
            w, _ = self._starting.pop(ref)
            try:
                self._ready(w, ray.get(ref))
                new.append(w)
            except ray.exceptions.RayActorError as exc:  # e.g. a worker kept from an earlier run that is gone
                self.why = f"{type(exc).__name__}: {first_line(exc)}"
                self.replace(w)
            except Exception as exc:  # noqa: BLE001
                raise _translate(ray, exc, "preparing the Ray workers") from None
        for ref, (w, deadline) in list(self._starting.items()):
            if deadline is not None and time.monotonic() > deadline:  # no room for it in the cluster
                del self._starting[ref]
                self._drop(w)
        return new

    def starting(self) -> int:
        return len(self._starting)

    # -- the units ----------------------------------------------------------------------------------
    def submit(self, w: int, unit, unit_done: frozenset):
        ref = self.actors[w].run.remote(unit.shard, unit_done)
        self._owner[ref] = w
        return ref

    def wait(self, handles: list, timeout: float) -> list:
        if not handles:
            time.sleep(timeout)
            return []
        ready, rest = self.ray.wait(handles, num_returns=1, timeout=timeout)
        if ready and rest:
            ready += self.ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        return ready

    def result(self, handle) -> dict:
        ray = self.ray
        w = self._owner.pop(handle, None)
        try:
            return ray.get(handle)
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.ObjectLostError) as exc:
            self.live.discard(w)
            raise WorkerLost(f"{type(exc).__name__}: {first_line(exc)}") from None
        except Exception as exc:  # noqa: BLE001
            raise _translate(ray, exc, "writing the shards") from None

    def cancel(self, handles: list) -> None:
        """Stop every worker's pipeline (a first error or Ctrl-C ends the run) and wait a moment."""
        stops = []
        for w in self.live:
            try:
                stops.append(self.actors[w].abort.remote())
            except Exception:  # noqa: BLE001 - the actor is gone
                pass
        try:
            self.ray.wait(stops + list(handles), num_returns=len(stops) + len(handles), timeout=10)
        except Exception:  # noqa: BLE001
            pass

    def tick(self) -> None:
        if self.bar is not None:
            self.bar.refresh()


def _check_probe(folder: str, token: str, where: dict) -> None:
    """The token of the worker that returned `where` (its ``probe`` file) is visible here; removed."""
    path = os.path.join(folder, where["probe"])
    try:
        with open(path) as f:
            ok = f.read() == token
        os.unlink(path)
    except OSError:
        ok = False
    if not ok:
        raise DestinationError(f"{folder}: a file written there by node {where['host']} ({where['node_id'][:12]}) is not "
                               f"visible here; DST must be on storage every Ray node shares with the driver (NFS, a parallel "
                               f"file system)")


def _finish(ray, actors: list) -> list:
    """Every live worker's statistics (a worker lost at the very end has none)."""
    out = []
    for ref in [a.finish.remote() for a in actors]:
        try:
            out.append(ray.get(ref))
        except ray.exceptions.RayError:
            pass
    return out


class _Bar:
    """The driver's progress bar over source bytes, polled from the workers without blocking."""

    def __init__(self, ray, plan, pool: _Workers, quiet: bool):
        from tqdm import tqdm

        self.ray, self.pool, self.base = ray, pool, 0
        self.bar = tqdm(total=plan.bytes_in, unit="B", unit_scale=True, desc="quantize (ray)", disable=quiet or not sys.stderr.isatty())
        self._ask = None

    def update(self, n: int) -> None:
        self.base += n
        self.bar.update(n)

    def refresh(self) -> None:
        if self.bar.disable:
            return
        try:
            if self._ask is not None and not self.ray.wait(self._ask, num_returns=len(self._ask), timeout=0)[1]:
                self.bar.update(max(0, self.base + sum(self.ray.get(self._ask)) - self.bar.n))
                self._ask = None
            if self._ask is None:  # bytes of the live workers (a lost worker's are redone)
                self._ask = [self.pool.actors[w].consumed.remote() for w in sorted(self.pool.live)]
        except Exception:  # noqa: BLE001 - the bar is cosmetic; failures surface elsewhere
            self._ask = None

    def close(self) -> None:
        self.bar.close()


def _translate(ray, exc: BaseException, what: str) -> QuantizeError:
    cause = getattr(exc, "cause", None)
    if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(cause, QuantizeError):
        return cause
    if isinstance(exc, QuantizeError):
        return exc
    return RayRunError(f"{what}: Ray failed ({type(exc).__name__}: {first_line(exc)}); the work folder is kept: "
                       f"rerun with --resume once the cluster is healthy")


__all__ = ["produce", "check_options", "check_device", "import_ray", "RayRunError", "STRAGGLER_S"]
