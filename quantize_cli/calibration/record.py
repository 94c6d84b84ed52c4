"""What calibration did, recorded in a model card where no document of the format holds it
(compressed-tensors outputs; GPTQ / smoothed weights): HTML comments, invisible when rendered,
written by output/card.py. The data (spec, sha256, ...) is read by ``quantize eval`` for its
calibration-overlap check; the weights method (``--rounding`` / ``--smooth``) by ``quantize verify
--source`` on a compressed-tensors output, whose config.json has no field for it (ModelOpt's
hf_quant_config.json records it itself). Torch-free."""

from __future__ import annotations

import json
import os
import re

DATA_COMMENT = re.compile(r"^<!-- quantize calibration data: (\{.*\}) -->$", re.M)
METHOD_COMMENT = re.compile(r"^<!-- quantize weights method: (\{.*\}) -->$", re.M)


def data_comment(data: dict) -> str:
    """The comment line for `data` (spec, sha256, samples, seq_len: what the overlap check reads)."""
    keep = {k: data[k] for k in ("spec", "sha256", "samples", "seq_len") if data.get(k) is not None}
    return f"<!-- quantize calibration data: {json.dumps(keep, sort_keys=True)} -->"


def _read(pattern: re.Pattern, text: str) -> dict | None:
    """The JSON object of `pattern`'s comment in `text`, or None (absent or malformed)."""
    found = pattern.search(text)
    try:
        record = json.loads(found.group(1)) if found else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def read_data_comment(text: str) -> dict | None:
    """The data record in card `text`, or None."""
    record = _read(DATA_COMMENT, text)
    return record if record and record.get("spec") else None


def method_comment(method: dict) -> str:
    """The comment line for the weights method (``{"rounding": "gptq", "smooth": "awq"}``, defaults left out)."""
    keep = {k: str(v) for k, v in method.items() if k in ("rounding", "smooth") and v not in (None, "none", "nearest")}
    return f"<!-- quantize weights method: {json.dumps(keep, sort_keys=True)} -->"


def read_method_comment(text: str) -> dict | None:
    """The weights method in card `text` (``{}``: round to nearest, no smoothing), or None when the card has no record."""
    return _read(METHOD_COMMENT, text)


def from_card(folder: str, reader) -> dict | None:
    """`reader` (:func:`read_data_comment`, :func:`read_method_comment`) applied to `folder`'s README.md;
    None when there is no card."""
    try:
        with open(os.path.join(folder, "README.md"), encoding="utf-8", errors="replace") as f:
            return reader(f.read(1 << 20))
    except OSError:
        return None
