"""The distribution's name and every install line a user is shown (issue 26).

The name ``quantize`` on the package index belongs to an unrelated 2015 MIDI utility, so
``pip install 'quantize[calib]'`` installed the wrong thing. The distribution is ``quantize-cli``;
the module stays ``quantize_cli`` and the command ``quantize``.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIST = "quantize-cli"

def wrong_install(line: str) -> bool:
    """Whether a ``pip install`` in `line` names the distribution ``quantize`` (`pip install
    quantize`, `'quantize[calib]'`, `"quantize @ git+..."`), not a path nor ``quantize-cli``."""
    for m in re.finditer(r"pip install\s+([^&;|#\n]*)", line):
        for word in m.group(1).replace(" @ ", "@").split():
            if re.fullmatch(r"quantize(\[[^\]]*\])?", word.strip("'\"").split("@")[0]):
                return True
    return False


def _tracked_text_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    names = out.stdout.split() if out.returncode == 0 else []
    if not names:  # not a git checkout (an sdist): walk the tree instead
        for base, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("golden", "__pycache__")]
            names += [os.path.relpath(os.path.join(base, f), ROOT) for f in files]
    return [n for n in names if n.endswith((".md", ".py", ".toml", ".sh", ".txt", ".yaml", ".yml")) or n == ".ci/run"]


def test_the_distribution_is_quantize_cli():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        text = f.read().decode()
    if tomllib is not None:
        project = tomllib.loads(text)["project"]
        assert project["name"] == DIST
        assert project["scripts"] == {"quantize": "quantize_cli.cli:main"}
    else:
        assert re.search(r'^name = "quantize-cli"', text, re.M)


def test_the_installed_distribution_provides_the_quantize_command():
    dist = importlib.metadata.distribution(DIST)
    scripts = {e.name: e.value for e in dist.entry_points if e.group == "console_scripts"}
    assert scripts == {"quantize": "quantize_cli.cli:main"}
    assert {"calib", "ray", "test"} <= set(dist.metadata.get_all("Provides-Extra") or [])


def test_no_install_line_names_the_unrelated_package():
    bad = []
    for rel in _tracked_text_files():
        if rel == "tests/test_packaging.py":
            continue
        try:
            with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if wrong_install(line):
                        bad.append(f"{rel}:{n}: {line.strip()}")
        except (UnicodeDecodeError, FileNotFoundError):
            continue
    assert not bad, "install lines naming the unrelated `quantize` package:\n" + "\n".join(bad)


def test_the_pattern_catches_the_old_lines():
    for line in ("pip install 'quantize[calib]'", 'pip install "quantize @ git+https://x/quantize"', "pip install quantize",
                 "pip install quantize[ray]"):
        assert wrong_install(line), line
    for line in ("pip install 'quantize-cli[calib]'", 'pip install "quantize-cli @ git+https://x/quantize"',
                 "pip install -e '.[test]'", "pip install torch==2.13.0 -e '.[test]'"):
        assert not wrong_install(line), line

