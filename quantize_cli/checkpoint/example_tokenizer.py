"""The tokenizer shipped with the embedded examples (``example:tiny-llama`` ...), so that the advice
the tool gives on them works there: ``--calib-data default`` tokenizes the shipped calibration
text with the checkpoint's own tokenizer (issue 26: it answered that the example had none).

A byte-level BPE of 512 tokens (the examples' ``vocab_size``: every id fits the embedding), with
Llama's special tokens ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2 (``generation_config.json`` says BOS 1,
EOS 2) and BOS added in front of every text, as Llama's tokenizer does. It was trained by
:func:`build` with the ``tokenizers`` library on ``calibration/default_calibration.txt`` (written
for this project; no download) and is shipped as files (``tokenizer_files/``), so generating an
example needs neither ``tokenizers`` nor transformers: :func:`copy_into` copies them.

    python -m quantize_cli.checkpoint.example_tokenizer     # rebuild the shipped files (needs tokenizers)
"""

from __future__ import annotations

import os
import shutil
from importlib import resources

VOCAB_SIZE = 512
SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def copy_into(root: str) -> None:
    """Copy the shipped tokenizer files into example folder `root` (torch- and transformers-free)."""
    folder = resources.files(__package__).joinpath("tokenizer_files")
    for name in FILES:
        with resources.as_file(folder.joinpath(name)) as path:
            shutil.copyfile(path, os.path.join(root, name))


def build(folder: str) -> None:
    """Train the tokenizer on the shipped calibration text and write its files into `folder`."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    text = resources.files("quantize_cli.calibration").joinpath("default_calibration.txt").read_text(encoding="utf-8")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "model_max_length": 2048, "clean_up_tokenization_spaces": False}
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    for name, doc in (("tokenizer_config.json", config), ("special_tokens_map.json", special)):
        with open(os.path.join(folder, name), "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")


if __name__ == "__main__":  # pragma: no cover - rebuilds the shipped files
    build(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer_files"))
