"""Every refusal that needs no tensor data comes before torch is imported (issue 26).

They used to wait for ``devices.resolve_device`` (which imports torch: 1.5-3 s, 3.2-4.6 s
measured as whole commands); now each is said in a fraction of a second (docs/performance.md,
bench/refusals.py). Each command runs in a fresh process, as a user runs it, which reports its
exit code and the heavy modules it imported: none may be torch. Timing itself is not asserted
(a loaded CI machine would make that flaky); not importing torch is what makes it fast.
"""

from __future__ import annotations

import os

import pytest

from tests.test_torch_free import run_fresh


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """A bf16 Llama folder (2 layers, 2 shards)."""
    from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors, write_checkpoint

    cfg = llama_config()
    return write_checkpoint(str(tmp_path_factory.mktemp("fast") / "src"), llama_tensors(cfg), cfg, shards=2)


def cases(src: str, tmp) -> list[tuple[str, list[str], int, str]]:
    """(name, arguments, exit code, words of the message) for every refusal issue 26 names, and its new ones."""
    exists = tmp / "exists"
    exists.mkdir()
    (tmp / "file").write_text("not a checkpoint")
    out = str(tmp / "out")
    calib = ["--calib-data", "default"]
    ct = tmp / "ct-output"  # a compressed-tensors output (its config is all unpack reads before refusing)
    ct.mkdir()
    (ct / "config.json").write_text('{"quantization_config": {"quant_method": "compressed-tensors"}}')
    searched_ct = ["convert", src, "-o", out, "--algo", "W4A16_NVFP4", "--format", "compressed-tensors", "--scale-search", "mse"]
    lone = tmp / "lone.json"  # a SCALES.json whose channel statistics were not kept beside it
    lone.write_text('{"format": "quantize-act-scales", "version": 2, "channels": {"file": "lone.channels.safetensors"}}')
    return [
        ("DST exists", ["convert", src, "-o", str(exists), "--algo", "FP8"], 1, "already exists"),
        ("bad size", ["convert", src, "-o", out, "--algo", "FP8", "--max-shard-size", "5XB"], 2, "'5XB' is not a size"),
        ("missing SRC", ["convert", str(tmp / "missing"), "-o", out, "--algo", "FP8"], 1, "no such folder"),
        ("SRC is a file", ["convert", str(tmp / "file"), "-o", out, "--algo", "FP8"], 1, "is a file"),
        ("unknown example", ["convert", "example:tiny-lama", "-o", out, "--algo", "FP8"], 1, "no such example"),
        ("no kernel", ["convert", src, "-o", out, "--algo", "INT8", "--layout", "flashinfer"], 1, "no INT8 GEMM"),
        ("no bytes move, --strict", ["convert", src, "-o", out, "--algo", "INT8", "--layout", "cutlass", "--strict"], 1,
         "writing the plain layout"),
        ("typo'd --exclude, --strict", ["convert", src, "-o", out, "--algo", "FP8_PB_WO", "--exclude", "*.q_prj", "--strict"], 1,
         "--strict: 1 warning"),
        ("shadowed --algo-for, --strict", ["convert", src, "-o", out, "--algo", "NVFP4", "--algo-for", "*mlp*=FP8_PB_WO",
                                           "--algo-for", "*down_proj=MXFP8", "--strict"], 1, "shadowed"),
        ("--calib-samples 0", ["convert", src, "-o", out, "--algo", "FP8", *calib, "--calib-samples", "0"], 2, "must be at least 1"),
        ("--calib-seq-len 0", ["convert", src, "-o", out, "--algo", "FP8", *calib, "--calib-seq-len", "0"], 2, "must be at least 1"),
        ("--calib-data missing file", ["convert", src, "-o", out, "--algo", "FP8", "--calib-data", "calib/nonexistent.jsonl"], 1,
         "calib/nonexistent.jsonl: no such file"),
        ("bad --device", ["convert", src, "-o", out, "--algo", "FP8", "--device", "cdua"], 2, "is not a device"),
        ("--kernels triton on the CPU", ["convert", src, "-o", out, "--algo", "FP8", "--device", "cpu", "--kernels", "triton"], 2,
         "need a CUDA GPU"),
        # issue 36: these used to calibrate (68 s) or import torch before refusing
        ("searched compressed-tensors NVFP4, calibrated", [*searched_ct, *calib], 2, "searched scales are written in the ModelOpt"),
        ("the same, --dry-run", [*searched_ct, *calib, "--dry-run"], 2, "searched scales are written in the ModelOpt"),
        ("unpack a compressed-tensors output", ["unpack", str(ct), "-o", out], 1, "has no packed layout"),
        ("--act-scales without its channels, searched", ["convert", src, "-o", out, "--algo", "NVFP4", "--scale-search", "mse",
                                                         "--act-scales", str(lone)], 1, "lone.channels.safetensors, which is missing"),
        # the other commands' refusals of a missing input
        ("verify a missing DST", ["verify", str(tmp / "missing")], 1, "verify failed"),
        ("unpack a missing DST", ["unpack", str(tmp / "missing"), "-o", out], 1, "no such folder"),
        ("calibrate a missing SRC", ["calibrate", str(tmp / "missing"), "-o", str(tmp / "s.json")], 1, "no such folder"),
        ("calibrate --calib-samples 0", ["calibrate", src, "-o", str(tmp / "s.json"), "--calib-samples", "0"], 2, "must be at least 1"),
        ("push a missing DST", ["push", str(tmp / "missing"), "me/model"], 1, "not a folder"),
        ("inspect a missing PATH", ["inspect", str(tmp / "missing")], 1, "not a folder"),
    ]


