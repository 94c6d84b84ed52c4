"""What runs on the Ray workers: probe a node, compute a split group's amax, write one shard.

Each function is plain Python taking plain data (the plan, a :class:`~.partition.ShardUnit`), so
tests can call them directly; ``ray_executor`` wraps them with ``ray.remote`` on the driver. A
shard unit reuses the local pieces whole: :class:`~quantize_cli.run.execute.Executor` (its read, compute and write
stages; the driver's amax for groups split across shards), :class:`~quantize_cli.checkpoint.writer.ShardWriter`
(header first, writes at planned offsets) and the per-output digests the driver journals.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import struct
import tempfile
import time
from dataclasses import dataclass, field, replace

import torch

from ..checkpoint.safetensors_io import TensorInfo
from ..checkpoint.writer import ShardWriter
from ..errors import DestinationError, SourceError
from .execute import Executor, raise_non_finite
from ..modules.experts import read_rows
from .schedule import Schedule
from ..schemes.numerics import abs_max
from .partition import ShardUnit

AMAX_CHUNK = 256 << 20  # source bytes per read when computing a split group's amax
PROGRESS_EVERY = 32 << 20  # report consumed source bytes to the driver this often
LOCK_WAIT_S = 120  # a shard still locked by a dying worker of an earlier run gets this long


@dataclass
class UnitContext:
    """Everything a worker needs besides the plan and its unit (small, pickled per task).

    Attributes:
        folder: the work folder (DST's hidden ``.partial`` sibling) on shared storage.
        device: ``cpu`` or ``cuda`` (Ray assigns the GPU; it is ``cuda:0`` inside the task).
        hub: ``(repo_id, revision, low_disk)`` for a Hub source, else None.
        progress: ``(actor, run id)``, the actor having ``set(run, shard, bytes)``, or None.
    """

    folder: str
    device: str = "cpu"
    budget: int = 4 << 30
    measure: bool = False
    hub: tuple | None = None
    progress: object = None
    executor_sizes: dict = field(default_factory=dict)
    kernels: str = "auto"  # --kernels (kernel_choice.py)


def node_identity() -> dict:
    """Where this task runs: Ray node id and host name (for the report and error messages)."""
    node = ""
    try:
        import ray

        node = ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - called outside Ray in tests
        pass
    return {"node_id": node, "host": socket.gethostname()}


def probe(folder: str, token: str, source_files: list[str]) -> dict:
    """Write ``token`` into the work folder and check the source is readable, on this node.

    The driver then reads the token back: a DST that a node cannot reach (missing path, or a local
    disk of the same name) is refused before any shard is written.
    """
    where = node_identity()
    if not os.path.isdir(folder):
        raise DestinationError(f"{folder}: the work folder does not exist on node {where['host']}; "
                               f"DST must be on storage every Ray node can reach (NFS, a parallel file system)")
    try:
        with open(os.path.join(folder, f".ray-probe-{token}-{where['host']}"), "w") as f:
            f.write(token)
    except OSError as exc:
        raise DestinationError(f"{folder}: node {where['host']} cannot write the work folder ({exc.strerror}); "
                               f"DST must be on storage every Ray node can write") from exc
    for path in source_files:
        if not os.path.isfile(path):
            raise SourceError(f"{path}: not found on node {where['host']}; a local SRC must be on storage every Ray node "
                              f"can read (or pass a Hub repo id: each node fetches its shards)")
    return where


class HubCache:
    """Resolves ``hub://`` tensors to this node's Hugging Face cache (downloaded once per node)."""

    def __init__(self, repo_id: str, revision: str | None):
        self.repo_id, self.revision = repo_id, revision
        self.local: dict[str, tuple[str, int]] = {}
        self.peak_files = 0

    def resolve(self, info: TensorInfo) -> TensorInfo:
        if not info.path.startswith("hub://"):
            return info
        if info.path not in self.local:
            filename = info.path.rsplit("/", 1)[1]
            try:
                from huggingface_hub import hf_hub_download

                path = hf_hub_download(self.repo_id, filename, revision=self.revision)
            except Exception as exc:  # noqa: BLE001 - every Hub failure means the same here
                raise SourceError(f"{self.repo_id}:{filename}: download failed on {socket.gethostname()} "
                                  f"({type(exc).__name__}); rerun with --resume once the Hub is reachable") from exc
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
            self.local[info.path] = (path, 8 + n)
        path, data_start = self.local[info.path]
        return replace(info, path=path, offset=data_start + info.offset)

    def release(self, info: TensorInfo) -> None:
        """Files stay in the node's cache for the next task that needs them."""


def _resolver(hub, reads):
    """The source resolver for a Hub source: the node cache, or (--low-disk) a per-task scratch
    folder holding one source shard at a time. Returns ``(resolver, scratch folder or None)``."""
    if not hub:
        return None, None
    repo, revision, low_disk = hub
    if not low_disk:
        return HubCache(repo, revision), None
    from ..checkpoint.hub import LazyShards

    scratch = tempfile.mkdtemp(prefix="quantize-src-")
    return LazyShards(repo, revision, scratch, reads), scratch


def group_amax(infos: list[TensorInfo], hub=None) -> torch.Tensor:
    """0-d fp32 max |w| over every member of a fused group (exact; as the executor computes it).

    Raises NumericsError naming the first member holding NaN/Inf.
    """
    from ..plan.build import Member
    from .pipeline import Read

    resolver, scratch = _resolver(hub, [Read(i, 0, i.shape[0]) for i in infos])
    try:
        amaxes = []
        for info in infos:
            src = resolver.resolve(info) if resolver else info
            rows = max(1, AMAX_CHUNK // max(1, info.nbytes // max(info.shape[0], 1)))
            amax = torch.zeros(())
            for start in range(0, info.shape[0], rows):
                amax = torch.maximum(amax, abs_max(read_rows(src, start, min(rows, info.shape[0] - start))).float())
            if resolver:
                resolver.release(info)
            if not torch.isfinite(amax).item():
                raise_non_finite(src)
            amaxes.append(amax)
        return torch.stack(amaxes).amax()
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


class _Progress:
    """Batches consumed-byte counts into occasional fire-and-forget actor calls."""

    def __init__(self, progress, shard: int):
        self.progress, self.shard, self.total, self.sent = progress, shard, 0, 0
        self._call(0)

    def _call(self, n: int) -> None:
        if self.progress is not None:
            actor, run = self.progress
            actor.set.remote(run, self.shard, n)

    def __call__(self, n: int) -> None:
        self.total += n
        if self.total - self.sent >= PROGRESS_EVERY:
            self.sent = self.total
            self._call(self.total)

    def finish(self) -> None:
        self._call(self.total)


def _lock(path: str) -> int:
    """An exclusive lock on the shard file: a worker of a dead earlier run must stop writing first."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise DestinationError(f"{path}: still locked by another writer after {LOCK_WAIT_S} s; "
                                       f"stop the other run and rerun with --resume") from None
            time.sleep(0.2)


def run_unit(plan, unit: ShardUnit, ctx: UnitContext, unit_done: frozenset = frozenset(), *amax_values) -> dict:
    """Write output shard ``unit.shard`` into ``ctx.folder``; return the digest of every output tensor
    written, per plan task (``parts``), and where/how fast.

    `unit_done`: indices into ``unit.tasks`` already complete (resume: their bytes are kept).
    `amax_values`: the shared amax of each group in ``unit.needs_amax``, in that order (top-level
    arguments, so Ray resolves them and starts the task once they exist; None for a done task)."""
    amaxes = {i: a for i, a in zip(unit.needs_amax, amax_values) if a is not None}
    t0 = time.perf_counter()
    name = plan.shard_names[unit.shard]
    result = {"shard": name, "index": unit.shard, "bytes_in": unit.bytes_in, **node_identity()}
    lock = _lock(os.path.join(ctx.folder, name))
    try:
        stats, parts = _write_unit(plan, unit, amaxes, ctx, unit_done)
    finally:
        os.close(lock)
    return {**result, "parts": parts, "skipped": False, "seconds": time.perf_counter() - t0, "stats": stats}


def _write_unit(plan, unit: ShardUnit, amaxes, ctx: UnitContext, unit_done: frozenset):
    from .kernel_choice import quantize_fn

    device = torch.device("cuda" if ctx.device.startswith("cuda") else "cpu")
    writer = ShardWriter(ctx.folder, plan.outputs, plan.shard_names, only={unit.shard})
    fixed = {m.module: amaxes[i] for i, t in unit.tasks if i in amaxes for m in t.members}
    index_of = [i for i, _ in unit.tasks]  # unit task k -> plan task index
    parts: dict[int, dict[str, str]] = {}
    progress = _Progress(ctx.progress, unit.shard)
    unit_plan = replace(plan, tasks=[t for _, t in unit.tasks])
    sizes = ctx.executor_sizes
    reads = Schedule(unit_plan, **sizes).reads(t for k, t in enumerate(unit_plan.tasks) if k not in unit_done)
    resolver, scratch = _resolver(ctx.hub, reads)
    # The local executor's stages, with the shared amax of split groups supplied by the driver.
    executor = Executor(unit_plan, writer, device, **sizes,
                        quantize_fn=quantize_fn(ctx.kernels, device, None, plan.format.reference_math_only),
                        measure_error=ctx.measure, progress=progress, done=unit_done,
                        on_task_parts=lambda k, got: parts.__setitem__(index_of[k], got),
                        resolver=resolver, fixed_amax=fixed, process_budget=ctx.budget)  # the task process's own memory counts
    writer.open(fresh=not unit_done)
    try:
        stats = executor.run()
        writer.close(sync=True)
    finally:
        writer.close(sync=False)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    progress.finish()
    return stats, parts


__all__ = ["UnitContext", "probe", "group_amax", "run_unit"]
