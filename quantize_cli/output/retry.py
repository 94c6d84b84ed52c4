"""Idempotent retries: ``convert --resume`` on a DST that is already finished.

A CI retry loop reruns the same command after any failure, including a ``kill -9`` that landed
after the final rename. That rerun must not fail with "already exists". Every finished output
keeps a hidden ``.quantize-checksums`` file: how it was made (:func:`run_record`: the options that
decide the bytes, the source, the resume fingerprint) and the journal's CRC of every task. On
``--resume`` with DST present and no interrupted work beside it (:func:`check_finished`):

- other options or another source -> refused, naming what differs (``--overwrite`` rebuilds);
- the same -> the config files must equal what this run would write, every shard's header and
  size the plan's, the index the planned weight map, and every task's bytes its recorded CRC
  (when the checksums file is gone, everything but the CRCs is still checked); then the run says
  "already complete" and succeeds without writing anything.
"""

from __future__ import annotations

import json
import os

from ..checkpoint.durable import write_atomic
from ..checkpoint.writer import shard_header
from ..errors import DestinationError, QuantizeError
from ..jsonfile import read_json_or_none

CHECKSUMS = ".quantize-checksums"
# The options recorded and compared, with the flag that sets each (for the message).
RECORDED = {"algo": "--algo", "exclude": "--exclude", "recipe": "--recipe", "layout": "--layout",
            "kv_cache_dtype": "--kv-cache-dtype", "max_shard_size": "--max-shard-size", "format": "--format",
            "algo_for": "--algo-for", "scale_search": "--scale-search", "calibration": "--calib-data / --act-scales"}
# What an option missing from a record (an output sealed before it was recorded) stood for.
_DEFAULTS = {"format": "modelopt", "algo_for": [], "scale_search": "none", "calibration": None}
_FIX = "pass --overwrite to replace it, or choose another -o"


def run_record(options: dict, fp: str, source: str) -> dict:
    """How an output is made: the options that decide its bytes, the source, the resume fingerprint."""
    return {"options": {k: options.get(k, _DEFAULTS.get(k)) for k in RECORDED}, "source": source, "fingerprint": fp}


