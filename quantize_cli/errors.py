"""Typed errors and the one table that turns them into exit codes.

Everything user input can trigger raises a :class:`QuantizeError` subclass whose message is one
line naming the file or tensor, the rule it broke and the fix. The CLI prints ``error: <message>``
and exits with ``exit_code``; tracebacks appear only with ``--debug``.
"""

from __future__ import annotations

import os
import re

# Environment variables that may hold a Hugging Face token; their values never appear in a message.
TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN", "HF_API_TOKEN")
_TOKEN_SHAPE = re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")


def redact(text: str) -> str:
    """`text` with Hub tokens (the values of :data:`TOKEN_VARS`, anything shaped ``hf_...``) replaced by ``***``."""
    for var in TOKEN_VARS:
        value = os.environ.get(var, "").strip()
        if len(value) >= 8:
            text = text.replace(value, "***")
    return _TOKEN_SHAPE.sub("***", text)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # not \t and \n (\n is folded separately)
_LONG_WORD = re.compile(r"\S{201,}")


def display(text: str) -> str:
    """`text` safe to print as part of one line: newlines and control characters (terminal escape
    codes) shown escaped, and any word longer than 200 characters (a hostile tensor name) cut to 120."""
    text = _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(text)).replace("\r", "\\r").replace("\n", "\\n")
    return _LONG_WORD.sub(lambda m: m.group()[:117] + "...", text)


def _one_line(text: str) -> str:
    """Redacted, and on one line: names from strangers' files may hold newlines and escape codes."""
    text = " ".join(redact(str(text)).splitlines())
    return _LONG_WORD.sub(lambda m: m.group()[:117] + "...", _CONTROL.sub(lambda m: repr(m.group())[1:-1], text))


class QuantizeError(Exception):
    """Base class: a domain error (exit code 1) with a one-line, actionable message."""

    exit_code = 1

    def __init__(self, message: str, *, details: list[str] | None = None):
        message = _one_line(message)
        super().__init__(message)
        self.message = message
        # Further offenders of the same rule, one line each, printed after the message.
        self.details = [_one_line(d) for d in details or []]

    def __str__(self) -> str:
        return self.message


class SourceError(QuantizeError):
    """The source checkpoint is missing, unreadable, malformed or unsupported."""


class PlanError(QuantizeError):
    """The conversion cannot be planned: incompatible shapes, bad exclusions, bad recipe."""


class DestinationError(QuantizeError):
    """The destination exists, is locked, overlaps the source, or could not be written."""


class NumericsError(QuantizeError):
    """A tensor holds values that cannot be quantized (NaN or Inf)."""


class CheckFailed(QuantizeError):
    """`check` or `verify` found errors (their report has the details)."""


class UsageError(QuantizeError):
    """Bad command-line usage (unknown algorithm, malformed size, conflicting options)."""

    exit_code = 2



def format_error(err: QuantizeError, limit: int = 20) -> str:
    """Render an error as the CLI prints it: the message, then up to `limit` detail lines."""
    lines = [f"error: {err.message}"]
    shown = err.details[:limit]
    lines += [f"  - {d}" for d in shown]
    if len(err.details) > limit:
        lines.append(f"  ... and {len(err.details) - limit} more (see --report / --json)")
    return "\n".join(lines)


class CalibrationError(QuantizeError):
    """Calibration data, a scales file or the calibration run is unusable (exit 1)."""


class PublishError(QuantizeError):
    """Publishing to the Hub failed (no token, bad repo, network); the local output is complete."""
