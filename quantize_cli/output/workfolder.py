"""The output's life in one object: DST checked, the hidden work folder, the journal, finishing, the seal, the commit.

Every executor writes through a :class:`WorkFolder` (it receives ``partial``, the tasks already
``done`` and ``journal.append``); everything else about the output happens here, the same way
whichever executor produced the bytes:

1. ``WorkFolder(dst, ...)``: DST is checked before anything is read (exists without
   ``--overwrite``, inside the source, a missing parent);
2. :meth:`open`: the lock and the work folder ``.DST.partial``; on ``--resume`` the earlier run's
   identity is compared first (a refusal names the option that differs and touches nothing), then
   its journaled tasks are verified on disk; a fresh run records its identity and starts the journal;
3. :meth:`finish`: every shard has its planned size and header, the index, the format's documents
   (atomically, fsynced), the sidecar files;
4. the caller verifies the work folder (``--verify``) and writes the card (:meth:`write_card`);
5. :meth:`seal` keeps the identity and every task's digest in ``.quantize-checksums`` (what makes
   a later ``--resume`` of the finished DST idempotent), :meth:`commit` renames the folder to DST.

A finished DST is checked by :meth:`confirm_finished` (``--resume`` after success).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

from ..calibration.stage import WORK_DIR as TRANSFORM_DIR  # the GPTQ / smoothing stage's weights, keyed by what decides them
from ..checkpoint.durable import write_atomic
from ..errors import DestinationError, QuantizeError
from ..jsonfile import read_json_or_none
from .destination import Destination
from .journal import JOURNAL, Journal, ShardLayout, read_journal, verified_tasks

STATE = ".quantize-state.json"  # the interrupted run's identity record
CHECKSUMS = ".quantize-checksums"  # a finished output's identity record and task digests
SCRATCH = (".source-sidecars", ".source-shards", TRANSFORM_DIR)  # a Hub source's files fetched during the run; the stage's weights
_FIX = "pass --overwrite to replace it, or choose another -o"


def finished_dst(dst: str | None) -> bool:
    """True when DST is a folder holding a finished output and no interrupted work sits beside it."""
    from ..formats import FORMATS

    if not dst or not os.path.isdir(dst) or os.path.islink(dst):
        return False
    path = os.path.abspath(dst)
    if os.path.isdir(os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.partial")):
        return False
    config = read_json_or_none(os.path.join(path, "config.json"))
    return any(fmt.detect(config, path) for fmt in FORMATS.values())


class WorkFolder:
    """Owns DST for one run (see the module docstring). `src_root`: a local source folder (DST may
    not overlap it); `overwrite`: replace an existing DST once the new one is complete."""

    def __init__(self, dst: str, src_root: str | None = None, overwrite: bool = False):
        self.dest = Destination(dst, src_root=src_root, overwrite=overwrite)
        self.dst, self.partial = self.dest.dst, self.dest.partial
        self.journal: Journal | None = None
        self._claimed: dict[int, str] | None = None  # an earlier run's journal, until resume_tasks verifies it

    # --- start ----------------------------------------------------------------------------

    def open(self, identity, plan, resume: bool, say=lambda msg: None) -> set[int]:
        """Take DST's lock and its work folder; return the task indices already done and verified.

        Raises DestinationError naming the first difference when an earlier run's work of another
        identity is there and `resume` asks to continue it; nothing is changed then. A draft plan
        (GPTQ / smoothing: its stage runs under this lock and decides the final plan's tasks) gets
        no tasks here: :meth:`resume_tasks` verifies them once the final plan is known."""
        earlier = self.dest.acquire(resume=resume)
        if not earlier:
            if resume:
                say(f"--resume: no earlier work for {self.dst}; starting from the beginning")
            write_atomic(self.path(STATE), _json({"run": identity.record()}))
            self.journal = Journal(self.partial, truncate=True)
            return set()
        state = read_json_or_none(self.path(STATE))
        run = state.get("run") if isinstance(state, dict) else None
        diffs = identity.differences(run) if isinstance(run, dict) else None
        if diffs != []:
            self.dest.release()
            if diffs is None:
                why = f"its resume state ({STATE}) is missing or unreadable; rerun without --resume to start over"
            else:
                why = (f"the interrupted run there used {diffs[0]}; rerun with the earlier options, or without --resume "
                       "to start over")
            err = DestinationError(f"{self.partial}: {why} (nothing was changed)")
            err.quiet_keep = True  # the folder is kept, but "rerun with --resume" would be the wrong advice
            raise err
        self._claimed = read_journal(self.path(JOURNAL))
        if getattr(plan, "transform", None) is not None:
            return set()
        return self.resume_tasks(plan, say)

    def resume_tasks(self, plan, say=lambda msg: None) -> set[int]:
        """The earlier run's journaled tasks of `plan` whose bytes verify (the journal keeps those
        only); empty for a fresh run."""
        claimed = getattr(self, "_claimed", None)
        if claimed is None:
            return set()
        self._claimed = None
        done = verified_tasks(ShardLayout(self.partial, plan), plan, claimed)
        self.journal = Journal(self.partial, truncate=True)
        for i in sorted(done):  # the journal keeps the verified tasks only
            self.journal.append(i, claimed[i])
        skipped = sum(plan.tasks[i].bytes_in for i in done)
        from ..console import human_bytes

        say(f"resuming {self.dst}: {len(done)} of {len(plan.tasks)} tasks verified complete ({human_bytes(skipped)} of input)")
        return done

    def path(self, *parts: str) -> str:
        return os.path.join(self.partial, *parts)

    # --- finish ---------------------------------------------------------------------------

    def finish(self, plan) -> None:
        """After the executor: every shard as planned, the index, the format's documents, the sidecars."""
        from ..checkpoint.writer import write_index

        if self.journal is not None:
            self.journal.close()
        layout = ShardLayout(self.partial, plan)
        for shard, name in enumerate(plan.shard_names):
            why = layout.shard_problem(shard)
            if why:  # a Ray node wrote elsewhere, or the storage lost it: never published
                raise DestinationError(f"{self.path(name)}: {why} after its tasks finished; the storage is not shared or "
                                       f"not consistent between writers; rerun with --resume")
        try:
            if len(plan.shard_names) > 1:
                write_index(self.partial, plan.outputs, plan.shard_names)
            for name, data in plan.format.documents(plan).items():
                write_atomic(self.path(name), data)
            self._copy_sidecars(plan)
        except OSError as exc:
            raise DestinationError(f"{self.partial}: finishing the output failed ({exc.strerror or exc}); free disk space "
                                   f"and rerun with --resume") from exc

    def _copy_sidecars(self, plan) -> None:
        from ..checkpoint.sidecars import copy_sidecars  # sub-folders too (sentence-transformers' 1_Pooling/): the rule is there

        copy_sidecars(plan.source.root, plan.source.sidecars, self.partial)

    def write_card(self, text: str) -> None:
        """The model card, fsynced before the rename that publishes DST."""
        from .card import CARD_NAME

        try:
            write_atomic(self.path(CARD_NAME), text.encode("utf-8"))
        except OSError as exc:
            raise DestinationError(f"{self.path(CARD_NAME)}: cannot write the model card ({exc.strerror}); check space "
                                   "and permissions") from exc

    def seal(self, identity, plan) -> None:
        """The identity and every task's digest into CHECKSUMS; the resume state and scratch go."""
        digests = read_journal(self.path(JOURNAL))
        missing = [i for i in range(len(plan.tasks)) if i not in digests]
        if missing:  # an executor that returned without journaling a task: never publish it
            raise DestinationError(f"{self.partial}: {len(missing)} task(s) were not journaled (e.g. task {missing[0]}); "
                                   "rerun with --resume")
        documents = {name: hashlib.sha256(data).hexdigest() for name, data in plan.format.documents(plan).items()}
        doc = {"run": identity.record(), "tasks": [digests[i] for i in range(len(plan.tasks))], "documents": documents,
               "task_outputs": [sorted(t.outputs) for t in plan.tasks]}
        write_atomic(self.path(CHECKSUMS), _json(doc))
        for name in (STATE, JOURNAL):
            try:
                os.unlink(self.path(name))
            except FileNotFoundError:
                pass
        for scratch in SCRATCH:
            shutil.rmtree(self.path(scratch), ignore_errors=True)

    def commit(self) -> None:
        self.dest.commit()

    # --- failures -------------------------------------------------------------------------

    def keep_for_resume(self, say, exc: BaseException | None = None) -> None:
        """After a failure or interruption keep the (hidden, never finished-looking) work folder;
        said only when the folder is this run's (not another live run's, whose lock refused us)."""
        if self.journal is not None:
            self.journal.close()
        owned = self.dest.acquired
        self.dest.release()
        if owned and os.path.isdir(self.partial) and not getattr(exc, "quiet_keep", False):
            say(f"partial work kept in {self.partial}; rerun with --resume to continue, or delete it")

    def discard(self) -> None:
        if self.journal is not None:
            self.journal.close()
        self.dest.discard()

    def set_aside(self, tag: str) -> str:
        shutil.rmtree(self.path(TRANSFORM_DIR), ignore_errors=True)  # kept for inspection: the output, not the stage's inputs
        return self.dest.set_aside(tag)

    # --- a finished DST -------------------------------------------------------------------

    @staticmethod
    def confirm_finished(dst: str, identity, plan, say) -> str:
        """--resume on a finished DST: it must be exactly what this run writes. Returns DST's path.

        Compared: the identity recorded at the seal (a difference is named), the format's documents,
        every shard's header and size, the index and every task's digest (when the seal is gone,
        all but the digests). A draft plan (GPTQ / smoothing, whose weights its identity decides but
        which are not computed again) has its documents compared with the digests sealed with them.
        Raises DestinationError naming what differs."""
        path = os.path.abspath(dst)
        sums = read_json_or_none(os.path.join(path, CHECKSUMS))
        run = sums.get("run") if isinstance(sums, dict) else None
        if isinstance(run, dict):
            diffs = identity.differences(run)
            if diffs:
                raise DestinationError(f"{dst}: already exists, made with {diffs[0]}; {_FIX}")
        elif getattr(plan, "transform", None) is not None:  # the weights' request is in the seal only
            raise DestinationError(f"{dst}: already exists without its {CHECKSUMS} (the record of how it was made: a Hub "
                                   "download has none); the GPTQ / smoothing weights it holds cannot be confirmed without it; "
                                   f"{_FIX}")
        elif not getattr(plan.format, "documents_record_run", False):  # issue 35 item 8: nothing says how it was made
            raise DestinationError(f"{dst}: already exists without its {CHECKSUMS} (the record of how it was made: a Hub "
                                   f"download has none), and {plan.format.name}'s documents do not record the calibration "
                                   f"or weight options that decide its bytes, so it cannot be confirmed complete; {_FIX}")
        try:
            if getattr(plan, "transform", None) is not None:  # a draft: the final layout is known from the seal only
                checked = _check_sealed(path, sums)
                say(f"{path}: already complete (same source, options and GPTQ / smoothing inputs; {checked} task checksum(s) "
                    "verified); nothing to do")
                return path
            _check_documents(path, plan)
            layout = ShardLayout(path, plan)
            for shard, name in enumerate(plan.shard_names):
                why = layout.shard_problem(shard)
                if why:
                    raise QuantizeError(f"its shard {name} {why}")
            _check_index(path, plan)
            checked = _check_digests(layout, plan, sums.get("tasks")) if isinstance(sums, dict) else 0
        except QuantizeError as exc:
            raise DestinationError(f"{dst}: already exists, but {exc.message}; {_FIX}") from None
        how = f"{checked} task checksum(s) verified" if checked else "headers, sizes and index verified; no checksums recorded"
        say(f"{path}: already complete (same source and options; {how}); nothing to do")
        return path


