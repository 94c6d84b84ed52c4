"""What a run measured, in plain data: the statistics every executor returns (no torch).

:class:`RunStats` is filled by the compute stage of one pipeline. A scale-out run has several
pipelines (one per Ray worker, or per device of ``--device cuda:0,cuda:1``): each sends its
statistics back as a plain dict (:func:`to_wire`), and the driver adds them up (:func:`merge`)
without importing torch, so that a Ray driver never pays torch's import (seconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunStats:
    bytes_read: int = 0
    peak_inflight: int = 0
    peak_held: int = 0  # quantized MoE experts held for packing (one slice of a layer)
    baseline_rss: int = 0  # the process's RSS once the device was warm (host_memory.py), when counted
    pinned_trims: int = 0  # times the pinned host pool was given back to CUDA (host_memory.PinnedPool)
    warmed: int = 0  # source bytes the start-up warm-up asked the kernel to read ahead (prefetch.py)
    errors: dict = field(default_factory=dict)  # module -> ErrorStats (or a Summary: its summary() only)
    stages: dict = field(default_factory=dict)  # pipeline stage -> seconds (threads overlap)
    warnings: list = field(default_factory=list)  # printed by the caller after the run


@dataclass(frozen=True)
class Summary:
    """A module's error statistics as computed elsewhere: ``summary()`` is all the report reads."""

    fields: dict

    def summary(self) -> dict:
        return dict(self.fields)


def to_wire(stats: RunStats) -> dict:
    """`stats` as plain data (the error sums summarised), for another process to :func:`merge`."""
    return {"bytes_read": stats.bytes_read, "peak_inflight": stats.peak_inflight, "peak_held": stats.peak_held,
            "baseline_rss": stats.baseline_rss, "pinned_trims": stats.pinned_trims, "stages": dict(stats.stages),
            "warnings": list(stats.warnings), "errors": {m: e.summary() for m, e in stats.errors.items()}}


def merge(parts) -> RunStats:
    """One RunStats from several pipelines' (:class:`RunStats` or :func:`to_wire` dicts; None skipped).

    Bytes and stage seconds add up; peaks and the baseline are the largest one pipeline had (what a
    node must fit per worker); warnings are kept once each; a module's errors come from the first
    pipeline that reports it (a module cut by a shard boundary is quantized whole by both units)."""
    out = RunStats()
    for s in parts:
        if s is None:
            continue
        d = s if isinstance(s, dict) else to_wire(s) | {"errors": s.errors}
        out.bytes_read += d["bytes_read"]
        out.peak_inflight = max(out.peak_inflight, d["peak_inflight"])
        out.peak_held = max(out.peak_held, d.get("peak_held", 0))
        out.baseline_rss = max(out.baseline_rss, d["baseline_rss"])
        out.pinned_trims += d["pinned_trims"]
        out.warnings.extend(w for w in d["warnings"] if w not in out.warnings)
        for k, v in d["errors"].items():
            out.errors.setdefault(k, Summary(v) if isinstance(v, dict) else v)
        for k, v in d["stages"].items():
            out.stages[k] = round(out.stages.get(k, 0.0) + v, 3)
    return out


__all__ = ["RunStats", "Summary", "to_wire", "merge"]
