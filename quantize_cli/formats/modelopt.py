"""The NVIDIA ModelOpt format (the default): ``hf_quant_config.json`` + config.json's flat block.

Everything the tool asks of this format is here or one import away: its schemes (``schemes/``:
ModelOpt's tensor layout is the reference layout), its documents (modelopt_documents.py), its
``exclude_modules`` rules (modelopt_exclusions.py), its verify rules (modelopt_verify.py) and which
engines serve which algorithm (``SERVED`` below, read from the engines' loaders:
vLLM 0.33 ``modelopt.py`` (ModelOptFp8Config, ModelOptNvFp4Config, ModelOptMxFp8Config,
ModelOptMixedPrecisionConfig), TensorRT-LLM's and SGLang's ModelOpt loaders; docs/formats.md).
"""

from __future__ import annotations

import json
import os

from ..algorithms import MIXED_PRECISION, algo_of_quant_algo
from ..jsonfile import read_json_or_none
from .base import Format, Served

HF_QUANT_CONFIG = "hf_quant_config.json"

# What serves each algorithm as a ModelOpt checkpoint (the one table; the card, check and the
# MIXED_PRECISION rules read it). vLLM 0.33: every algorithm but W8A16 per Linear; its single-algorithm
# MoE methods take per-tensor FP8, NVFP4 (W4A4 and W4A16) and MXFP8 experts; ModelOptMixedPrecisionConfig
# serves FP8_PB_WO experts too (its RoutedExperts branch).
SERVED: dict[str, Served] = {
    "FP8": Served(vllm=True, vllm_moe=True, mixed=True, mixed_moe=True, trtllm=True, sglang=True),
    "FP8_PER_CHANNEL_PER_TOKEN": Served(vllm=True, mixed=True, trtllm=True),
    "FP8_PB_WO": Served(vllm=True, mixed=True, mixed_moe=True),
    "NVFP4": Served(vllm=True, vllm_moe=True, mixed=True, mixed_moe=True, trtllm=True, sglang=True),
    "W4A16_NVFP4": Served(vllm=True, vllm_moe=True, mixed=True, mixed_moe=True),
    "INT8": Served(trtllm=True),  # written W8A16: TensorRT-LLM serves it, vLLM's ModelOpt loader does not
    "MXFP8": Served(vllm=True, vllm_moe=True, mixed=True, mixed_moe=True),
    "INT4": Served(trtllm=True),  # W4A16_AWQ: TensorRT-LLM; vLLM 0.33's ModelOpt loader has no W4A16_AWQ
    "INT4_ASYM": Served(),  # never written as ModelOpt (REFUSED)
}
# Algorithms this format does not write, and why (a usage error, exit 2).
REFUSED = {"INT4_ASYM": "ModelOpt's W4A16_AWQ (TensorRT-LLM) carries no zero points; use --format compressed-tensors "
                        "(W4A16_ASYM, served by vLLM) or --algo INT4"}


def _json_bytes(doc: dict, indent: int) -> bytes:
    return (json.dumps(doc, indent=indent) + "\n").encode()


