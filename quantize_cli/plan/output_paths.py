"""Where ``--report`` / ``--json`` may write: checked in the first second, before any work.

A report path is a free-form string from the command line, so it must not become a way to
destroy something: it may not lie inside the source checkpoint or the destination (nor be one
of them), may not be a folder, device, FIFO or link, and may replace an existing file only
when that file is an earlier report of this tool. Its folder must already exist.
"""

from __future__ import annotations

import os

from ..errors import UsageError
from ..jsonfile import read_json_or_none

_MAX_REPORT_BYTES = 256 << 20


def _is_our_report(path: str) -> bool:
    """An earlier ``--report`` (converter name quantize + status), check / verify / eval ``--json`` document, or
    ``quantize calibrate``'s SCALES.json (rerunning a calibration into the same file replaces it)."""
    doc = read_json_or_none(path, max_bytes=_MAX_REPORT_BYTES)
    if doc is None:
        return False
    conv = doc.get("converter")
    if doc.get("format") == "quantize-act-scales":  # calibration/document.py's FORMAT
        return True
    return doc.get("command") in ("check", "verify", "eval") or (isinstance(conv, dict) and conv.get("name") == "quantize" and "status" in doc)


def check_json_output(path: str, flag: str, protected: tuple[str | None, ...] = ()) -> None:
    """Refuse (exit 2) a `flag` path that could destroy data; `protected`: SRC / DST folders it must stay out of."""
    full = os.path.abspath(path)
    folder = os.path.dirname(full)
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise UsageError(f"{flag} {path}: folder {folder} does not exist or is not writable; create it or choose another path")
    real = os.path.join(os.path.realpath(folder), os.path.basename(full))
    for root in protected:
        if not root:
            continue
        base = os.path.realpath(root)
        if os.path.commonpath([real, base]) == base or real == base:
            raise UsageError(f"{flag} {path}: is inside {root}, a checkpoint this run reads or writes; write it elsewhere")
    if os.path.islink(full) or (os.path.lexists(full) and not os.path.isfile(full)):
        raise UsageError(f"{flag} {path}: exists and is not a regular file (a folder, device, FIFO or link); choose another path")
    if os.path.exists(full) and not _is_our_report(full):
        raise UsageError(f"{flag} {path}: exists and is not a report written by quantize; remove it or choose another path")