def _json(doc: dict) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def _first_difference(got, want, path: str = "") -> str:
    """The first key path where two JSON documents differ (``quantization.quant_algo``)."""
    if isinstance(got, dict) and isinstance(want, dict):
        for k in sorted(set(got) | set(want), key=str):
            if got.get(k) != want.get(k):
                return _first_difference(got.get(k), want.get(k), f"{path}.{k}" if path else str(k))
    return f"{path or '(top)'} is {json.dumps(got)[:60]}, this run writes {json.dumps(want)[:60]}"


def _check_documents(folder: str, plan) -> None:
    for name, data in plan.format.documents(plan).items():
        got, want = read_json_or_none(os.path.join(folder, name)), json.loads(data)
        if got is None:
            raise QuantizeError(f"its {name} is missing or not JSON")
        if got != want:
            raise QuantizeError(f"its {name} differs from this run's: {_first_difference(got, want)}")


def _check_sealed(folder: str, sums: dict) -> int:
    """A finished output against its own seal: every document's sha256, and every task's digest
    over the tensors the safetensors headers on disk place (every tensor there is some task's)."""
    from ..checkpoint.safetensors_header import read_header
    from ..run import checksum

    _check_sealed_documents(folder, sums.get("documents"))
    outputs, digests = sums.get("task_outputs"), sums.get("tasks")
    if not isinstance(outputs, list) or not isinstance(digests, list) or len(outputs) != len(digests):
        raise QuantizeError(f"its {CHECKSUMS} does not list its tasks' tensors (written by an older quantize)")
    index = read_json_or_none(os.path.join(folder, "model.safetensors.index.json"))
    files = sorted(set(index["weight_map"].values())) if isinstance(index, dict) and isinstance(index.get("weight_map"), dict) \
        else ["model.safetensors"]
    tensors = {}
    for name in files:
        try:
            tensors.update(read_header(os.path.join(folder, name)).tensors)
        except (OSError, QuantizeError):
            raise QuantizeError(f"its shard {name} is missing or not safetensors") from None
    if set(tensors) != {n for names in outputs for n in names}:
        raise QuantizeError("its shards hold other tensors than the ones sealed")
    for names, digest in zip(outputs, digests):
        parts = {n: checksum.file_range(tensors[n].path, tensors[n].offset, tensors[n].nbytes) for n in names}
        if any(v is None for v in parts.values()) or checksum.task_digest(parts) != digest:
            raise QuantizeError(f"the bytes of {', '.join(names[:2])} differ from the checksums recorded when they were written")
    return len(digests)


