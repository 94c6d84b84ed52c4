"""One home per fact (docs/architecture.md), read from the sources as tests/test_architecture.py does:
files are written atomically and durably by checkpoint/durable.py only (issue 35)."""

from __future__ import annotations

import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "quantize_cli"
DURABLE = "checkpoint/durable.py"
# save_file of the embedded examples: a cache generated into a temporary folder renamed whole
SAVE_FILE_OK = {"checkpoint/example_weights.py"}


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.split("/")[0] in ("kernels", "recipes"):
            continue
        yield rel, path.read_text(encoding="utf-8")


def test_files_are_replaced_only_by_the_durable_writer():
    """A temporary file renamed over the real one without an fsync can be empty after a crash:
    calibration/weights_file.py and calibration/channels.py did so; durable.write_atomic fsyncs."""
    offenders = [f"{rel}:{text[:m.start()].count(chr(10)) + 1}" for rel, text in _sources() if rel != DURABLE
                 for m in re.finditer(r"\bos\.replace\(", text)]
    offenders += [f"{rel}:{text[:m.start()].count(chr(10)) + 1}" for rel, text in _sources() if rel not in SAVE_FILE_OK
                  for m in re.finditer(r"\bsave_file\(", text)]
    assert not offenders, f"write files with checkpoint/durable.py's write_atomic / write_json: {offenders}"
