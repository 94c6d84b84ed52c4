"""Where vLLM's block-FP8 loader needs out-features in 128-multiples (compressed-tensors FP8_BLOCK).

vLLM 0.33's ``validate_fp8_block_shape``: every member of a merged layer except the last
(``q_a_proj`` of DeepSeek's ``fused_qkv_a_proj``; q and k of ``qkv_proj``), and every
column-parallel part under tensor parallelism, must have a multiple of 128 rows. A standalone
Linear or the last member may end in a partial block (llm-compressor pads it with zeros).
"""

from __future__ import annotations

from ..modules.parallel import parallel_style, partition_shape
from ..problems import Problem
from .ct_schemes import BLOCK, CtFp8


def _is_block(scheme) -> bool:
    return isinstance(scheme, CtFp8) and scheme.granularity == "block"


def block_n_problems(mods, groups, scheme, recipe, config: dict, tp: int, schemes=None) -> list[Problem]:
    """Out-features vLLM's block loader cannot split (rule ``shape``; none for other schemes).

    `schemes`: mixed precision, module -> its scheme (`scheme` for the others)."""
    schemes = schemes or {}
    if not any(_is_block(s) for s in [scheme, *schemes.values()]):
        return []
    out = []
    not_last = {m.name for members in groups.values() for m in members[:-1]}
    for mod in mods.values():
        if not mod.quantize or mod.weight is None or not _is_block(schemes.get(mod.name, scheme)):
            continue
        part, _ = partition_shape(mod, recipe, config, tp)
        split = tp > 1 and parallel_style(mod, recipe) == "column"
        n = part[0] if part else mod.weight.shape[0]
        if (mod.name in not_last or split) and n % BLOCK:
            why = f"--tp {tp} column-parallel part" if split else f"a member of fused {mod.vllm_prefix} other than the last"
            out.append(Problem("shape", mod.name, f"{mod.weight.name} {list(mod.weight.shape)}: FP8_BLOCK needs out-features "
                               f"in multiples of {BLOCK} for {why} (vLLM validate_fp8_block_shape), got {n}; "
                               f"fix: --exclude {mod.vllm_prefix!r}, or choose another --algo"))
    return out
