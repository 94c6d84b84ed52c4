"""Messages for humans on stderr (torch-free: ``check`` and ``--dry-run`` use it too)."""

from __future__ import annotations

import sys

from .problems import WARNING, Finding


class Console:
    """Messages for humans on stderr: info (silenced by quiet), warnings (always)."""

    def __init__(self, quiet: bool = False, stream=None):
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.warned: list[Finding] = []  # every warning said, in order (convert --strict refuses on them, --allow by code)

    def info(self, msg: str) -> None:
        if not self.quiet:
            print(msg, file=self.stream, flush=True)

    def warn(self, msg: str, code: str = "") -> None:
        """`code`: the finding's stable id (problems.py), for ``convert --strict --allow CODE``."""
        self.warned.append(Finding(WARNING, code, "", msg))
        print(f"warning: {msg}", file=self.stream, flush=True)


def human_bytes(n: int | float) -> str:
    """``1234567`` -> ``"1.23 MB"`` (decimal units, as disks and the Hub count)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n} B"
