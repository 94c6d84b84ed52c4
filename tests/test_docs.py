"""The documents a newcomer reads: every page linked once from the README, no citation of a file the
repo does not hold, usage lines that list only options the command takes (issue 26)."""

from __future__ import annotations

import os
import re

import click
import pytest

from quantize_cli.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = sorted(f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
# A path in backticks or a link that names a file of this repository (not an output such as report.json).
CITED = re.compile(r"(?<![\w/.-])((?:docs|tests|bench|quantize_cli|kernels|recipes|shared)/[\w./-]+\.(?:md|py|json|yaml|txt))")


def _read(rel: str) -> str:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def test_the_readme_links_every_page_once():
    readme = _read("README.md")
    for page in DOCS:
        mentions = re.findall(rf"^- .*?`docs/{re.escape(page)}`", readme, re.M)
        assert len(mentions) == 1, (page, len(mentions))
    assert "(CHANGELOG.md)" in readme and os.path.isfile(os.path.join(ROOT, "CHANGELOG.md"))
    assert "docs/getting-started.md" in readme and "docs/support.md" in readme


@pytest.mark.parametrize("doc", ["README.md", "CHANGELOG.md"] + [f"docs/{d}" for d in DOCS])
def test_cited_files_exist(doc):
    missing = [path for path in CITED.findall(_read(doc)) if not os.path.exists(os.path.join(ROOT, path.rstrip(".")))]
    assert not missing, missing


def _usage_options(text: str, command: str) -> set[str]:
    """The --options a usage block lists for `quantize <command>` (its line and the indented ones after it)."""
    block = re.search(rf"^quantize {command}\b(.*?)(?=^quantize |^```)", text, re.M | re.S)
    assert block, command
    return set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", block.group(1).split("#")[0] if "\n" not in block.group(1) else
                          "\n".join(line.split("#")[0] for line in block.group(1).splitlines())))


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md"])
@pytest.mark.parametrize("command", ["convert", "calibrate", "check", "verify", "push"])
def test_usage_lines_list_only_options_the_command_takes(doc, command):
    """README showed `calibrate` with --push-to-hub / --private / --revision-out, which it does not take."""
    cmd = main.commands[command]
    takes = {opt for p in cmd.params if isinstance(p, click.Option) for opt in p.opts + p.secondary_opts}
    listed = _usage_options(_read(doc), command)
    assert listed and listed <= takes, sorted(listed - takes)


def test_the_stray_fragment_is_gone():
    assert "a later output format); `check` warns." not in _read("docs/formats.md")


COMMON = {"--quiet", "--debug", "--help", "-h"}  # every command's; documented once (convert's table)


def _flags(cmd) -> list[tuple[str, ...]]:
    """Each option of `cmd` as the spellings it takes (``("-o", "--output")``)."""
    return [tuple(p.opts + p.secondary_opts) for p in cmd.params if isinstance(p, click.Option)]


@pytest.mark.parametrize("command", ["convert", "calibrate", "check", "verify", "eval", "push", "unpack", "inspect"])
def test_every_option_a_command_takes_is_in_the_cli_synopsis(command):
    """Issue 36: the synopsis lacked --algo-for, --act-scales, --calib-samples, --calib-seq-len, --base-model
    (convert) and --format, --algo-for (check)."""
    block = re.search(rf"^quantize {command}\b(.*?)(?=^quantize |^```)", _read("docs/cli.md"), re.M | re.S).group(1)
    listed = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", block))
    missing = [s[-1] for s in _flags(main.commands[command]) if not (set(s) & listed) and not (set(s) & COMMON and command != "convert")]
    assert not missing, missing


def test_every_convert_option_is_in_the_option_table():
    text = _read("docs/cli.md").split("## convert", 1)[1].split("\n## ", 1)[0]
    rows = "\n".join(line for line in text.splitlines() if line.startswith("| `"))
    listed = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", rows))
    missing = [s[-1] for s in _flags(main.commands["convert"]) if not set(s) & (listed | {"--help", "-h"})]
    assert not missing, missing


def test_every_algorithm_has_a_floor_in_the_ci_gate():
    """Issue 36: INT4 / INT4_ASYM fell to the 20 dB default, failing a good INT4 output."""
    from quantize_cli.algorithms import ALGOS

    floors = re.search(r"floor = (\{.*?\})", _read("docs/ci.md"), re.S).group(1)
    listed = set(re.findall(r'"(\w+)":', floors))
    assert set(ALGOS) <= listed, sorted(set(ALGOS) - listed)
    choices = re.search(r'algo: +\{description: "([^"]*)"', _read("docs/ci.md")).group(1)
    assert all(a in re.findall(r"\w+", choices) for a in ALGOS), choices
