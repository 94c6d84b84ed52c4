"""What runs on the Ray workers: one long-lived actor per GPU (or per few CPUs) for a whole run.

A :class:`ShardWorker` is created as soon as the driver has joined the cluster, before the plan
exists: meanwhile it imports torch, creates its CUDA context and loads the Triton kernels. Then it
probes its node (a token written into the work folder, which the driver must see; a local SRC
readable there), receives the plan once, and writes whole output shards as the driver hands them
out (run/dispatch.py), through one :class:`~.shard_stream.ShardStream`: the next shard's reads
start while the previous one is quantized and written. torch is imported inside the methods only:
the driver imports this module to name the actor and never loads torch.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from ..errors import DestinationError, SourceError

from .dispatch import MAX_UNITS

CONCURRENCY = MAX_UNITS + 4  # actor threads: its units' waits (dispatch.MAX_UNITS), and the probe/progress/finish calls beside them


@dataclass(frozen=True)
class UnitContext:
    """What every worker needs besides the plan (sent once per run with it).

    Attributes:
        folder: the work folder (DST's hidden ``.partial`` sibling) on shared storage.
        hub: ``(repo_id, revision, low_disk)`` for a Hub source, else None.
    """

    folder: str
    budget: int = 4 << 30
    measure: bool = False
    hub: tuple | None = None
    kernels: str = "auto"  # --kernels (kernel_choice.py)


def node_identity() -> dict:
    """Where this code runs: Ray node id and host name (for the report and error messages)."""
    node = ""
    try:
        import ray

        node = ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - called outside Ray in tests
        pass
    return {"node_id": node, "host": socket.gethostname()}


def probe_name(token: str, node_id: str, host: str, worker: str = "") -> str:
    """The probe file a worker writes into the work folder: per node (hosts may share a name) and
    per worker (the workers of one node probe at once, and the driver removes each probe it checked:
    one name per node made a node's second worker 'not visible' whenever its probe was written
    before the first one was checked)."""
    return f".ray-probe-{token}-{node_id[:16] or host}-{worker}"


def probe(folder: str, token: str, source_files: list[str], worker: str = "") -> dict:
    """Write ``token`` into the work folder and check the source is readable, on this node; the
    node's identity, with ``probe``: the file's name (`worker`: the probing worker's own key).

    The driver then reads the token back: a DST that a node cannot reach (missing path, or a local
    disk of the same name) is refused before any shard is written.
    """
    where = node_identity()
    where["probe"] = probe_name(token, where["node_id"], where["host"], worker)
    if not os.path.isdir(folder):
        raise DestinationError(f"{folder}: the work folder does not exist on node {where['host']}; "
                               f"DST must be on storage every Ray node can reach (NFS, a parallel file system)")
    try:
        with open(os.path.join(folder, where["probe"]), "w") as f:
            f.write(token)
    except OSError as exc:
        raise DestinationError(f"{folder}: node {where['host']} cannot write the work folder ({exc.strerror}); "
                               f"DST must be on storage every Ray node can write") from exc
    for path in source_files:
        if not os.path.isfile(path):
            raise SourceError(f"{path}: not found on node {where['host']}; a local SRC must be on storage every Ray node "
                              f"can read (or pass a Hub repo id: each node fetches its shards)")
    return where


class ShardWorker:
    """The Ray actor (see the module docstring). `device`: ``cuda`` (Ray gives it one GPU, seen as
    ``cuda:0``) or ``cpu``; `cpus`: the CPUs Ray reserved for it (torch's threads on the CPU)."""

    def __init__(self, device: str, cpus: int = 1):
        t0 = time.perf_counter()
        from .host_memory import configure_pinned_allocator

        configure_pinned_allocator()  # a process of ours: before its torch import (host_memory.py)
        import torch

        if device != "cuda":
            torch.set_num_threads(max(1, cpus))
        self.device = torch.device("cuda" if device == "cuda" else "cpu")
        if self.device.type == "cuda":  # the context and the kernels now, not in front of the first shard
            torch.empty(1, device=self.device)
            from .. import kernels  # noqa: F401  (imports Triton)
        self.where = {**node_identity(), "device": str(self.device), "warm_s": round(time.perf_counter() - t0, 3)}
        self.key = uuid.uuid4().hex[:12]  # this worker's probe file (several workers of a node probe at once)
        self.stream = None
        self.units: dict = {}
        self._lock = threading.Lock()
        self._prepared = threading.Event()  # run() waits for it (calls to a threaded actor may overtake each other)

    def prepare(self, folder: str, token: str, sources: list[str], plan, ctx: UnitContext) -> dict:
        """Probe this node, then take the run's plan (once) and start this worker's pipeline."""
        from .partition import partition
        from .shard_stream import ShardStream

        self._prepared.clear()
        try:
            probed = probe(folder, token, sources, self.key)
            with self._lock:
                if self.stream is not None:  # a worker kept from an earlier run in this Ray session
                    self.stream.abort("a new run started")
                self.units = {u.shard: u for u in partition(plan)}
                self.stream = ShardStream(plan, ctx.folder, self.device, ctx.budget, kernels=ctx.kernels, measure=ctx.measure,
                                          hub=ctx.hub, where={k: self.where[k] for k in ("node_id", "host")})
        finally:
            self._prepared.set()
        return {**self.where, "probe": probed["probe"]}

    def run(self, shard: int, unit_done: frozenset = frozenset()) -> dict:
        """Write output shard `shard` (its tasks `unit_done` are kept); returns when it is on disk."""
        self._prepared.wait()
        stream = self.stream
        if stream is None:
            from .shard_stream import Cancelled

            raise Cancelled("the run was stopped")
        return stream.submit(self.units[shard], unit_done).result()

    def consumed(self) -> int:
        """Source bytes this worker's pipeline has consumed in this run (the driver's progress bar)."""
        return self.stream.consumed if self.stream is not None else 0

    def finish(self) -> dict:
        """End the run's pipeline; its statistics as plain data (stats.to_wire)."""
        from .stats import to_wire

        with self._lock:
            stream, self.stream = self.stream, None
        return to_wire(stream.close()) if stream is not None else {}

    def abort(self) -> None:
        """Stop the run's pipeline (another worker's error, Ctrl-C): units not written fail."""
        with self._lock:
            stream, self.stream = self.stream, None
        if stream is not None:
            stream.abort()


__all__ = ["UnitContext", "ShardWorker", "probe", "probe_name", "node_identity", "CONCURRENCY"]
