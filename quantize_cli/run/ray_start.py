"""Starting Ray and the workers of a run, ahead of the plan (``--executor ray``).

:func:`start_early` joins the cluster at ``--ray-address`` (or ``RAY_ADDRESS``), or starts a local
instance, on a background thread as soon as the options are checked, and creates the run's
workers at once: one actor per GPU of every node, or per :data:`CPUS_PER_WORKER` CPUs
(:class:`~.ray_tasks.ShardWorker`). Their start (a process each, torch, a CUDA context, the Triton
kernels) then overlaps the driver's planning; the driver (``ray_executor.produce``) adopts what was
started. In a process with its own Ray session the workers are kept warm between runs.
"""

from __future__ import annotations

import os
import threading
import time

from ..errors import DestinationError, UsageError

CPUS_PER_WORKER = 4  # --device cpu: one worker per this many CPUs of a node (torch's threads)


class RayRunError(DestinationError):
    """The Ray cluster failed the run (unreachable, lost, workers gone). The work folder is kept
    (hence a :class:`DestinationError`): rerun with ``--resume``."""


def import_ray():
    """The ray module, or a usage error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray: Ray is not installed; pip install 'quantize-cli[ray]'") from None
    return ray


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


def adopt(address: str | None, device: str) -> "Boot":
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
            self.workers = kept or [create(self.ray, self.device, s) for s in specs]
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
        # No address means a new local instance (as --ray-address's help says): "local", because
        # ray.init(None) joins whatever /tmp/ray/ray_current_cluster names, a `ray start` cluster or a
        # stale file left by a killed one (then the run failed). Joining one is `--ray-address auto`.
        ray.init(address=address or "local", include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 configure_logging=True, **own)
    except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ValueError by version
        where = address or "a local instance"
        fix = _token_hint() if address else ""
        raise RayRunError(f"--executor ray: cannot connect to {where} ({type(exc).__name__}: {first_line(exc)}); "
                          + (fix or "start the cluster (ray start --head) or fix --ray-address")) from None
    res = ray.cluster_resources()
    return True, (f"ray: {'joined ' + address if address else 'started a local instance'}: {len(ray.nodes())} node(s), "
                  f"{int(res.get('CPU', 0))} CPU(s), {int(res.get('GPU', 0))} GPU(s)")


def _token_hint() -> str:
    """The likely fix when a cluster that answers refuses to let us join: Ray >= 2.5x starts clusters
    with token authentication, and a driver joining by address sends its token (``~/.ray/auth_token``
    or ``RAY_AUTH_TOKEN``) only with ``RAY_AUTH_MODE=token``; without it Ray retries with
    ``InvalidAuthToken`` warnings until it gives up. "" when the mode is set or no token is here."""
    if os.environ.get("RAY_AUTH_MODE"):
        return ""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.path.isfile(path)):
        return ""
    return ("this machine has a Ray auth token and RAY_AUTH_MODE is unset: a cluster with token authentication (Ray "
            ">= 2.5x) refuses the driver; export RAY_AUTH_MODE=token (docs/scale-out.md)")


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


def first_line(exc: BaseException) -> str:
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


def create(ray, device: str, spec: dict):
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


__all__ = ["Boot", "RayRunError", "import_ray", "connect", "start_early", "abandon_early", "adopt", "worker_specs", "create",
           "first_line", "CPUS_PER_WORKER"]
