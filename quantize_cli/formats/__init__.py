"""Output formats, one object each: ModelOpt (the default) and compressed-tensors.

A format decides the tensors written per quantized Linear (its schemes), the metadata documents,
its exclusion list and how vLLM reads it, how a finished checkpoint is recognised and verified, and
which engines serve it (the card). The plan, validation and the executors are shared and ask the
format object (``plan.format``); nothing else tests which format it holds. See formats/base.py.
"""

from __future__ import annotations

import os

from ..errors import UsageError
from .base import Format, Served
from .compressed_tensors import COMPRESSED_TENSORS, CT_SCHEMES
from .modelopt import MODELOPT

FORMATS: dict[str, Format] = {f.name: f for f in (MODELOPT, COMPRESSED_TENSORS)}


def format_named(name: str | None) -> Format:
    """The format called `name` (``modelopt``, ``compressed-tensors``; ``_`` for ``-``); a UsageError names the choices."""
    key = (name or MODELOPT.name).lower().replace("_", "-")
    if key not in FORMATS:
        raise UsageError(f"--format {name!r}: choose {' or '.join(FORMATS)}")
    return FORMATS[key]


def detect_output(folder: str) -> tuple[Format, dict | None]:
    """The format a written checkpoint folder is in (ModelOpt when none says otherwise, so that its
    verify names the missing documents), and its config.json (None when unreadable)."""
    from ..jsonfile import read_json_or_none

    config = read_json_or_none(os.path.join(folder, "config.json"))
    for fmt in (COMPRESSED_TENSORS, MODELOPT):
        if fmt.detect(config, folder):
            return fmt, config
    return MODELOPT, config


def format_of_config(config: dict | None) -> Format | None:
    """The format a config.json's ``quantization_config`` names (None: not quantized by a known format)."""
    method = ((config or {}).get("quantization_config") or {}).get("quant_method")
    return next((f for f in FORMATS.values() if f.config_method == method), None)


__all__ = ["FORMATS", "Format", "Served", "MODELOPT", "COMPRESSED_TENSORS", "CT_SCHEMES", "format_named", "detect_output",
           "format_of_config"]
