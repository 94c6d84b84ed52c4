"""What a newcomer reads first: ``--help``, the small commands' words, the closing line (issue 26)."""

from __future__ import annotations

import os
import re

import pytest
from click.testing import CliRunner

from quantize_cli.cli import main

COMMANDS = ["convert", "check", "verify", "eval", "calibrate", "unpack", "inspect", "push", "recipes"]


def invoke(*args: str, width: int = 80):
    return CliRunner().invoke(main, list(args), terminal_width=width)


def test_the_top_level_names_every_algorithm_and_both_formats():
    out = invoke("--help").output
    summary = " ".join(out.split("Options:")[0].split())
    for word in ("FP8", "NVFP4", "MXFP8", "INT8", "INT4", "ModelOpt", "compressed-tensors", "bf16", "fp32"):
        assert word in summary, word
    assert "Examples:" in out and "docs/getting-started.md" in out


@pytest.mark.parametrize("width", [80, 100])
def test_command_summaries_are_never_cut(width):
    """Click cuts a long first sentence with '...' in the command list: every summary fits whole."""
    out = invoke("--help", width=width).output
    lines = out.split("Commands:")[1].split("Examples:")[0].strip().splitlines()
    assert {line.split()[0] for line in lines} == set(COMMANDS)
    for line in lines:
        assert not line.rstrip().endswith("..."), line
        assert line.rstrip().endswith("."), line


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_shows_an_example(command):
    out = invoke(command, "--help").output
    examples = out.split("Examples:")[1].strip().splitlines() if "Examples:" in out else []
    assert examples and all(line.strip().startswith("quantize ") for line in examples if line.strip()), out
    assert any(line.strip().startswith(f"quantize {command}") for line in examples), out


@pytest.mark.parametrize("command", ["convert", "check", "calibrate"])
def test_every_option_has_help(command):
    import click

    cmd = main.commands[command]
    bare = [p.opts[-1] for p in cmd.params if isinstance(p, click.Option) and not (p.help or "").strip()]
    assert not bare, bare
    layout = next((p for p in cmd.params if p.name == "layout"), None)
    assert layout is None or ("plain" in layout.help and "docs/layouts.md" in layout.help)


def test_check_algo_for_says_what_check_does():
    (algo_for,) = [p for p in main.commands["check"].params if p.name == "algo_for"]
    assert "checks" in algo_for.help and "writes" not in algo_for.help


def test_inspect_takes_an_example(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    r = invoke("inspect", "example:tiny-llama")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("example:tiny-llama: 2 shards, 21 tensors") and "not quantized" in r.output


def test_counts_are_spelled_out():
    from quantize_cli.inspect_checkpoint import count, ct_summary

    assert count(1, "ignore entry", "ignore entries") == "1 ignore entry" and count(0, "shard") == "0 shards"
    assert "1 ignore entry," in ct_summary({"config_groups": {"FP8": {}}, "ignore": ["lm_head"], "format": "x"})
    assert "(ies)" not in ct_summary({"ignore": ["a", "b"]}) and "2 ignore entries" in ct_summary({"ignore": ["a", "b"]})


def test_recipes_show_a_model_type_says_which_recipe_applies():
    r = invoke("recipes", "show", "bert")
    assert r.exit_code == 2 and "--recipe" not in r.output
    assert "recipes show bert: no shipped recipe" in r.output and "quantize recipes show default" in r.output
    r = invoke("recipes", "show", "qwen2_5_vl")
    assert "'default' recipe" in r.output
    r = invoke("recipes", "show", "ministral")  # a model_type a shipped recipe declares
    assert "converts with recipe 'mistral'" in r.output


def test_recipes_list_columns_line_up():
    lines = invoke("recipes", "list").output.rstrip("\n").splitlines()
    assert lines[0].split() == ["RECIPE", "MODEL", "TYPES", "DESCRIPTION"]
    starts = {(line.index(line.split("  ")[0]), len(re.match(r"\S+\s+", line).group()),
               len(re.match(r"\S+\s+\S.*?\s{2,}", line).group())) for line in lines}
    assert len({s[1] for s in starts}) == 1 and len({s[2] for s in starts}) == 1, lines


def test_a_tiny_conversion_says_its_rate_in_readable_units(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    r = invoke("convert", "example:tiny-llama", "-o", str(tmp_path / "o"), "--algo", "FP8_PB_WO")
    last = r.output.strip().splitlines()[-1]
    assert r.exit_code == 0 and "0.00 GB/s" not in last
    assert re.search(r"\(\d+\.\d\d (KB|MB|GB)/s of input\)$", last), last


def test_rounding_and_smooth_help_name_every_source_of_calibration_data():
    """Issue 36: `calibrate --help` said --rounding "(needs --calib-data)" where calibrate defaults it; convert takes --act-scales."""
    out = " ".join(invoke("calibrate", "--help", width=200).output.split())
    assert "(needs --calib-data)" not in out and "--act-scales" in out
    import tomllib

    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml"), "rb") as f:
        assert "INT4" in tomllib.load(f)["project"]["description"]