def _check_sealed_documents(folder: str, sealed) -> None:
    if not isinstance(sealed, dict) or not sealed:
        raise QuantizeError(f"its {CHECKSUMS} records no digests of its documents (written by an older quantize)")
    for name, digest in sorted(sealed.items()):
        try:
            with open(os.path.join(folder, name), "rb") as f:
                got = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            raise QuantizeError(f"its {name} is missing") from None
        if got != digest:
            raise QuantizeError(f"its {name} differs from the one sealed with it")


def _check_index(folder: str, plan) -> None:
    if len(plan.shard_names) > 1:
        doc = read_json_or_none(os.path.join(folder, "model.safetensors.index.json"))
        want = {n: plan.shard_names[o.shard] for n, o in plan.outputs.items()}
        if not isinstance(doc, dict) or doc.get("weight_map") != want:
            raise QuantizeError("its model.safetensors.index.json is missing or does not map the planned tensors to the planned shards")


def _check_digests(layout: ShardLayout, plan, tasks) -> int:
    if not isinstance(tasks, list) or len(tasks) != len(plan.tasks):
        raise QuantizeError(f"its {CHECKSUMS} does not list one checksum per task")
    for task, digest in zip(plan.tasks, tasks):
        if layout.task_digest_on_disk(task.outputs) != digest:
            names = ", ".join(sorted(task.outputs)[:2])
            raise QuantizeError(f"the bytes of {names} differ from the checksums recorded when they were written")
    return len(plan.tasks)


__all__ = ["WorkFolder", "finished_dst", "STATE", "CHECKSUMS"]
