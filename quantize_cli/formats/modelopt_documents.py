"""Pure builders for the metadata files: ``hf_quant_config.json`` and config.json's block.

Shapes follow the spec (modelopt-format §1) and the writer contract (design §7): the nested file
names ModelOpt as ``producer`` (the format we emulate, so TensorRT-LLM and vLLM recognise it) and
says honestly who wrote it under a top-level ``converter`` key, which loaders ignore.
"""

from __future__ import annotations

import json
import os

from .. import __version__
from ..algorithms import MIXED_PRECISION
from ..schemes import Scheme

MODELOPT_VERSION = "0.47.0"  # the ModelOpt release whose export format we reproduce
PRODUCER = {"name": "modelopt", "version": MODELOPT_VERSION}
FP8_KV_SCHEME = {"dynamic": False, "num_bits": 8, "type": "float"}


def hf_quant_config(scheme: Scheme, exclude_modules: list[str], kv_cache_dtype: str | None = None, extra: dict | None = None) -> dict:
    """The nested ``hf_quant_config.json`` document.

    Example (FP8_PB_WO): ``{"producer": {...}, "quantization": {"quant_algo": "fp8_pb_wo",
    "kv_cache_quant_algo": null, "exclude_modules": [...]}, "converter": {...}}``.
    """
    quant: dict = {"quant_algo": scheme.quant_algo, "kv_cache_quant_algo": _kv_algo(kv_cache_dtype)}
    if scheme.group_size is not None:
        quant["group_size"] = scheme.group_size
    quant["exclude_modules"] = sorted(exclude_modules)
    doc = {"producer": dict(PRODUCER), "quantization": quant, "converter": {"name": "quantize", "version": __version__}}
    if getattr(scheme, "scale_search", "none") != "none":  # loaders ignore it; verify and people read it
        doc["converter"]["scale_search"] = scheme.scale_search
        doc["converter"]["scale_search_weights"] = getattr(scheme, "weighting", "none")  # "activations": calibration E[x^2]
    if extra:
        doc["converter"].update(extra)
    return doc


def mixed_hf_quant_config(plan, kv_cache_dtype: str | None = None) -> dict:
    """The nested document of a MIXED_PRECISION plan (mixed.py: ``quantized_layers``, no exclude list)."""
    from ..plan.mixed import hf_quant_config as mixed_doc

    return mixed_doc(plan.schemes, _kv_algo(kv_cache_dtype), PRODUCER, {"name": "quantize", "version": __version__})


def _kv_algo(kv_cache_dtype: str | None) -> str | None:
    return None if kv_cache_dtype is None else kv_cache_dtype.upper()


def _group(num_bits: int, group_size: int | None) -> dict:
    g = {"dynamic": False, "num_bits": num_bits, "type": "float"}
    if group_size is not None:
        g["group_size"] = group_size
    return g


def config_groups(scheme: Scheme) -> dict | None:
    """``config_groups`` for the algorithms that carry one (FP8, NVFP4, W4A16_NVFP4), else None."""
    if scheme.quant_algo == "FP8":
        g = {"input_activations": _group(8, None), "weights": _group(8, None), "targets": ["Linear"]}
    elif scheme.quant_algo == "NVFP4":
        g = {"input_activations": _group(4, 16), "weights": _group(4, 16), "targets": ["Linear"]}
    elif scheme.quant_algo == "W4A16_NVFP4":
        g = {"weights": _group(4, 16), "targets": ["Linear"]}
    else:
        return None
    return {"group_0": g}


def flat_quantization_config(nested: dict) -> dict:
    """config.json's ``quantization_config`` derived from the nested document (spec §1.2).

    Key order: config_groups (FP8 / NVFP4 / W4A16_NVFP4 only), ignore, quant_algo,
    kv_cache_scheme (only when the KV cache is quantized), producer, quant_method.
    """
    from ..schemes import scheme_for_quant_algo

    q = nested["quantization"]
    out: dict = {}
    if q["quant_algo"] == MIXED_PRECISION:
        from ..plan.mixed import config_groups as mixed_groups

        out["config_groups"] = mixed_groups(q["quantized_layers"])
        out["quantized_layers"] = {k: dict(v) for k, v in q["quantized_layers"].items()}
    else:
        groups = config_groups(scheme_for_quant_algo(q["quant_algo"]))
        if groups:
            out["config_groups"] = groups
    out["ignore"] = list(q.get("exclude_modules", []))
    out["quant_algo"] = q["quant_algo"]
    kv = q.get("kv_cache_quant_algo")
    if kv:
        out["kv_cache_scheme"] = dict(FP8_KV_SCHEME) if kv == "FP8" else kv
    out["producer"] = dict(nested["producer"])
    out["quant_method"] = "modelopt"
    return out


def output_config(source_config: dict, nested: dict) -> dict:
    """The source config.json with the flat ``quantization_config`` block added (last key)."""
    cfg = {k: v for k, v in source_config.items() if k != "quantization_config"}
    cfg["quantization_config"] = flat_quantization_config(nested)
    return cfg


def write_config_files(folder: str, nested: dict, config: dict) -> None:
    """Write ``hf_quant_config.json`` (indent 4, as ModelOpt) and ``config.json`` into `folder`."""
    from ..checkpoint.durable import write_atomic

    for name, doc, indent in (("hf_quant_config.json", nested, 4), ("config.json", config, 2)):
        write_atomic(os.path.join(folder, name), (json.dumps(doc, indent=indent) + "\n").encode())