def test_every_refusal_without_tensor_data_imports_no_torch(src, tmp_path):
    for name, args, code, words in cases(src, tmp_path):
        got, heavy, _, err = run_fresh(*args, env={"TRITON_INTERPRET": "0"})
        assert (got, heavy) == (code, []), f"{name}: exit {got}, imported {heavy}: {err}"
        assert words in err, f"{name}: {err}"
        assert not os.path.exists(tmp_path / "out"), name


def test_a_strict_conversion_without_warnings_runs(src, tmp_path):
    """--strict refuses warnings only: a clean plan converts (and then imports torch, to quantize)."""
    from tests.conftest import convert

    res = convert(src, str(tmp_path / "o"), algo="FP8_PB_WO", quiet=True, strict=True)
    assert res.dst and os.path.exists(tmp_path / "o" / "model.safetensors")


@pytest.mark.parametrize("flag", ["--calib-samples", "--calib-seq-len"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_zero_and_negative_calibration_sizes_are_refused_by_both_commands(src, tmp_path, flag, value):
    """0 used to be taken silently as the default (128 x 512) while -3 was refused (issue 26)."""
    from click.testing import CliRunner

    from quantize_cli.cli import main

    for args in (["convert", src, "-o", str(tmp_path / "o"), "--algo", "NVFP4", "--calib-data", "default"],
                 ["calibrate", src, "-o", str(tmp_path / "s.json")]):
        r = CliRunner().invoke(main, [*args, flag, value])
        assert r.exit_code == 2 and f"{flag} {value}: must be at least 1" in r.output, r.output
    assert not os.listdir(tmp_path)


def test_a_path_like_calibration_file_that_does_not_exist_is_not_taken_for_a_dataset(tmp_path):
    """`calib/nonexistent.jsonl` (one slash, like owner/name) was answered with an `hf download` hint."""
    from quantize_cli.calibration.data import load_samples
    from quantize_cli.errors import CalibrationError
    from quantize_cli.calibration.data import looks_like_a_file

    for spec in ("calib/nonexistent.jsonl", "data/x.txt", "./x", "a/b/c", "~/c.jsonl.gz", "x.parquet"):
        assert looks_like_a_file(spec), spec
        with pytest.raises(CalibrationError, match="no such file"):
            load_samples(spec, str(tmp_path), 100, 2, 16)
    for spec in ("default", "allenai/c4", "wikitext", "owner/name.v2"):
        assert not looks_like_a_file(spec), spec


def test_the_scales_json_alone_serves_an_algorithm_that_reads_no_channel_statistics(example_scales, tmp_path):
    """Issue 35: FP8 or NVFP4 input scales need only the amax; a SCALES.json copied without its
    channels file was refused after torch loaded. Now it converts, to the bytes of the pair."""
    import shutil

    from tests.conftest import convert, output_files

    path = example_scales[0]
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(path, lone / os.path.basename(path))
    for name, scales in (("pair", path), ("alone", str(lone / os.path.basename(path)))):
        (tmp_path / name).mkdir()
        convert("example:tiny-llama", str(tmp_path / name / "out"), algo="NVFP4", act_scales=scales, quiet=True)
    assert output_files(tmp_path / "pair" / "out") == output_files(tmp_path / "alone" / "out")


@pytest.mark.parametrize("name,algo", [("FP8_DYNAMIC", "FP8_PER_CHANNEL_PER_TOKEN"), ("fp8_block", "FP8_PB_WO"),
                                       ("NVFP4A16", "W4A16_NVFP4"), ("W8A8", "INT8"), ("W8A16", "INT8"), ("W4A16", "INT4")])
def test_llm_compressor_preset_names_are_aliases_of_the_algorithm_writing_that_preset(name, algo):
    """Issue 36 item 9: each alias names the algorithm whose compressed-tensors scheme writes that preset."""
    from quantize_cli.algorithms import canonical_algo
    from quantize_cli.formats.compressed_tensors import CT_SCHEMES

    assert canonical_algo(name) == algo
    if name.upper() != "W8A16":  # ModelOpt's name (refused with compressed-tensors, which writes W8A8)
        assert CT_SCHEMES[algo].preset == name.upper()
