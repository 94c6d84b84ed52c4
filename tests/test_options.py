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
