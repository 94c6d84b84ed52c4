"""The LM head a model ties to its input embeddings: a Linear at load time with no tensor in the file.

Gemma, SmolLM2 and most small decoders set ``tie_word_embeddings``: the checkpoint holds only
``model.embed_tokens.weight``, and transformers (and vLLM) build ``lm_head`` sharing it. The module
list the plan classifies comes from the file's tensors, so it has no ``lm_head``; yet the written
exclusion list must name it: transformers' compressed-tensors integration quantizes every
``Linear`` not in ``ignore`` (the tied head included, which then has no weight and the load fails),
and ModelOpt and llm-compressor both list ``lm_head`` for such a model.
"""

from __future__ import annotations

from typing import Iterable, Mapping

HEAD = "lm_head"
# Architectures whose transformers class has a top-level ``lm_head`` Linear (decoders and the
# multimodal models built around one); encoders (BertModel ...) have none.
_WITH_HEAD = ("ForCausalLM", "ForConditionalGeneration")


def tied_head(config: Mapping, tensor_names: Iterable[str]) -> str | None:
    """``"lm_head"`` when the model has an LM head Linear whose weight is not in the checkpoint (it is
    tied to the embeddings), else None. `config`: config.json; `tensor_names`: every tensor's name."""
    if not any(str(a).endswith(_WITH_HEAD) for a in config.get("architectures") or []):
        return None
    if any(n == f"{HEAD}.weight" or n.endswith(f".{HEAD}.weight") for n in tensor_names):
        return None
    return HEAD
