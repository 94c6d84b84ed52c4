"""Pure builders for the metadata files: ``hf_quant_config.json`` and config.json's block.

Shapes follow the spec (modelopt-format §1) and the writer contract (design §7): the nested file
names ModelOpt as ``producer`` (the format we emulate, so TensorRT-LLM and vLLM recognise it) and
says honestly who wrote it under a top-level ``converter`` key, which loaders ignore.
"""

from __future__ import annotations

import json
from collections import defaultdict
import os

from .. import __version__
from ..algorithms import MIXED_PRECISION
from ..modules.classify import definition_order
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
    quant.update(getattr(scheme, "config_fields", {}))  # INT4: has_zero_point, pre_quant_scale
    quant["exclude_modules"] = sorted(exclude_modules)
    doc = {"producer": dict(PRODUCER), "quantization": quant, "converter": {"name": "quantize", "version": __version__}}
    if getattr(scheme, "scale_search", "none") != "none":  # loaders ignore it; verify and people read it
        doc["converter"]["scale_search"] = scheme.scale_search
        doc["converter"]["scale_search_weights"] = getattr(scheme, "weighting", "none")  # "activations": calibration E[x^2]
    if extra:
        doc["converter"].update(extra)
    return doc


def mixed_hf_quant_config(schemes: dict[str, Scheme], kv_cache_dtype: str | None = None, extra: dict | None = None) -> dict:
    """The nested ``hf_quant_config.json`` of a MIXED_PRECISION checkpoint (spec 1.1-1.3):
    ``quantized_layers`` (module -> its layer dict), no exclude list (a Linear absent from it is unquantized)."""
    quant = {"quant_algo": MIXED_PRECISION, "kv_cache_quant_algo": _kv_algo(kv_cache_dtype), "quantized_layers": quantized_layers(schemes)}
    doc = {"producer": dict(PRODUCER), "quantization": quant, "converter": {"name": "quantize", "version": __version__}}
    if extra:
        doc["converter"].update(extra)
    return doc


def _kv_algo(kv_cache_dtype: str | None) -> str | None:
    return None if kv_cache_dtype is None else kv_cache_dtype.upper()


def config_groups(scheme: Scheme) -> dict | None:
    """``config_groups`` of a single-algorithm checkpoint: FP8, NVFP4 and W4A16_NVFP4 carry one
    (``Scheme.modelopt_single_group``, as ModelOpt 0.47's exporter), others None."""
    if not scheme.modelopt_single_group:
        return None
    return {"group_0": {**group_config(scheme.quant_algo, scheme.group_size), "targets": ["Linear"]}}


def flat_quantization_config(nested: dict) -> dict:
    """config.json's ``quantization_config`` derived from the nested document (spec §1.2).

    Key order: config_groups (FP8 / NVFP4 / W4A16_NVFP4 only), ignore, quant_algo,
    kv_cache_scheme (only when the KV cache is quantized), producer, quant_method.
    """
    from ..schemes import scheme_for_quant_algo

    q = nested["quantization"]
    out: dict = {}
    if q["quant_algo"] == MIXED_PRECISION:
        out["config_groups"] = mixed_config_groups(q["quantized_layers"])
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


# --- MIXED_PRECISION (--algo-for), as ModelOpt 0.47 writes it -----------------------------------

def layer_config(scheme: Scheme) -> dict:
    """ModelOpt's per-layer dict (``process_layer_quant_config``)."""
    cfg: dict = {"quant_algo": scheme.quant_algo}
    if scheme.group_size is not None:
        cfg["group_size"] = scheme.group_size
    return cfg


def quantized_layers(schemes: dict[str, Scheme]) -> dict[str, dict]:
    """Module -> layer dict, in the model's definition order (:func:`definition_order`)."""
    return {name: layer_config(schemes[name]) for name in sorted(schemes, key=definition_order)}


def group_config(quant_algo: str, group_size: int | None) -> dict:
    """ModelOpt's ``_quant_algo_to_group_config`` for the algorithms we write (single and mixed
    checkpoints): the scheme's own (``Scheme.modelopt_group``), else just the quant_algo."""
    from ..schemes import scheme_for_quant_algo

    scheme = scheme_for_quant_algo(quant_algo)
    group = scheme.modelopt_group(group_size) if scheme is not None and scheme.quant_algo == quant_algo else None
    return group if group is not None else {"quant_algo": quant_algo}  # fp8_pb_wo, W8A16: ModelOpt has no group details


def mixed_config_groups(layers: dict[str, dict]) -> dict:
    """One group per distinct layer dict (in first-seen order), targets sorted."""
    by_cfg: dict[tuple, list[str]] = defaultdict(list)
    for name, cfg in layers.items():
        by_cfg[tuple(sorted(cfg.items()))].append(name)
    groups = {}
    for i, (key, names) in enumerate(by_cfg.items()):
        cfg = dict(key)
        g = group_config(cfg.get("quant_algo", ""), cfg.get("group_size"))
        g["targets"] = sorted(names)
        groups[f"group_{i}"] = g
    return groups
