"""Calibrated scales against ModelOpt's golden exports; every bad input is a one-line error."""

from __future__ import annotations

import json
import shutil
import os
import subprocess
import sys

import pytest
import torch

from quantize_cli import api
from tests.conftest import convert
from quantize_cli.errors import CalibrationError, QuantizeError, SourceError, UsageError
from tests.calibration import builders
from tests.conftest import golden_checkpoint, load_all

CALIB = os.path.join(os.path.dirname(__file__), "..", "golden", "checkpoints", "calibration.jsonl")


@pytest.fixture(scope="module")
def golden_scales(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("g") / "scales.json")
    api.calibrate(golden_checkpoint("tiny-llama"), calib_data=CALIB, output=out, device="cpu", quiet=True)
    return out


@pytest.mark.parametrize("algo", ["FP8", "NVFP4"])
def test_input_scales_match_modelopt(tmp_path, golden_scales, algo):
    """ModelOpt calibrated its export on calibration.jsonl: ours agree within 1% (bf16 forward only)."""
    dst = str(tmp_path / "out")
    convert(golden_checkpoint("tiny-llama"), dst, algo=algo, device="cpu", quiet=True, act_scales=golden_scales)
    ours, theirs = load_all(dst), load_all(golden_checkpoint(f"tiny-llama-{algo}"))
    names = [k for k in theirs if k.endswith("input_scale")]
    assert len(names) == 14
    for k in names:
        assert ours[k].dtype == torch.float32 and ours[k].shape == ()
        assert abs(ours[k].item() - theirs[k].item()) <= 0.01 * theirs[k].item(), k


def _convert(tmp_path, src, **kw):
    return convert(src, str(tmp_path / "out"), algo="FP8", device="cpu", quiet=True, **kw)


def _write(tmp_path, name, content: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(content)
    return str(p)


@pytest.mark.parametrize("name, content, words", [
    ("empty.jsonl", b"", "empty"),
    ("blank.txt", b"  \n\n", "empty"),
    ("bad.jsonl", b'{"input_ids": [1, 2]}\n{"input_ids": [1, 2\n', "line 2: not valid JSON"),
    ("noids.jsonl", b'{"tokens": [1, 2]}\n', "line 1: needs an object"),
    ("strs.jsonl", b'{"input_ids": ["a", 2]}\n', "list of integers"),
    ("latin1.txt", "caf\u00e9 cr\u00e8me".encode("latin-1"), "not UTF-8"),
    ("vocab.jsonl", b'{"input_ids": [1, 2, 999999]}\n', "token id 999999 is outside"),
    ("neg.jsonl", b'{"input_ids": [-1]}\n', "token id -1 is outside"),
])
def test_bad_calibration_data(tmp_path, name, content, words):
    data = _write(tmp_path, name, content)
    with pytest.raises(CalibrationError) as e:  # exit 1, one line
        _convert(tmp_path, golden_checkpoint("tiny-llama"), calib_data=data)
    assert words in e.value.message and data in e.value.message and "\n" not in e.value.message
    assert not (tmp_path / "out").exists()


def test_missing_data_and_conflicts(tmp_path):
    src = golden_checkpoint("tiny-llama")
    with pytest.raises(CalibrationError, match="no such file"):
        _convert(tmp_path, src, calib_data=str(tmp_path / "nope.jsonl"))
    with pytest.raises(UsageError, match="give one"):
        _convert(tmp_path, src, calib_data=CALIB, act_scales="x.json")
    with pytest.raises(UsageError, match="need --calib-data"):
        _convert(tmp_path, src, calib_samples=4)
    with pytest.raises(CalibrationError, match="tokenizer"):  # the golden checkpoint ships no tokenizer: text cannot be tokenized
        _convert(tmp_path, src, calib_data=_write(tmp_path, "t.txt", b"some text"))


def _scales_doc(golden_scales, edit) -> dict:
    doc = json.load(open(golden_scales))
    edit(doc)
    return doc


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["modules"]["model.layers.0.mlp.down_proj"].update(amax=float("nan")), "finite number"),
    (lambda d: d["modules"]["model.layers.1.mlp.down_proj"].update(amax=-1.0), "finite number >= 0"),
    (lambda d: d["modules"].pop("model.layers.1.self_attn.o_proj"), "has no amax for it"),
    (lambda d: d["source"].update(content_sha256="0" * 64), "made from another source"),
    (lambda d: d.update(version=9), "version 9"),
    (lambda d: d.update(format="other"), "not a quantize-act-scales"),
])
def test_bad_act_scales(tmp_path, golden_scales, edit, words):
    p = tmp_path / "s.json"
    p.write_text(json.dumps(_scales_doc(golden_scales, edit)))
    shutil.copy(golden_scales.replace(".json", ".channels.safetensors"), tmp_path)  # version 2: the statistics beside it
    with pytest.raises(QuantizeError) as e:
        _convert(tmp_path, golden_checkpoint("tiny-llama"), act_scales=str(p))
    assert words in e.value.message + " ".join(e.value.details)
    assert not (tmp_path / "out").exists()


