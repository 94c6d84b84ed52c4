"""Tensor parallelism as vLLM splits a Linear: facts the shape rules (validate.py, formats/) use."""

from __future__ import annotations

from .classify import Module


def parallel_style(mod: Module, recipe) -> str:
    """How vLLM splits this Linear under tensor parallelism: ``column`` (N), ``row`` (K) or ``replicated``."""
    last = mod.name.rpartition(".")[2]
    par = recipe.parallel
    # a dotted entry names the last components (BERT's ``intermediate.dense`` is column-parallel
    # though its ``attention.output.dense`` and ``output.dense`` are row-parallel); it wins
    for style in ("column", "row", "replicated"):
        if any("." in e and mod.name.endswith("." + e) for e in par.get(style, ())):
            return style
    if last in par.get("replicated", ()):
        return "replicated"
    if last in par.get("row", ()):
        return "row"
    return "column"


def partition_shape(mod: Module, recipe, config: dict, tp: int) -> tuple[tuple[int, int] | None, str | None]:
    """The ``[N, K]`` one tensor-parallel rank holds, or (None, why) when the dims do not split."""
    n, k = mod.weight.shape  # type: ignore[union-attr]
    style = parallel_style(mod, recipe)
    if tp == 1 or style == "replicated":
        return (n, k), None
    last = mod.name.rpartition(".")[2]
    kv_heads = config.get("num_key_value_heads")
    heads = config.get("num_attention_heads")
    head_dim = config.get("head_dim") or (config.get("hidden_size", 0) // heads if heads else None)
    if style == "column" and last in ("k_proj", "v_proj") and kv_heads and head_dim and kv_heads < tp:
        return (head_dim, k), None  # vLLM replicates KV heads when there are fewer than ranks
    dim = n if style == "column" else k
    if dim % tp:
        return None, f"{'out' if style == 'column' else 'in'}-features {dim} do not split into {tp} {style}-parallel parts"
    return ((n // tp, k) if style == "column" else (n, k // tp)), None
