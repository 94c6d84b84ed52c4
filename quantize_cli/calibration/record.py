"""The calibration data's record in a model card, where no document of the format holds it
(compressed-tensors outputs; GPTQ / smoothed weights): an HTML comment, invisible when rendered,
written by output/card.py and read by ``quantize eval`` for its calibration-overlap check. Torch-free."""

from __future__ import annotations

import json
import re

DATA_COMMENT = re.compile(r"^<!-- quantize calibration data: (\{.*\}) -->$", re.M)


def data_comment(data: dict) -> str:
    """The comment line for `data` (spec, sha256, samples, seq_len: what the overlap check reads)."""
    keep = {k: data[k] for k in ("spec", "sha256", "samples", "seq_len") if data.get(k) is not None}
    return f"<!-- quantize calibration data: {json.dumps(keep, sort_keys=True)} -->"


def read_data_comment(text: str) -> dict | None:
    """The record in card `text`, or None."""
    found = DATA_COMMENT.search(text)
    try:
        record = json.loads(found.group(1)) if found else None
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("spec") else None
