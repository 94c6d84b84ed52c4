"""The compressed-tensors format (``--format compressed-tensors``): llm-compressor's checkpoints.

One object for the format: its schemes (ct_schemes.py, ct_mxfp8.py; the weight math of
llm-compressor 0.14's presets), its documents (ct_config.py: config.json's ``quantization_config``;
several config groups for mixed precision: ct_mixed.py), its ``ignore`` rules (ct_exclusions.py),
its shape rules (block_shapes.py), its verify rules (ct_verify.py) and what serves it (each scheme's ``vllm_linear`` / ``vllm_moe``:
vLLM 0.33 serves every preset here per Linear and per MoE layer, vllm_ct.py; transformers
decompresses it on load).

| ``--algo``                  | compressed-tensors preset          |
|-----------------------------|------------------------------------|
| FP8                         | FP8 (static per-tensor activations)|
| FP8_PER_CHANNEL_PER_TOKEN   | FP8_DYNAMIC                        |
| FP8_PB_WO                   | FP8_BLOCK                          |
| NVFP4                       | NVFP4 (static input_global_scale)  |
| W4A16_NVFP4                 | NVFP4A16                           |
| INT8                        | W8A8 (dynamic per-token int8)      |
| MXFP8                       | MXFP8 (dynamic MX activations)     |
| INT4 / INT4_ASYM            | W4A16 / W4A16_ASYM (pack-quantized)|
"""

from __future__ import annotations

import json
import os

from ..algorithms import ALGORITHMS, FP8_BLOCK
from ..errors import UsageError
from ..jsonfile import read_json_or_none
from ..schemes.searched import searchable
from .base import Format, Served
from .ct_int4 import CtInt4
from .ct_mxfp8 import CtMxfp8
from .ct_schemes import CtFp8, CtInt8, CtNvfp4, CtScheme
from .static_scales import static_input_value


def _ct(cls, algo: str, preset: str, **kw) -> CtScheme:
    a = ALGORITHMS[algo]
    static = static_input_value(algo) if a.static else None
    return cls(algo, a.quant_algo, shares_global_amax=a.shares_global_amax, static_input_scale=static, group_size=a.group_size,
               preset=preset, **kw)


# vLLM 0.33's methods (vllm_ct.py): Linear scheme, MoE method
_FP8 = ("CompressedTensorsW8A8Fp8", "CompressedTensorsW8A8Fp8MoEMethod")
_FP4 = ("CompressedTensorsW4A4Fp4", "CompressedTensorsW4A4Nvfp4MoEMethod")
_WNA16 = ("CompressedTensorsWNA16", "CompressedTensorsWNA16MoEMethod")  # Marlin / Machete / CUTLASS W4A16


def _vllm(methods: tuple[str, str], static: bool | None) -> dict:
    return {"vllm_linear": methods[0], "vllm_static": static, "vllm_moe": methods[1]}


# algo -> the scheme writing llm-compressor's preset (the one table of this format's algorithms), with
# what vLLM 0.33 does with it (`static`: its static-input flag, None where the scheme has none)
CT_SCHEMES: dict[str, CtScheme] = {s.algo: s for s in (
    _ct(CtFp8, "FP8", "FP8", granularity="tensor", **_vllm(_FP8, True)),
    _ct(CtFp8, "FP8_PER_CHANNEL_PER_TOKEN", "FP8_DYNAMIC", granularity="channel", **_vllm(_FP8, False)),
    _ct(CtFp8, "FP8_PB_WO", "FP8_BLOCK", granularity="block", row_align=FP8_BLOCK, **_vllm(_FP8, False)),
    _ct(CtNvfp4, "NVFP4", "NVFP4", **_vllm(_FP4, True)),
    _ct(CtNvfp4, "W4A16_NVFP4", "NVFP4A16", **_vllm(_FP4, False)),
    _ct(CtInt8, "INT8", "W8A8", **_vllm(("CompressedTensorsW8A8Int8", "CompressedTensorsW8A8Int8MoEMethod"), False)),
    _ct(CtMxfp8, "MXFP8", "MXFP8", **_vllm(("CompressedTensorsW8A8Mxfp8", "CompressedTensorsW8A8Mxfp8MoEMethod"), None)),
    _ct(CtInt4, "INT4", "W4A16", row_align=2, symmetric=True, **_vllm(_WNA16, None)),
    # uint4 with zero points, of eight rows per int32
    _ct(CtInt4, "INT4_ASYM", "W4A16_ASYM", row_align=8, symmetric=False, **_vllm(_WNA16, None)),
)}

