"""No tracked text file keeps a merge's conflict markers (one reached docs/accuracy.md once)."""

from __future__ import annotations

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"^(<{7} |={7}$|>{7} )", re.M)


def test_no_conflict_markers():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    bad = []
    for rel in files:
        if not rel.endswith((".py", ".md", ".toml", ".sh", ".txt", ".yaml", ".json", ".cfg")):
            continue
        try:
            text = open(os.path.join(ROOT, rel), encoding="utf-8").read()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        bad += [f"{rel}:{text[:m.start()].count(chr(10)) + 1}" for m in MARKER.finditer(text)]
    assert not bad, f"merge conflict markers: {bad}"
