"""The packed layout a finished output records (``hf_quant_config.json`` ``converter.layout``),
read torch-free: ``quantize unpack`` refuses a folder with none before importing torch."""

from __future__ import annotations

import os

from ..errors import SourceError
from ..jsonfile import JsonFileError, load_json, read_json_or_none


def layout_record(folder: str) -> tuple[dict, dict, dict]:
    """``(hf_quant_config, config, layout record)`` of packed output `folder`, or the SourceError that
    says why it has none to unpack (torch-free: ``unpack`` refuses before importing torch, issue 36)."""
    from . import MODELOPT, format_of_config

    fmt = format_of_config(_read_config(folder))
    if fmt is not None and fmt is not MODELOPT:  # packed layouts are written in the ModelOpt format only
        raise SourceError(f"{folder}: a {fmt.name} checkpoint has no packed layout (the format is always plain); "
                          "nothing to unpack: load or verify it as it is")
    try:
        nested = load_json(os.path.join(folder, "hf_quant_config.json"), "hf_quant_config.json", fix="is it a quantize output?",
                           missing="is it a quantize output?")
        config = load_json(os.path.join(folder, "config.json"), "config.json", fix="is it a quantize output?",
                           missing="is it a quantize output?")
    except JsonFileError as exc:
        raise SourceError(exc.message) from None
    record = (nested.get("converter") or {}).get("layout")
    if not isinstance(record, dict) or record.get("name") in (None, "plain"):
        raise SourceError(f"{folder}: no packed layout is recorded in hf_quant_config.json; it is already a plain checkpoint")
    return nested, config, record


def _read_config(folder: str) -> dict | None:
    return read_json_or_none(os.path.join(folder, "config.json"))


__all__ = ["layout_record"]