def test_act_scales_not_json(tmp_path):
    with pytest.raises(CalibrationError, match="not valid JSON"):
        _convert(tmp_path, golden_checkpoint("tiny-llama"), act_scales=_write(tmp_path, "s.json", b"{nope"))


def test_act_scales_from_another_model(tmp_path, golden_scales):
    other = builders.llama(str(tmp_path / "other"))
    with pytest.raises(CalibrationError, match="made from another source"):
        _convert(tmp_path, other, act_scales=golden_scales)


def test_unknown_architecture_refused_but_data_free_works(tmp_path):
    src = builders.llama(str(tmp_path / "src"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["model_type"] = "my_secret_arch"
    json.dump(cfg, open(os.path.join(src, "config.json"), "w"))
    with pytest.raises(SourceError, match="model_type 'my_secret_arch'"):
        _convert(tmp_path, src, calib_data=_write(tmp_path, "c.jsonl", b'{"input_ids": [1, 2, 3]}\n'))
    assert not (tmp_path / "out").exists()
    _convert(tmp_path, src)  # no calibration: the constant, as before
    assert load_all(tmp_path / "out")["model.layers.0.mlp.down_proj.input_scale"].item() == 1.0


def test_dynamic_algorithms_ignore_calibration(tmp_path, capsys):
    convert(golden_checkpoint("tiny-llama"), str(tmp_path / "o"), algo="FP8_PB_WO", device="cpu", calib_data=CALIB)
    assert "--calib-data is ignored" in capsys.readouterr().err


def test_default_data_on_encoder_and_check_cli(tmp_path):
    """`--calib-data default` tokenizes the shipped text with the checkpoint's tokenizer (BERT encoder)."""
    src = builders.bert(str(tmp_path / "bert"))
    res = convert(src, str(tmp_path / "out"), algo="NVFP4", device="cpu", quiet=True, calib_data="default",
                      calib_samples=2, calib_seq_len=16)
    cal = res.report["calibration"]
    assert cal["data"]["spec"] == "default" and cal["data"]["samples"] == 2 and cal["data"]["tokens"] == 32
    out = load_all(tmp_path / "out")
    assert out["encoder.layer.0.attention.self.query.input_scale"].item() != pytest.approx(1 / 6)


BASE_ONLY = r"""
import sys
sys.modules["transformers"] = None  # importing it now raises ImportError
from quantize_cli.api import ConvertOptions, convert
from quantize_cli.errors import CalibrationError
convert(ConvertOptions(sys.argv[1], sys.argv[2], algo="NVFP4", device="cpu", quiet=True))
assert "transformers" not in [m for m in sys.modules if sys.modules[m] is not None]
try:
    convert(ConvertOptions(sys.argv[1], sys.argv[2] + "-c", algo="NVFP4", device="cpu", quiet=True, calib_data=sys.argv[3]))
except CalibrationError as e:
    print(e.message)
"""


def test_base_install_never_imports_transformers(tmp_path):
    out = subprocess.run([sys.executable, "-c", BASE_ONLY, golden_checkpoint("tiny-llama"), str(tmp_path / "o"), CALIB],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'quantize-cli[calib]'" in out.stdout
    assert os.path.exists(tmp_path / "o" / "model.safetensors")


def test_cli_exit_codes(tmp_path):
    """The CLI: bad data exits 1 with one `error:` line; conflicting flags exit 2."""
    from click.testing import CliRunner

    from quantize_cli.cli import main

    bad = _write(tmp_path, "e.jsonl", b"")
    r = CliRunner().invoke(main, ["convert", golden_checkpoint("tiny-llama"), "-o", str(tmp_path / "o"), "--algo", "FP8",
                                  "--device", "cpu", "--calib-data", bad])
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert r.exit_code == 1 and len(errors) == 1 and errors[0].startswith("error: --calib-data") and "empty" in errors[0]
    r = CliRunner().invoke(main, ["convert", golden_checkpoint("tiny-llama"), "-o", str(tmp_path / "o"), "--algo", "FP8",
                                  "--calib-data", CALIB, "--act-scales", "s.json"])
    assert r.exit_code == 2
    r = CliRunner().invoke(main, ["calibrate", golden_checkpoint("tiny-llama"), "--calib-data", CALIB, "-o",
                                  str(tmp_path / "s.json"), "--device", "cpu", "-q"])
    assert r.exit_code == 0, r.output
    assert json.load(open(tmp_path / "s.json"))["data"]["samples"] == 4


def test_text_samples_framed_with_special_tokens(tmp_path):
    """A .txt gives consecutive L-token pieces of the whole text and every paragraph on its own, each
    framed as served inputs are (<s> ... <unk> here, as [CLS] ... [SEP] for BERT)."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from quantize_cli.calibration import data

    folder = str(tmp_path / "tok")
    builders.tokenizer(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    bos, unk = tok.convert_tokens_to_ids("<s>"), tok.convert_tokens_to_ids("<unk>")
    backend = tok.backend_tokenizer
    backend.post_processor = TemplateProcessing(single="<s> $A <unk>", special_tokens=[("<s>", bos), ("<unk>", unk)])
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>").save_pretrained(folder)
    paras = [" ".join(f"fox {i} jumps over dog {i * 7}." for i in range(30)), "A short one.",
             " ".join(f"the dog sleeps {i} hours." for i in range(9))]  # no repeats: every piece differs
    text = "\n\n".join(paras) + "\n"
    samples, meta = data.load_samples(_write(tmp_path, "t.txt", text.encode()), folder, builders.VOCAB, samples=100, seq_len=24)
    plain = AutoTokenizer.from_pretrained(folder)
    ids = plain(text, add_special_tokens=False)["input_ids"]
    for s in samples:
        assert len(s) <= 24 and s[0] == bos and s[-1] == unk
    bodies = [s[1:-1] for s in samples]
    assert meta["samples"] == len(samples) and meta["tokens"] == sum(map(len, samples))
    # long context: consecutive pieces of the whole text, the shorter last one kept (no token lost)
    pieces = [ids[i : i + 22] for i in range(0, len(ids), 22)]
    assert len(pieces[-1]) < 22 and all(p in bodies for p in pieces)
    assert [b for b in bodies if b in pieces] == pieces  # in the text's order
    # short inputs: every paragraph on its own (cut to L), ordered by where it starts
    for para in paras:
        p_ids = plain(para.strip(), add_special_tokens=False)["input_ids"]
        assert all(p_ids[i : i + 22] in bodies for i in range(0, len(p_ids), 22)), para
    assert bodies.index(plain("A short one.", add_special_tokens=False)["input_ids"]) > bodies.index(pieces[1])
    assert len(set(map(tuple, bodies))) == len(bodies)  # a sample seen in both views runs once
    first, _ = data.load_samples(_write(tmp_path, "t.txt", text.encode()), folder, builders.VOCAB, samples=3, seq_len=24)
    assert first == samples[:3]
    with pytest.raises(UsageError, match="must exceed the 2 special"):
        data._TOKENIZERS.clear()
        data.load_samples(_write(tmp_path, "t.txt", text.encode()), folder, builders.VOCAB, samples=3, seq_len=2)
