"""convert's options: one frozen value built by the CLI and the library alike, checked once."""

import dataclasses

import pytest

from quantize_cli import api
from quantize_cli.errors import UsageError
from quantize_cli.plan.options import ConvertOptions


def test_every_option_is_a_flag_and_the_library_takes_one_options_value():
    from quantize_cli.cli import convert as command

    flags = {p.name for p in command.params} - {"debug"}
    assert flags == set(ConvertOptions.names())
    with pytest.raises(TypeError, match="ConvertOptions"):
        api.convert("example:tiny-llama", "o")  # keywords are gone: one options object


def test_the_cli_and_the_library_build_the_same_options(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import quantize_cli.convert as conversion
    from quantize_cli.cli import main

    seen = []
    monkeypatch.setattr(conversion, "convert", lambda opts, console=None: seen.append(opts))
    CliRunner().invoke(main, ["convert", "example:tiny-llama", "-o", str(tmp_path / "o"), "--algo", "nvfp4", "--exclude", "lm_head",
                              "--exclude", "*mlp*", "--kernels", "torch", "--memory-budget", "1GB", "--quiet"])
    api.convert(ConvertOptions("example:tiny-llama", str(tmp_path / "o"), algo="NVFP4", exclude=["lm_head", "*mlp*"],
                               kernels="torch", memory_budget="1GB", quiet=True))
    assert len(seen) == 2 and seen[0] == seen[1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen[0].algo = "FP8"


def test_usage_errors_come_first(tmp_path):
    """A bad option is refused before SRC is even looked at (it does not exist here)."""
    for kw, msg in ((dict(memory_budget="lots"), "--memory-budget"), (dict(layout="weird"), "--layout"),
                    (dict(kernels="cuda"), "--kernels"), (dict(kv_cache_dtype="int4"), "--kv-cache-dtype"),
                    (dict(max_shard_size="5XB"), "--max-shard-size")):
        with pytest.raises(UsageError, match=msg):
            api.convert(ConvertOptions(str(tmp_path / "missing"), str(tmp_path / "o"), algo="FP8", quiet=True, **kw))


@pytest.mark.parametrize("name,algo", [("FP8_DYNAMIC", "FP8_PER_CHANNEL_PER_TOKEN"), ("fp8_block", "FP8_PB_WO"),
                                       ("NVFP4A16", "W4A16_NVFP4"), ("W4A16", "INT4"), ("W8A16", "INT8")])
def test_llm_compressor_preset_names_plan_our_algorithm(name, algo):
    """Issue 36: a user coming from llm-compressor types its preset names."""
    from click.testing import CliRunner

    from quantize_cli.cli import main

    r = CliRunner().invoke(main, ["convert", "example:tiny-llama", "--algo", name, "--dry-run"])
    assert r.exit_code == 0, r.output
    assert f"-> {algo} " in r.output


@pytest.mark.parametrize("name,fmt", [("W8A8", "modelopt"), ("W8A16", "compressed-tensors")])
def test_an_int8_name_of_the_other_format_is_refused_naming_the_right_one(name, fmt, tmp_path):
    """`--algo W8A16 --format compressed-tensors` silently wrote W8A8 (issue 36, 5); `W8A8` would
    silently be weight-only in the ModelOpt format. Both are refused before anything is read."""
    from click.testing import CliRunner

    from quantize_cli.cli import main

    for cmd in (["convert", "example:tiny-llama", "-o", str(tmp_path / "o")], ["check", "example:tiny-llama"]):
        r = CliRunner().invoke(main, [*cmd, "--algo", name, "--format", fmt])
        assert r.exit_code == 2, r.output
        other = "W8A16" if name == "W8A8" else "W8A8"
        assert f"--algo {name} --format {fmt}" in r.output and f"use --algo {other} (or INT8)" in r.output
    assert not (tmp_path / "o").exists()
    r = CliRunner().invoke(main, ["convert", "example:tiny-llama", "--algo", "W8A8", "--format", "compressed-tensors", "--dry-run"])
    assert r.exit_code == 0, r.output
