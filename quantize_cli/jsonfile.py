"""The one JSON-file loader: a dict, or a one-line error naming the file, the rule and the fix.

Every JSON file the tool reads (config.json, the safetensors index, hf_quant_config.json,
resume state, earlier reports, SCALES.json) goes through :func:`load_json`. A file that breaks a
rule raises :class:`JsonFileError`, whose ``rule`` (one of :data:`RULES`) callers branch on, never
its text; :func:`read_json_or_none` is the lenient form for files whose absence or damage only
means "not ours" (an earlier report, a finished output's metadata).
"""

from __future__ import annotations

import json
import os

from .errors import QuantizeError

MAX_JSON_BYTES = 64 * 1024 * 1024  # larger than any checkpoint's config or index

MISSING, NOT_REGULAR, TOO_LARGE, NOT_UTF8, TOO_DEEP, NOT_JSON, UNREADABLE, NOT_OBJECT = RULES = (
    "missing", "not-regular", "too-large", "not-utf8", "too-deep", "not-json", "unreadable", "not-object")


class JsonFileError(QuantizeError):
    """A JSON file that cannot be used. ``rule``: which rule it broke (:data:`RULES`); ``reason``:
    the message without the path and the fix (``not valid JSON (Expecting value: ...)``)."""

    def __init__(self, path: str, rule: str, reason: str, message: str):
        super().__init__(message)
        self.path, self.rule, self.reason = path, rule, reason


def first_line(exc: BaseException) -> str:
    """The first line of an exception's text (at most 200 characters), in the user's terms."""
    if "integer string conversion" in str(exc):  # Python's advice (set_int_max_str_digits) is not the user's fix
        return "an integer with thousands of digits"
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


def load_json(path: str, what: str = "the JSON file", *, fix: str = "fix or re-download it",
              missing: str = "a Hugging Face checkpoint needs it", hook=None, parse_constant=None,
              max_bytes: int = MAX_JSON_BYTES) -> dict:
    """The JSON object in file `path`, or :class:`JsonFileError` (``{path}: {what} <reason>; <fix>``).

    Args:
        what: how messages name the file (``config.json``, ``the safetensors index``).
        fix: the fix said for a damaged file; `missing`: what is said of a missing one.
        hook: ``object_pairs_hook`` (e.g. refusing duplicate keys); parse_constant: as :func:`json.load`'s.
    """
    def fail(rule: str, reason: str, tail: str = fix) -> JsonFileError:
        return JsonFileError(path, rule, reason, f"{path}: {what} {reason}; {tail}")

    if not os.path.lexists(path):
        raise fail(MISSING, "is missing", missing)
    if not os.path.isfile(path):  # a folder, a FIFO (open() would block), a dangling link
        raise fail(NOT_REGULAR, "is not a regular file", "replace it with the real file")
    size = os.path.getsize(path)
    if size > max_bytes:
        raise fail(TOO_LARGE, f"is {size} bytes, more than the {max_bytes} a checkpoint's JSON can be")
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f, object_pairs_hook=hook, parse_constant=parse_constant)
    except UnicodeDecodeError as exc:
        raise fail(NOT_UTF8, f"is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise fail(TOO_DEEP, "is nested too deeply to be valid") from None
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        raise fail(NOT_JSON, f"is not valid JSON ({first_line(exc)})") from None
    except OSError as exc:
        raise JsonFileError(path, UNREADABLE, f"cannot be read ({exc.strerror})",
                            f"{path}: cannot read {what} ({exc.strerror}); check permissions") from None
    if not isinstance(doc, dict):
        raise fail(NOT_OBJECT, f"must be a JSON object, got {type(doc).__name__}")
    return doc


def read_json_or_none(path: str, max_bytes: int = MAX_JSON_BYTES) -> dict | None:
    """The JSON object in `path`, or None when it is absent, unreadable, not JSON or not an object."""
    try:
        return load_json(path, max_bytes=max_bytes)
    except JsonFileError:
        return None
