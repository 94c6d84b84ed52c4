"""``--executor ray``: one conversion across processes, GPUs and machines, same bytes.

The driver (this module; it never imports torch) joins or starts Ray on a background thread as soon
as the options are checked (:func:`start_early`), and creates the workers at once: one long-lived
actor per GPU, or per :data:`CPUS_PER_WORKER` CPUs of each node (:class:`~.ray_tasks.ShardWorker`).
Their start (a process, torch, a CUDA context, the Triton kernels) overlaps the driver's planning.
Then each worker probes its node and receives the plan once; the driver splits the plan into one
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
import threading
import time
import uuid

from ..errors import DestinationError, QuantizeError, UsageError
from .context import executor_sizes
from .dispatch import WAIT_S, WorkerLost, dispatch
from .partition import partition
from .stats import merge

CPUS_PER_WORKER = 4  # --device cpu: one worker per this many CPUs of a node (torch's threads)
STRAGGLER_S = 120  # once one worker is ready, how long the others get to start before the run goes on without them
SAY_WAITING_S = 30  # no worker ready after this long: say why we wait


class RayRunError(DestinationError):
    """The Ray cluster failed the run (unreachable, lost, workers gone). The work folder is kept
    (hence a :class:`DestinationError`): rerun with ``--resume``."""


def import_ray():
    """The ray module, or a usage error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray: Ray is not installed; pip install 'quantize[ray]'") from None
    return ray


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


# -- starting early ---------------------------------------------------------------------------------
_early: list["Boot"] = []  # the start begun by start_early, until produce adopts it


def start_early(address: str | None, device: str) -> None:
    """Join or start Ray and create the workers on a background thread, now (convert calls this
    once the options are checked; :func:`produce` adopts it; :func:`abandon_early` ends it)."""
    abandon_early()
    _early.append(Boot(address, device))


def abandon_early() -> None:
    """End a start that no run adopted (the plan was refused): workers killed, Ray stopped if ours."""
    while _early:
        _early.pop().close()


def _adopt(address: str | None, device: str) -> "Boot":
    boot = _early.pop() if _early else None
    abandon_early()
    if boot is not None and (boot.address, boot.requested) == (address, device):
        return boot
    if boot is not None:
        boot.close()
    return Boot(address, device)


class Boot:
    """Ray joined (or started) and the workers created, on a thread (see :func:`start_early`).

    After :meth:`wait`: ``ray``, ``started`` (this run started Ray or joined by address: it ends
    that at :meth:`close`), ``device`` (``cuda``/``cpu``), ``workers`` (actor handles), ``timings``."""

    def __init__(self, address: str | None, device: str):
        self.address, self.requested = address, device
        self.ray, self.started, self.device, self.workers, self.specs = None, False, device, [], []
        self.timings: dict = {}
        self.message = ""
        self.error: BaseException | None = None
        self._t0 = time.perf_counter()
        self._ready, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._start, daemon=True, name="quantize-ray-start")
        self._thread.start()

    def _start(self) -> None:
        try:
            self.ray = import_ray()
            self.started, self.message = connect(self.ray, self.address)
            self.timings["connect_s"] = round(time.perf_counter() - self._t0, 3)
            self.device = _pick_device(self.ray, self.requested)
            specs = worker_specs(self.ray, self.device)
            kept = None if self.started else _checkout(self.ray, self.device, specs)
            self.specs = specs
            self.workers = kept or [_create(self.ray, self.device, s) for s in specs]
            self.timings["workers_kept"] = bool(kept)
        except BaseException as exc:  # noqa: BLE001 - raised by wait(), in the driver's thread
            self.error = exc
        self._ready.set()
        # Ray starts a local instance's processes (raylet, GCS) with a parent-death signal, which
        # Linux sends when the *thread* that started them ends: this thread lives until close().
        self._release.wait()

    def wait(self) -> "Boot":
        self._ready.wait()
        if self.error is not None:
            raise self.error
        return self

    def close(self, reusable: bool = False) -> None:
        """Kill the workers (or keep them for the next run in this Ray session); stop Ray if ours."""
        self._ready.wait()
        try:
            self._close(reusable)
        finally:
            self._release.set()

    def _close(self, reusable: bool) -> None:
        ray = self.ray
        if ray is None or not ray.is_initialized():
            return
        if self.started:
            ray.shutdown()
        elif reusable:  # the caller's own Ray session: keep the warm workers for its next run
            _checkin(ray, self.device, self.workers)
        else:
            for w in self.workers:
                try:
                    ray.kill(w)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        self.workers = []


def connect(ray, address: str | None) -> tuple[bool, str]:
    """Join the cluster at `address` (or ``RAY_ADDRESS``), or start a local instance. Returns
    (whether this call initialised Ray, so the run shuts it down; a line for the console)."""
    if ray.is_initialized():
        return False, "ray: using this process's Ray session"
    address = address or os.environ.get("RAY_ADDRESS") or None
    _reachable(address)
    # A local instance's workers at normal priority: Ray starts them at nice 15, so that on a busy
    # machine they get a small share of the CPUs (the local executor gets a full one).
    own = {} if address else {"_system_config": {"worker_niceness": 0}}
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR", configure_logging=True,
                 **own)
    except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ValueError by version
        where = address or "a local instance"
        raise RayRunError(f"--executor ray: cannot connect to {where} ({type(exc).__name__}: {_first(exc)}); "
                          f"start the cluster (ray start --head) or fix --ray-address") from None
    res = ray.cluster_resources()
    return True, (f"ray: {'joined ' + address if address else 'started a local instance'}: {len(ray.nodes())} node(s), "
                  f"{int(res.get('CPU', 0))} CPU(s), {int(res.get('GPU', 0))} GPU(s)")


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


