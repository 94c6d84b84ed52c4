"""Refusals that need neither tensor data nor torch, made before torch is imported (issue 26).

``convert``'s usage errors used to wait for ``devices.resolve_device``, which imports torch
(1.5-3 s): a typo'd size or a missing SRC took seconds to say so. Everything here reads option
values, file names and small JSON files only, so a refusal returns in a fraction of a second.
The order is the user's: the source, then the data, then the destination (steps.check_options).

* :func:`check_source_path`: a local SRC that does not exist (or is a file), an unknown example;
* :func:`check_calibration`: ``--calib-samples`` / ``--calib-seq-len`` below 1 (0 used to mean
  "the default"), a path-like ``--calib-data`` that does not exist (it was taken for a dataset id);
* :func:`strict_refusal`: ``convert --strict``, every warning known before the first byte is an error
  unless ``--allow``'s codes name it (:func:`allowed_codes`, shared with ``check``).
"""

from __future__ import annotations

import os

from ..calibration.data import looks_like_a_file
from ..errors import CalibrationError, PlanError, UsageError
from ..problems import Finding

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
                      act_scales: str | None = None, scale_search: str | None = None) -> None:
    """The calibration options that can be refused from their values alone (exit 2, or 1 for a missing file)."""
    if act_scales is not None and (scale_search or "none").lower() != "none":
        from ..calibration.channels import named_sidecar

        sidecar = named_sidecar(act_scales)
        if sidecar is not None and not os.path.isfile(sidecar):  # the search's weights; the amax alone need no sidecar
            raise CalibrationError(f"--act-scales {act_scales} --scale-search {scale_search}: the search is weighted by the "
                                   f"per-channel statistics in {sidecar}, which is missing; put it back beside {act_scales} "
                                   "(the two files go together), or make both again with `quantize calibrate`")
    for flag, value in (("--calib-samples", calib_samples), ("--calib-seq-len", calib_seq_len)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UsageError(f"{flag} {value}: must be at least 1 (leave it out for the default)")
    if calib_data is None:
        if act_scales is None and (calib_samples is not None or calib_seq_len is not None):
            raise UsageError("--calib-samples / --calib-seq-len need --calib-data DATA")
        return
    if calib_data != "default" and not os.path.exists(calib_data) and looks_like_a_file(calib_data):
        raise CalibrationError(f"--calib-data {calib_data}: no such file; check the path (or give `default`, or a cached "
                               "Hugging Face dataset id owner/name)")
    if act_scales is not None:
        raise UsageError("--calib-data and --act-scales: give one (calibrate now, or reuse a scales file)")


def check_allow(strict: bool, allow) -> None:
    """``--allow CODE`` only means something with ``--strict`` (without it no warning refuses):
    given alone it is a usage error, so a CI line missing ``--strict`` is not silently lenient."""
    if allow and not strict:
        raise UsageError(f"--allow {' '.join(allow)}: it accepts warnings that --strict would refuse; add --strict, or drop --allow")


def allowed_codes(allow, warnings: list[Finding], note=None) -> set[str]:
    """``--allow CODE`` (repeatable; ``[code]`` as printed is taken too) -> the codes; `note` is told
    of any that matches no warning here (a typo, or a warning that went away)."""
    allowed = {str(a).strip().strip("[]").lower() for a in allow}
    unused = sorted(allowed - {f.code for f in warnings})
    if unused and note is not None:
        note(f"note: --allow {', '.join(unused)}: no such warning here")
    return allowed


def strict_refusal(warnings: list[Finding], what: str, allow=(), note=None) -> None:
    """``convert --strict``: refuse when there is any warning whose code is not in `allow`, before the
    first byte is read or written (``check --strict --allow`` decides the same way)."""
    allowed = allowed_codes(allow, warnings, note)
    refused = [f for f in warnings if not f.code or f.code not in allowed]  # a warning without a code cannot be allowed
    if refused:
        raise PlanError(f"--strict: {len(refused)} warning(s) before converting {what}; nothing was written "
                        "(fix them, accept one with --allow CODE, or drop --strict to convert anyway):",
                        details=[f"[{f.code}] {f.message}" if f.code else f.message for f in refused])


__all__ = ["check_source_path", "check_calibration", "check_allow", "allowed_codes", "strict_refusal"]
