"""The run identity: one table of what decides the bytes, from which every record and line derives."""

from __future__ import annotations

import dataclasses

import pytest

from quantize_cli.api import prepare
from quantize_cli.output.identity import IDENTITY, NOT_IDENTITY, RunIdentity
from quantize_cli.plan.options import ConvertOptions


def identity(src, **kw):
    opts = ConvertOptions(src, "out", **kw)
    plan = prepare(src, opts.algo, exclude=opts.exclude, recipe=opts.recipe, kv_cache_dtype=opts.kv_cache_dtype,
                   max_shard_size=opts.max_shard_size, layout=opts.layout, scale_search=opts.scale_search,
                   format=opts.format, algo_for=opts.algo_for)
    return RunIdentity.of(opts, plan)


def test_every_option_is_either_identity_or_not():
    """A new ConvertOptions field must be placed: it decides bytes (IDENTITY) or it does not."""
    fields = {f.name for f in dataclasses.fields(ConvertOptions)}
    keys = {d.key for d in IDENTITY}
    assert fields - set(NOT_IDENTITY) <= keys, f"place these options: {sorted(fields - set(NOT_IDENTITY) - keys)}"
    assert not keys & set(NOT_IDENTITY)


@pytest.mark.parametrize("change,named", [
    (dict(algo="NVFP4"), "--algo FP8_PB_WO, this run asks for NVFP4"),
    (dict(format="compressed-tensors"), "--format modelopt, this run asks for compressed-tensors"),
    (dict(exclude=("*mlp*",)), "--exclude (none), this run asks for *mlp*"),
    (dict(max_shard_size="1MB"), "--max-shard-size 5GB, this run asks for 1MB"),
    (dict(kv_cache_dtype="fp8"), "--kv-cache-dtype (none), this run asks for fp8"),
    (dict(algo_for=("self_attn*=nvfp4",)), "--algo-for (none), this run asks for self_attn*=NVFP4"),
    (dict(layout="marlin"), "--layout plain, this run asks for marlin"),
])
def test_a_difference_is_named_with_both_values(change, named):
    base = identity("example:tiny-llama", algo="FP8_PB_WO")
    other = identity("example:tiny-llama", **{"algo": "FP8_PB_WO", **change})
    assert other.differences(base.record())[0] == named
    assert other.fingerprint() != base.fingerprint()
    assert base.differences(base.record()) == []


def test_equal_sizes_written_differently_are_the_same_identity():
    a = identity("example:tiny-llama", algo="NVFP4", max_shard_size="5GB")
    b = identity("example:tiny-llama", algo="nvfp4", max_shard_size=5_000_000_000)
    assert a.fingerprint() == b.fingerprint() and a.differences(b.record()) == []


def test_an_older_record_without_a_key_means_its_default():
    now = identity("example:tiny-llama", algo="FP8")
    old = now.record()
    for key in ("format", "algo_for", "scale_search", "calibration"):
        del old["options"][key]
    assert now.differences(old) == []


def test_the_command_line_reproduces_the_options():
    ident = identity("example:tiny-llama", algo="NVFP4", exclude=("model.layers.0.*",), kv_cache_dtype="fp8", max_shard_size="2MB",
                     format="compressed-tensors")
    assert ident.command_line("a/b", "out dir") == ("quantize convert a/b -o 'out dir' --algo NVFP4 --format compressed-tensors "
                                                    "--exclude 'model.layers.0.*' --kv-cache-dtype fp8 --max-shard-size 2MB")


def test_a_resume_across_a_numerics_version_is_refused(tiny_llama, tmp_path, monkeypatch):
    """Issue 35, 4: an interrupted run's work finished by other numeric rules equalled neither."""
    import quantize_cli.output.identity as identity_module
    from quantize_cli.errors import DestinationError
    from tests.conftest import convert
    from tests.hostile.helpers import interrupt_after_tasks

    restore = interrupt_after_tasks(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        convert(tiny_llama, str(tmp_path / "out"), algo="NVFP4", quiet=True, max_shard_size="1MB")
    restore()
    monkeypatch.setattr(identity_module, "CONVERTER", "0.1.0+numerics.999")  # a later release's rules
    with pytest.raises(DestinationError, match=r"quantize 0\.1\.0\+numerics\.\d+, this is quantize 0\.1\.0\+numerics\.999"):
        convert(tiny_llama, str(tmp_path / "out"), algo="NVFP4", quiet=True, max_shard_size="1MB", resume=True)
