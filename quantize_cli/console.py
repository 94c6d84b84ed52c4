"""Messages for humans on stderr (torch-free: ``check`` and ``--dry-run`` use it too)."""

from __future__ import annotations

import sys


class Console:
    """Messages for humans on stderr: info (silenced by quiet), warnings (always)."""

    def __init__(self, quiet: bool = False, stream=None):
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.warned: list[str] = []  # every warning said, in order (convert --strict refuses on them)

    def info(self, msg: str) -> None:
        if not self.quiet:
            print(msg, file=self.stream, flush=True)

    def warn(self, msg: str) -> None:
        self.warned.append(msg)
        print(f"warning: {msg}", file=self.stream, flush=True)
