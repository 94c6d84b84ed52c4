"""Refusals that need neither tensor data nor torch, made before torch is imported (issue 26).

``convert``'s usage errors used to wait for ``devices.resolve_device``, which imports torch
(1.5-3 s): a typo'd size or a missing SRC took seconds to say so. Everything here reads option
values, file names and small JSON files only, so a refusal returns in a fraction of a second.
The order is the user's: the source, then the data, then the destination (steps.check_options).

* :func:`check_source_path`: a local SRC that does not exist (or is a file), an unknown example;
* :func:`check_calibration`: ``--calib-samples`` / ``--calib-seq-len`` below 1 (0 used to mean
  "the default"), a path-like ``--calib-data`` that does not exist (it was taken for a dataset id);
* :func:`strict_refusal`: ``convert --strict``, every warning known before the first byte is an error.
"""

from __future__ import annotations

import os

from ..calibration.data import looks_like_a_file
from ..errors import CalibrationError, PlanError, UsageError

def check_source_path(src: str) -> None:
    """Refuse a SRC that is neither an existing folder, an example name nor a Hub repo id.

    The messages are :func:`~quantize_cli.checkpoint.source.resolve_path`'s, which runs later
    (and downloads a Hub SRC); nothing is read here."""
    if src.startswith("example:"):
        from ..checkpoint.examples import check_name

        return check_name(src.split(":", 1)[1])
    from ..checkpoint.source import refuse_missing

    refuse_missing(src)


def check_calibration(calib_data: str | None, calib_samples: int | None, calib_seq_len: int | None,
                      act_scales: str | None = None) -> None:
    """The calibration options that can be refused from their values alone (exit 2, or 1 for a missing file)."""
    for flag, value in (("--calib-samples", calib_samples), ("--calib-seq-len", calib_seq_len)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UsageError(f"{flag} {value}: must be at least 1 (leave it out for the default)")
    if act_scales is not None:
        _channels_beside(act_scales)
    if calib_data is None:
        if act_scales is None and (calib_samples is not None or calib_seq_len is not None):
            raise UsageError("--calib-samples / --calib-seq-len need --calib-data DATA")
        return
    if calib_data != "default" and not os.path.exists(calib_data) and looks_like_a_file(calib_data):
        raise CalibrationError(f"--calib-data {calib_data}: no such file; check the path (or give `default`, or a cached "
                               "Hugging Face dataset id owner/name)")
    if act_scales is not None:
        raise UsageError("--calib-data and --act-scales: give one (calibrate now, or reuse a scales file)")


def _channels_beside(act_scales: str) -> None:
    """A scales JSON whose per-channel statistics file is missing, refused before torch naming both
    files (issue 35: it was refused after torch loaded). Only that: the JSON's other checks need the source."""
    from ..jsonfile import read_json_or_none

    doc = read_json_or_none(act_scales) if os.path.isfile(act_scales) else None
    block = doc.get("channels") if isinstance(doc, dict) else None
    name = block.get("file") if isinstance(block, dict) else None
    if isinstance(name, str) and name and os.path.basename(name) == name:
        path = os.path.join(os.path.dirname(act_scales) or ".", name)
        if not os.path.isfile(path):
            raise CalibrationError(f"--act-scales {act_scales}: its per-channel statistics {path} are missing; keep the two "
                                   "files `quantize calibrate` wrote together (copy both), or run calibrate again")


def strict_refusal(warnings: list[str], what: str) -> None:
    """``--strict``: refuse when there is any warning, before the first byte is read or written."""
    if warnings:
        raise PlanError(f"--strict: {len(warnings)} warning(s) before converting {what}; nothing was written "
                        "(fix them, or drop --strict to convert anyway):", details=list(warnings))


__all__ = ["check_source_path", "check_calibration", "strict_refusal"]