# -- the workers -------------------------------------------------------------------------------------
def worker_specs(ray, device: str) -> list[dict]:
    """One worker per GPU of every alive node (``cuda``), or per :data:`CPUS_PER_WORKER` CPUs
    (``cpu``; a node with fewer gets one worker with all of them): ``[{node, num_cpus, num_gpus}]``."""
    specs = []
    for n in sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: n["NodeID"]):
        cpus, gpus = int(n["Resources"].get("CPU", 0)), int(n["Resources"].get("GPU", 0))
        if device == "cuda":
            specs += [{"node": n["NodeID"], "num_gpus": 1, "num_cpus": 1 if cpus >= gpus else 0}] * gpus
        elif cpus:
            k = max(1, cpus // CPUS_PER_WORKER)
            specs += [{"node": n["NodeID"], "num_gpus": 0, "num_cpus": cpus // k}] * k
    if not specs:
        raise RayRunError(f"--executor ray: the Ray cluster has no {'GPU' if device == 'cuda' else 'CPU'} for a worker; "
                          f"add nodes with resources or use another --device")
    return specs


def _create(ray, device: str, spec: dict):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from .ray_tasks import CONCURRENCY, ShardWorker

    return (ray.remote(ShardWorker)
            .options(num_cpus=spec["num_cpus"], num_gpus=spec["num_gpus"], max_concurrency=CONCURRENCY, max_restarts=0,
                     scheduling_strategy=NodeAffinitySchedulingStrategy(spec["node"], soft=True))
            .remote(device, max(1, spec["num_cpus"])))


# Workers kept between runs of one process that uses its own Ray session (a library caller, the
# tests): warm workers start the next run at once. Keyed by the session, device and worker layout.
_pool: dict[tuple, list] = {}
_pool_lock = threading.Lock()


def _pool_key(ray, device: str, specs: list[dict]) -> tuple:
    ctx = ray.get_runtime_context()  # the driver's node id and job: unique to this session
    return ((ctx.get_node_id(), ctx.get_job_id()), device, tuple(tuple(sorted(s.items())) for s in specs))


def _checkout(ray, device: str, specs: list[dict]):
    key = _pool_key(ray, device, specs)
    with _pool_lock:
        for other in [k for k in _pool if k != key]:  # another session's (gone), or the cluster changed: start afresh
            for w in _pool.pop(other):
                if other[0] == key[0]:
                    ray.kill(w)
        return _pool.pop(key, None)


def _checkin(ray, device: str, workers: list) -> None:
    specs = worker_specs(ray, device)
    with _pool_lock:
        _pool[_pool_key(ray, device, specs)] = list(workers)


# -- the run -----------------------------------------------------------------------------------------
def produce(plan, work, done: set[int], ctx):
    """Write `plan`'s tasks not in `done` into ``work.partial`` with Ray workers; journal each task.

    Returns merged :class:`~.stats.RunStats` with a ``ray`` attribute for the report."""
    t0 = time.perf_counter()
    boot = _adopt(ctx.ray_address, ctx.ray_device or "auto").wait()
    ctx.info(boot.message)
    ok, bar, pool = False, None, None
    try:
        pool = _Workers(boot, plan, work.partial, ctx)
        boot.timings["workers_ready_s"] = round(time.perf_counter() - boot._t0, 3)
        boot.timings["driver_wait_s"] = round(time.perf_counter() - t0, 3)
        bar = pool.bar = _Bar(boot.ray, plan, pool, ctx.quiet)
        bar.update(sum(plan.tasks[i].bytes_in for i in done))
        ahead = executor_sizes(ctx.budget)["budget_bytes"] * 3 // 5
        results = dispatch(pool, plan, partition(plan), done, work.journal, ahead, ctx.warn)
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
        boot.close(reusable=ok and whole)  # warm workers kept for this session's next run only when all are well
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
        self._start_all(ctx)
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
        self.where[w] = where
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
        self.actors.append(_create(self.ray, self.boot.device, spec))
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
                self.why = f"{type(exc).__name__}: {_first(exc)}"
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
            raise WorkerLost(f"{type(exc).__name__}: {_first(exc)}") from None
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
    from .ray_tasks import probe_name

    path = os.path.join(folder, probe_name(token, where["node_id"], where["host"]))
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
    return RayRunError(f"{what}: Ray failed ({type(exc).__name__}: {_first(exc)}); the work folder is kept: "
                       f"rerun with --resume once the cluster is healthy")


__all__ = ["produce", "check_options", "check_device", "import_ray", "RayRunError", "connect", "start_early",
           "abandon_early", "worker_specs", "CPUS_PER_WORKER"]