def seal(folder: str, record: dict) -> None:
    """At the end of a run: the journal's CRCs (in task order) and `record` into CHECKSUMS; drop the resume state."""
    from .resume import JOURNAL, read_journal, remove_files

    crcs = read_journal(os.path.join(folder, JOURNAL))
    doc = {"run": record, "tasks": [crcs.get(i) for i in range(max(crcs, default=-1) + 1)]}
    write_atomic(os.path.join(folder, CHECKSUMS), (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
    remove_files(folder)


def finished_dst(dst: str | None) -> bool:
    """True when DST is a folder holding an output and no interrupted work sits beside it."""
    if not dst or not os.path.isdir(dst) or os.path.islink(dst):
        return False
    path = os.path.abspath(dst)
    partial = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.partial")
    if os.path.isdir(partial):
        return False
    if os.path.isfile(os.path.join(path, "hf_quant_config.json")):  # ModelOpt
        return True
    config = read_json_or_none(os.path.join(path, "config.json"))  # compressed-tensors: config.json alone
    return isinstance(config, dict) and isinstance(config.get("quantization_config"), dict) \
        and config["quantization_config"].get("quant_method") == "compressed-tensors"


def check_finished(dst: str, plan, record: dict, docs: dict[str, dict]) -> int:
    """Confirm that DST is exactly what this run (`record`, config `docs`: file name -> document) would write.

    Returns the number of task checksums verified (0 when the checksums file is gone). Raises
    :class:`DestinationError` naming the difference: an option, the source, or damaged files.
    """
    sums = read_json_or_none(os.path.join(dst, CHECKSUMS))
    run = sums.get("run") if isinstance(sums, dict) else None
    if isinstance(run, dict) and isinstance(run.get("options"), dict):
        for key, flag in RECORDED.items():
            made = run["options"].get(key, _DEFAULTS.get(key))
            if made != record["options"][key]:
                raise DestinationError(
                    f"{dst}: already exists, made with {flag} {_show(made)}, "
                    f"this run asks for {_show(record['options'][key])}; {_FIX}"
                )
        if run.get("source") != record["source"]:
            raise DestinationError(f"{dst}: already exists, made from {run.get('source')!r}, this run reads {record['source']!r}; {_FIX}")
        if run.get("fingerprint") != record["fingerprint"]:
            raise DestinationError(f"{dst}: already exists with the same options, but the source files or the converter version changed since; {_FIX}")
    try:
        _check_configs(dst, docs)
        starts = _check_shards(dst, plan)
        if not isinstance(sums, dict):
            return 0
        return _check_crcs(dst, plan, sums.get("tasks"), starts)
    except QuantizeError as exc:
        raise DestinationError(f"{dst}: already exists, but {exc.message}; {_FIX}") from None


def confirm_finished(plan, dst: str, options: dict, source_id: str, docs: dict[str, dict], say) -> str:
    """The whole --resume-on-a-finished-DST step: check (:func:`check_finished`), say so, return DST's path."""
    from .resume import fingerprint

    path = os.path.abspath(dst)
    checked = check_finished(path, plan, run_record(options, fingerprint(plan, options), source_id), docs)
    how = f"{checked} task checksum(s) verified" if checked else "headers, sizes and index verified; no checksums recorded"
    say(f"{path}: already complete (same source and options; {how}); nothing to do")
    return path


def _show(value) -> str:
    if value in (None, [], ""):
        return "(none)"
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def _first_difference(got, want, path: str = "") -> str:
    """The first key path where two JSON documents differ (``quantization.quant_algo``)."""
    if isinstance(got, dict) and isinstance(want, dict):
        for k in sorted(set(got) | set(want), key=str):
            if got.get(k) != want.get(k):
                return _first_difference(got.get(k), want.get(k), f"{path}.{k}" if path else str(k))
    return f"{path or '(top)'} is {json.dumps(got)[:60]}, this run writes {json.dumps(want)[:60]}"


def _check_configs(dst: str, docs: dict[str, dict]) -> None:
    for name, want in docs.items():
        got = read_json_or_none(os.path.join(dst, name))
        if got is None:
            raise QuantizeError(f"its {name} is missing or not JSON")
        if got != want:
            raise QuantizeError(f"its {name} differs from this run's: {_first_difference(got, want)}")


def _check_shards(dst: str, plan) -> list[int]:
    """Every planned shard with the exact header and size this run writes, and the index; data starts."""
    per_shard: list[list] = [[] for _ in plan.shard_names]
    for o in sorted(plan.outputs.values(), key=lambda o: o.offset):
        per_shard[o.shard].append(o)
    starts = []
    for name, tensors in zip(plan.shard_names, per_shard):
        header = shard_header(tensors)
        size = len(header) + sum(t.nbytes for t in tensors)
        try:
            with open(os.path.join(dst, name), "rb") as f:
                same = f.read(len(header)) == header and os.fstat(f.fileno()).st_size == size
        except OSError:
            raise QuantizeError(f"its shard {name} is missing or unreadable") from None
        if not same:
            raise QuantizeError(f"its shard {name} has another header or size than this run writes")
        starts.append(len(header))
    if len(plan.shard_names) > 1:
        doc = read_json_or_none(os.path.join(dst, "model.safetensors.index.json"))
        want = {n: plan.shard_names[o.shard] for n, o in plan.outputs.items()}
        if not isinstance(doc, dict) or doc.get("weight_map") != want:
            raise QuantizeError("its model.safetensors.index.json is missing or does not map the planned tensors to the planned shards")
    return starts


def _check_crcs(dst: str, plan, tasks, starts: list[int]) -> int:
    from .resume import _crc_on_disk

    if not isinstance(tasks, list) or len(tasks) != len(plan.tasks):
        raise QuantizeError(f"its {CHECKSUMS} does not list one checksum per task")
    view = _Files(dst, plan, starts)
    for task, crc in zip(plan.tasks, tasks):
        if _crc_on_disk(view, list(task.outputs)) != crc:
            names = ", ".join(sorted(task.outputs)[:2])
            raise QuantizeError(f"the bytes of {names} differ from the checksums recorded when they were written")
    return len(plan.tasks)


class _Files:
    """What :func:`resume._crc_on_disk` needs of a writer, for a finished folder."""

    def __init__(self, folder: str, plan, starts: list[int]):
        self.outputs, self._paths, self._starts = plan.outputs, [os.path.join(folder, n) for n in plan.shard_names], starts

    def paths(self) -> list[str]:
        return self._paths

    def data_start(self, shard: int) -> int:
        return self._starts[shard]


__all__ = ["CHECKSUMS", "run_record", "seal", "finished_dst", "check_finished", "confirm_finished"]