# vLLM 0.33 serves every preset per Linear and per MoE layer, alone or mixed (each has a Linear scheme
# and a MoE method: vllm_ct.py).
SERVED = {algo: Served(vllm=True, vllm_moe=True, mixed=True, mixed_moe=True) for algo, s in CT_SCHEMES.items()
          if s.vllm_linear and s.vllm_moe}


class CompressedTensors(Format):
    """llm-compressor 0.14 / compressed-tensors 0.19 checkpoints (config.json only)."""

    name = "compressed-tensors"
    config_method = "compressed-tensors"
    transformers_loads = True
    reference_math_only = True  # llm-compressor's bytes: the torch references, on every device
    served = SERVED

    def written_as(self, scheme) -> str:
        """llm-compressor's preset the config groups follow (``W4A16`` for INT4), not ModelOpt's quant_algo."""
        return f"compressed-tensors preset {scheme.preset!r}"

    def scheme(self, algo: str):
        if algo not in CT_SCHEMES:
            raise UsageError(f"--algo {algo} --format compressed-tensors: compressed-tensors has no preset for it here; "
                             f"use --format modelopt")
        return CT_SCHEMES[algo]

    def layout_problem(self, layout):
        if layout not in (None, "plain"):
            return (f"--layout {layout} --format compressed-tensors: compressed-tensors has no pre-packed kernel "
                    "layouts (vLLM repacks its plain tensors at load time); use --layout plain or --format modelopt")
        return None

    def scale_search_problem(self, method: str, algo: str | None = None):
        # a preset is searched where its scheme brings its own search (CtInt4.search_quantize)
        if (method or "none").lower() != "none" and not (algo in CT_SCHEMES and searchable(CT_SCHEMES[algo])):
            return (f"--scale-search {method} --format {self.name}: searched scales are written in the ModelOpt format "
                    "only for now (compressed-tensors: INT4 and INT4_ASYM); drop --scale-search or use --format modelopt")
        return None

    def exclusion_list(self, mods, packed) -> list[str]:
        from .ct_exclusions import ct_ignore

        return ct_ignore(mods)

    def misread(self, mods, entries, packed):
        from .ct_exclusions import ct_misread

        return ct_misread(mods, entries, dict(packed))

    def shape_problems(self, mods, groups, scheme, recipe, config, tp, schemes=None):
        from .block_shapes import block_n_problems

        return block_n_problems(mods, groups, scheme, recipe, config, tp, schemes)

    def mixed_where(self) -> str:
        return "a compressed-tensors checkpoint with several config_groups"

    def vllm_decisions(self, plan) -> dict[str, str]:
        from .vllm_ct import vllm_schemes

        return vllm_schemes(plan)

    def documents(self, plan) -> dict[str, bytes]:
        """config.json with the ``quantization_config`` block (no ``hf_quant_config.json``); keys
        sorted, as llm-compressor writes them, so the files diff cleanly."""
        from .ct_config import output_config, quantization_config
        from .ct_mixed import ct_groups

        groups = ct_groups(plan.schemes, plan.scheme, plan.modules) if plan.mixed else None  # one group per algorithm
        qconfig = quantization_config(plan.scheme.preset, list(plan.exclude_modules), plan.kv_cache_dtype, groups)
        doc = output_config(plan.source.config, qconfig, "modules.json" in plan.source.sidecars)  # sentence-transformers: decompress at load
        return {"config.json": (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()}

    def verify(self, path: str, config, res, source, method=None) -> None:
        from .ct_verify import verify_ct

        verify_ct(path, config, res, source, CT_SCHEMES, method)

    def output_facts(self, folder: str) -> dict:
        from .ct_mixed import group_targets
        from .ct_verify import group_preset

        q = (read_json_or_none(os.path.join(folder, "config.json")) or {}).get("quantization_config") or {}
        by_preset = {s.preset: s.algo for s in CT_SCHEMES.values()}
        algos: dict[str, int] = {}
        for group, targets in group_targets(q).items():
            preset = group_preset((q.get("config_groups") or {}).get(group) or {}, q)
            algo = by_preset.get(preset or "", preset or group)
            algos[algo] = algos.get(algo, 0) + (0 if targets == ["Linear"] else len(targets))
        return {"algos": algos, "kv_cache_dtype": "fp8" if q.get("kv_cache_scheme") else None, "layout": "plain",
                "calibrated": None}

    def describe(self, folder: str) -> str:
        from .ct_verify import describe

        q = (read_json_or_none(os.path.join(folder, "config.json")) or {}).get("quantization_config") or {}
        return f"compressed-tensors, preset {describe(q)}"


COMPRESSED_TENSORS = CompressedTensors()

__all__ = ["COMPRESSED_TENSORS", "CompressedTensors", "CT_SCHEMES"]
