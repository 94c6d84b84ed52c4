"""`quantize inspect` on a Hub repo id: config and safetensors headers only, never the weights."""

import os

import huggingface_hub
import pytest
from click.testing import CliRunner

from tests.conftest import convert
from quantize_cli.cli import main
from quantize_cli.errors import SourceError
from quantize_cli.inspect_checkpoint import inspect_checkpoint

from .test_low_disk import fake_hub  # noqa: F401 - the fixture: a repo served from a local folder


def test_inspect_a_hub_repo_from_headers_alone(fake_hub, monkeypatch):  # noqa: F811
    local, state = fake_hub
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("inspect downloaded a snapshot"))
    fetched = []
    real = huggingface_hub.hf_hub_download

    def download(repo, filename, **kw):
        fetched.append(filename)
        return real(repo, filename, **kw)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    r = CliRunner().invoke(main, ["inspect", "someone/tiny-llama"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0].startswith("someone/tiny-llama: 4 shards, ")
    assert r.output.splitlines()[1:] == inspect_checkpoint(local).splitlines()[1:]  # same summary as the folder's
    assert state["weights_downloaded"] == 0 and sorted(fetched) == ["config.json", "hf_quant_config.json"]


def test_inspect_a_quantized_hub_repo(fake_hub, tmp_path):  # noqa: F811
    local, state = fake_hub
    convert(local, str(tmp_path / "q"), algo="NVFP4", quiet=True)
    for f in os.listdir(local):  # the 'repo' now holds the quantized checkpoint
        os.remove(os.path.join(local, f))
    for f in os.listdir(tmp_path / "q"):
        os.rename(tmp_path / "q" / f, os.path.join(local, f))
    text = inspect_checkpoint("someone/tiny-llama")
    assert "quantized: quant_algo 'NVFP4'" in text and "producer 'modelopt'" in text
    assert state["weights_downloaded"] == 0


def test_inspect_refuses_what_is_neither_folder_nor_repo_id(tmp_path):
    with pytest.raises(SourceError, match="not a folder, a Hub repo id"):
        inspect_checkpoint(str(tmp_path / "missing"))
    with pytest.raises(SourceError, match="not a folder, a Hub repo id"):
        inspect_checkpoint("just-a-name")


def test_a_hub_source_is_the_cards_base_model(fake_hub, tmp_path):  # noqa: F811
    from huggingface_hub import ModelCard

    convert("someone/tiny-llama", str(tmp_path / "o"), algo="FP8", low_disk=True, quiet=True)
    card = ModelCard.load(str(tmp_path / "o" / "README.md"))
    assert card.data.base_model == "someone/tiny-llama" and card.data.base_model_relation == "quantized"
    assert "A quantized version of [someone/tiny-llama](https://huggingface.co/someone/tiny-llama)" in card.text
    assert "quantize convert someone/tiny-llama -o o --algo FP8" in card.text and str(tmp_path) not in card.text