class ModelOpt(Format):
    """ModelOpt 0.47's unified HF checkpoint (spec/modelopt-format.md)."""

    name = "modelopt"
    config_method = "modelopt"
    transformers_loads = False  # transformers skips an unknown quant_method: the weights would load as garbage
    documents_record_run = True  # hf_quant_config.json's converter block: calibration, weights, recipe, layout
    served = SERVED
    hub_tags = ("nvidia-modelopt",)

    def card_how(self) -> str:
        return "the NVIDIA ModelOpt checkpoint format (`quant_method: modelopt`)"

    def card_where(self, quant_algo):
        return f"`quant_algo: {quant_algo}` in hf_quant_config.json and config.json"

    def scheme(self, algo: str):
        from ..errors import UsageError
        from ..schemes import get_scheme

        scheme = get_scheme(algo)
        if scheme.algo in REFUSED:
            raise UsageError(f"--algo {scheme.algo} --format modelopt: {REFUSED[scheme.algo]}")
        return scheme

    def refusal(self, algo: str) -> str | None:
        """Why this format does not write `algo` (None: it does)."""
        return REFUSED.get(algo)

    def exclusion_list(self, mods, packed) -> list[str]:
        from .modelopt_exclusions import build_exclude_modules

        return build_exclude_modules(mods, dict(packed))

    def misread(self, mods, entries, packed):
        from .modelopt_exclusions import verify_exclusions

        return verify_exclusions(mods, entries, dict(packed))

    def mixed_where(self) -> str:
        return "a MIXED_PRECISION checkpoint"

    def documents(self, plan) -> dict[str, bytes]:
        """``hf_quant_config.json`` (indent 4, as ModelOpt writes it) and config.json with the flat block."""
        nested = self.nested_document(plan)
        config = _output_config(plan, nested)
        return {HF_QUANT_CONFIG: _json_bytes(nested, 4), "config.json": _json_bytes(config, 2)}

    def nested_document(self, plan) -> dict:
        """The ``hf_quant_config.json`` document of a plan; its ``converter`` block records what
        unpack and verify read back (the recipe, the layout, the calibration, the scale search)."""
        from ..modules.recipe import recipe_record
        from .modelopt_documents import hf_quant_config, mixed_hf_quant_config

        extra: dict = {"recipe": recipe_record(plan.recipe)}
        if plan.packing is not None:  # recorded so unpack can rebuild the identical plain checkpoint
            extra["layout"] = {**plan.packing.metadata(), "max_shard_size": str(plan.max_shard_size)}
        if plan.act_scales is not None:  # read back by verify: which input scales are calibrated, on what
            from ..calibration.apply import calibration_summary

            extra["calibration"] = calibration_summary(plan, full=False)
        if getattr(plan, "weights", None) is not None:  # --rounding gptq / --smooth: how the weights were chosen (verify reads it)
            extra["weights"] = plan.weights.describe()
        if plan.mixed:
            return mixed_hf_quant_config(plan.schemes, plan.kv_cache_dtype, extra)
        return hf_quant_config(plan.scheme, plan.exclude_modules, plan.kv_cache_dtype, extra)

    def detect(self, config, folder: str) -> bool:
        return super().detect(config, folder) or os.path.isfile(os.path.join(folder, HF_QUANT_CONFIG))

    def verify(self, path: str, config, res, source, method=None) -> None:  # the method is in hf_quant_config.json
        from .modelopt_verify import verify_modelopt

        verify_modelopt(path, res, source, self.mixed_served()[0])

    def output_facts(self, folder: str) -> dict:
        nested = read_json_or_none(os.path.join(folder, HF_QUANT_CONFIG)) or {}
        q = nested.get("quantization") or {}
        if q.get("quant_algo") == MIXED_PRECISION:
            algos: dict[str, int] = {}
            for cfg in (q.get("quantized_layers") or {}).values():
                algo = algo_of_quant_algo(str((cfg or {}).get("quant_algo"))) or str((cfg or {}).get("quant_algo"))
                algos[algo] = algos.get(algo, 0) + 1
        else:
            algos = {algo_of_quant_algo(str(q.get("quant_algo"))) or str(q.get("quant_algo")): 0}
        converter = nested.get("converter") or {}
        return {"algos": algos, "kv_cache_dtype": "fp8" if q.get("kv_cache_quant_algo") else None,
                "layout": (converter.get("layout") or {}).get("name", "plain"),
                "calibrated": bool((converter.get("calibration") or {}).get("calibrated"))}

    def describe(self, folder: str) -> str:
        nested = read_json_or_none(os.path.join(folder, HF_QUANT_CONFIG)) or {}
        q = nested.get("quantization") or {}
        return f"ModelOpt, quant_algo {q.get('quant_algo')!r}"


def _output_config(plan, nested: dict) -> dict:
    from .modelopt_documents import output_config

    config = output_config(plan.source.config, nested)
    layout = (nested.get("converter") or {}).get("layout")
    if layout:
        config["quantization_config"]["layout"] = layout
    return config


MODELOPT = ModelOpt()

__all__ = ["MODELOPT", "ModelOpt", "SERVED", "HF_QUANT_CONFIG"]
