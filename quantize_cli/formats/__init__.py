"""Output formats: ModelOpt (the default, ``checkpoint/metadata.py``) and compressed-tensors.

A format decides three things and nothing else: the tensors written per quantized Linear (its
:class:`~quantize_cli.schemes.Scheme`: names, dtypes, shapes, weight math), the metadata
documents (config.json block, ``hf_quant_config.json``) and how ``verify`` / ``inspect`` /
``unpack`` recognise a finished checkpoint. Plan, validation and the streaming executor are shared.

| ``--algo``                  | ModelOpt              | compressed-tensors preset          |
|-----------------------------|-----------------------|------------------------------------|
| FP8                         | FP8                   | FP8 (static per-tensor activations)|
| FP8_PER_CHANNEL_PER_TOKEN   | FP8_PER_CHANNEL_...   | FP8_DYNAMIC                        |
| FP8_PB_WO                   | fp8_pb_wo             | FP8_BLOCK                          |
| NVFP4                       | NVFP4                 | NVFP4 (static input_global_scale)  |
| W4A16_NVFP4                 | W4A16_NVFP4           | NVFP4A16                           |
| INT8                        | W8A16                 | W8A8 (dynamic per-token int8)      |
| MXFP8                       | MXFP8                 | MXFP8 (dynamic MX activations)     |

Mixed precision (``--algo-for``) is ModelOpt's MIXED_PRECISION there and several
``config_groups`` here (ct_mixed.py).
"""

from __future__ import annotations

import json
import os

from ..errors import UsageError
from ..schemes import Scheme
from .ct_mxfp8 import CtMxfp8
from .ct_schemes import CtFp8, CtInt8, CtNvfp4, CtScheme
from .static_scales import static_input_value

MODELOPT, COMPRESSED_TENSORS = "modelopt", "compressed-tensors"
FORMATS = (MODELOPT, COMPRESSED_TENSORS)

CT_SCHEMES: dict[str, CtScheme] = {
    s.algo: s
    for s in (
        CtFp8("FP8", "FP8", shares_global_amax=True, static_input_scale=static_input_value("FP8"), preset="FP8",
              granularity="tensor"),
        CtFp8("FP8_PER_CHANNEL_PER_TOKEN", "FP8_PER_CHANNEL_PER_TOKEN", preset="FP8_DYNAMIC", granularity="channel"),
        CtFp8("FP8_PB_WO", "fp8_pb_wo", row_align=128, preset="FP8_BLOCK", granularity="block"),
        CtNvfp4("NVFP4", "NVFP4", shares_global_amax=True, static_input_scale=static_input_value("NVFP4"),
                group_size=16, preset="NVFP4"),
        CtNvfp4("W4A16_NVFP4", "W4A16_NVFP4", shares_global_amax=True, group_size=16, preset="NVFP4A16"),
        CtInt8("INT8", "W8A16", preset="W8A8"),
        CtMxfp8("MXFP8", "MXFP8", group_size=32, preset="MXFP8"),
    )
}


def check_format(fmt: str | None) -> str:
    """The canonical format name; a UsageError names the choices."""
    name = (fmt or MODELOPT).lower().replace("_", "-")
    if name not in FORMATS:
        raise UsageError(f"--format {fmt!r}: choose modelopt or compressed-tensors")
    return name


def scheme_for(fmt: str, scheme: Scheme) -> Scheme:
    """The scheme that writes `scheme`'s algorithm in format `fmt` (ModelOpt: `scheme` itself)."""
    if check_format(fmt) != COMPRESSED_TENSORS:
        return scheme
    if scheme.algo not in CT_SCHEMES:  # every algorithm has a preset today; a new one must be added above
        raise UsageError(f"--algo {scheme.algo} --format compressed-tensors: compressed-tensors has no preset for it here; "
                         f"use --format modelopt")
    return CT_SCHEMES[scheme.algo]


def format_of(scheme: Scheme) -> str:
    return COMPRESSED_TENSORS if isinstance(scheme, CtScheme) else MODELOPT


def layout_problem(fmt: str, layout: str | None) -> str | None:
    """Why `layout` cannot be written in format `fmt` (None when it can)."""
    if check_format(fmt) == COMPRESSED_TENSORS and layout not in (None, "plain"):
        return (f"--layout {layout} --format compressed-tensors: compressed-tensors has no pre-packed kernel "
                "layouts (vLLM repacks its plain tensors at load time); use --layout plain or --format modelopt")
    return None


def metadata_documents(plan, kv_cache_dtype: str | None) -> dict[str, dict] | None:
    """File name -> the JSON document a non-ModelOpt format writes (None for ModelOpt: api.py's).

    compressed-tensors: config.json with the ``quantization_config`` block, and no
    ``hf_quant_config.json``. A pure function of the plan: the writer writes it and a ``--resume``
    of a finished DST compares it (retry.py).
    """
    if format_of(plan.scheme) == MODELOPT:
        return None
    from .ct_config import output_config, quantization_config
    from .ct_mixed import ct_groups

    groups = ct_groups(plan.schemes, plan.scheme, plan.modules) if plan.mixed else None  # --algo-for: one group per algorithm
    qconfig = quantization_config(plan.scheme.preset, list(plan.exclude_modules), kv_cache_dtype, groups)
    return {"config.json": output_config(plan.source.config, qconfig, "modules.json" in plan.source.sidecars)}  # ST: decompress at load


def write_metadata(plan, folder: str, kv_cache_dtype: str | None) -> bool:
    """Write the documents of :func:`metadata_documents` into `folder`; False for ModelOpt (api.py writes it).

    Keys sorted, as llm-compressor writes them, so the files diff cleanly.
    """
    docs = metadata_documents(plan, kv_cache_dtype)
    if docs is None:
        return False
    for name, doc in docs.items():
        with open(os.path.join(folder, name), "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
    return True


def detect_format(config: dict) -> str | None:
    """The format of a converted checkpoint from its config.json (None: not quantized by a known format)."""
    method = (config.get("quantization_config") or {}).get("quant_method")
    return {"modelopt": MODELOPT, "compressed-tensors": COMPRESSED_TENSORS}.get(method)


__all__ = ["FORMATS", "MODELOPT", "COMPRESSED_TENSORS", "CT_SCHEMES", "check_format", "scheme_for", "format_of",
           "layout_problem", "metadata_documents", "write_metadata", "detect_format"]
