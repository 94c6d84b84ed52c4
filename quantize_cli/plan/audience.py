"""Who can load the output: an encoder or embedding model in the ModelOpt format (issue 26).

transformers has no ModelOpt loader: it warns "Unknown quantization type, got modelopt ... we
will skip the quantization" and computes with the quantized bytes read as plain weights
(embedding cosine ~0). Decoders are served by vLLM / TensorRT-LLM / SGLang, where ModelOpt is at
home; an encoder or embedding model (BERT, a sentence-transformers folder) is usually loaded
with transformers or sentence-transformers, which read the compressed-tensors format. ``check``
and ``convert`` say so (warning ``transformers-modelopt``), torch-free, from config.json and the
file list alone.
"""

from __future__ import annotations

from ..problems import WARNING, Finding

# config.json model_type of encoder-only architectures in transformers.
ENCODER_TYPES = frozenset({
    "albert", "bert", "camembert", "deberta", "deberta-v2", "distilbert", "electra", "ernie", "esm", "flaubert",
    "ibert", "jina_bert", "layoutlm", "megatron-bert", "modernbert", "mpnet", "new", "nomic_bert", "roberta",
    "roberta-prelayernorm", "roformer", "squeezebert", "xlm", "xlm-roberta", "xlm-roberta-xl", "xlnet",
})
# Architecture names of heads that are not text generation (BertModel is the bare encoder).
_ENCODER_HEADS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
                  "ForMultipleChoice", "ForNextSentencePrediction", "ForPreTraining")


def encoder_kind(config: dict, sidecars: list[str]) -> str | None:
    """What makes the source an encoder or embedding model (for the message), or None for a decoder."""
    if "modules.json" in sidecars:
        return "a sentence-transformers model (modules.json)"
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type.lower() in ENCODER_TYPES:
        return f"an encoder (model_type {model_type!r})"
    archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    if archs and all(a.endswith(_ENCODER_HEADS) and not a.endswith(("CausalLM", "LMHeadModel")) for a in archs):
        return f"an encoder ({archs[0]})"
    return None


CAUSAL_LM, ENCODER = "causal-lm", "encoder"


def model_kind(config: dict) -> str:
    """What `quantize eval` measures and gates the model as: CAUSAL_LM when config.json's
    architectures name a ``...ForCausalLM`` (next-token perplexity, KL, top-1), else ENCODER (the
    embedding cosine). ``check --json`` reports it as ``kind`` so a CI script picks its gates."""
    archs = config.get("architectures") or []
    return CAUSAL_LM if any(str(a).endswith("ForCausalLM") for a in archs) else ENCODER


def modelopt_audience_finding(config: dict, sidecars: list[str], modelopt: bool) -> Finding | None:
    """The warning for an encoder / embedding model written in the ModelOpt format, else None."""
    kind = encoder_kind(config, sidecars) if modelopt else None
    if kind is None:
        return None
    return Finding(WARNING, "transformers-modelopt", "--format modelopt",
                   f"the source is {kind}: transformers and sentence-transformers cannot load the ModelOpt format (they "
                   "skip its quantization and compute garbage); to load the output there, convert with "
                   "--format compressed-tensors (vLLM reads both formats)")


__all__ = ["encoder_kind", "model_kind", "modelopt_audience_finding", "ENCODER_TYPES", "CAUSAL_LM", "ENCODER"]
