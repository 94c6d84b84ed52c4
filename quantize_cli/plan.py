"""The plan: pure data, built from config.json and the safetensors headers alone.

``build_plan`` decides every module (classify.py), groups fused members, lays out every output
tensor (name, dtype, shape, shard, byte offset) and orders the work by source position. Problems
(untakeable shapes, partial fused-group exclusions, exclusions vLLM would misread) are collected,
all of them, into ``plan.problems``; :func:`quantize_cli.validate.raise_problems` refuses them
before any tensor is read. ``--dry-run`` prints :meth:`Plan.to_text`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .checkpoint.safetensors_io import TensorInfo, nbytes_of
from .checkpoint.source import Source
from .classify import LINEAR, Module, classify, fused_groups, natural_key
from .exclusions import build_exclude_modules, verify_exclusions
from .experts import expand
from .matching import match_reason, vllm_rewrite
from .recipe import Recipe
from .schemes import Scheme


@dataclass(frozen=True)
class Member:
    """One weight to quantize: `source` (a 2-D tensor) written under `module`."""

    module: str
    source: TensorInfo

    @property
    def shape(self) -> tuple[int, int]:
        return self.source.shape  # type: ignore[return-value]


@dataclass(frozen=True)
class Task:
    """A unit of work. ``quantize``: members sharing one global amax (a fused group, or one
    Linear); ``copy``: one tensor copied byte for byte."""

    kind: str
    members: tuple[Member, ...] = ()
    copy: TensorInfo | None = None
    group: str | None = None

    @property
    def sources(self) -> list[TensorInfo]:
        return [m.source for m in self.members] if self.kind == "quantize" else [self.copy]  # type: ignore[list-item]

    @property
    def bytes_in(self) -> int:
        return sum(s.nbytes for s in self.sources)


@dataclass(frozen=True)
class OutTensor:
    """One output tensor and where it goes: shard index and offset in that shard's data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    shard: int = -1
    offset: int = -1


@dataclass
class Plan:
    source: Source
    scheme: Scheme
    recipe: Recipe
    modules: dict[str, Module]
    groups: dict[str, list[str]]
    tasks: list[Task]
    outputs: dict[str, OutTensor]
    shard_names: list[str]
    exclude_modules: list[str]
    kv_cache_dtype: str | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def bytes_in(self) -> int:
        return sum(t.bytes_in for t in self.tasks)

    @property
    def bytes_out(self) -> int:
        return sum(o.nbytes for o in self.outputs.values())

    @property
    def quantized(self) -> list[Module]:
        return [m for m in self.modules.values() if m.quantize]

    def to_text(self) -> str:
        """The human plan printed by --dry-run: one line per module, then the totals."""
        from .report import plan_text

        return plan_text(self)

    def to_json(self) -> dict:
        from .report import plan_json

        return plan_json(self)


def parse_size(text: str | int) -> int:
    """``"5GB"`` -> 5_000_000_000, ``"512MiB"`` -> 536_870_912, ``1234`` -> 1234 (bytes)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"{text!r} is not a size; use e.g. 5GB, 500MB, 2GiB or a byte count")
    unit = (m.group(2) or "B").upper()
    base = 1024 if "I" in unit else 1000
    power = "BKMGT".index(unit[0])
    return int(float(m.group(1)) * base**power)


def _problems_for_groups(plan_mods: dict[str, Module], groups: dict[str, list[Module]]) -> list[str]:
    out = []
    for prefix, members in groups.items():
        kept = [m.name for m in members if not m.quantize]
        if kept and len(kept) != len(members):
            names = ", ".join(m.name for m in members)
            out.append(
                f"{prefix}: only {', '.join(kept)} of the fused group ({names}) is excluded; vLLM loads the group "
                f"as one layer and refuses mixed precision; exclude all members or none"
            )
    return out


def _user_excludes(module: str, patterns) -> bool:
    return any(match_reason(module, e) for p in patterns for e in vllm_rewrite([p]))


def _moe_problems(mods: dict[str, Module], scheme: Scheme) -> list[str]:
    """Partial expert exclusions, and expert formats vLLM's ModelOpt MoE path cannot serve."""
    layers: dict[str, list[Module]] = {}
    for m in mods.values():
        if m.kind == LINEAR and m.vllm_prefix.endswith("experts") and m.vllm_prefix != m.name:
            layers.setdefault(m.vllm_prefix, []).append(m)
    out = []
    for prefix, experts in layers.items():
        kept = [m.name for m in experts if not m.quantize]
        if kept and len(kept) != len(experts):
            out.append(
                f"{prefix}: {len(kept)} of its {len(experts)} expert Linears are excluded (e.g. {kept[0]}); vLLM loads all "
                f"experts of a layer as one module, so exclude the whole layer (--exclude {prefix!r}) or none"
            )
    served = [p for p, ex in layers.items() if any(m.quantize for m in ex)]
    if served and not scheme.moe_served:
        out.append(
            f"{len(served)} MoE layer(s) (e.g. {served[0]}): vLLM's ModelOpt MoE path serves only FP8 (per-tensor), "
            f"NVFP4 and W4A16_NVFP4 experts, not {scheme.algo}; fix: --exclude '*.experts' to keep the experts in "
            f"the source dtype, or choose --algo NVFP4 / W4A16_NVFP4 / FP8"
        )
    return out


def _outputs(mods: dict[str, Module], scheme: Scheme) -> dict[str, OutTensor]:
    outs: dict[str, OutTensor] = {}
    for mod in mods.values():
        for leaf, info in mod.tensors.items():
            if mod.quantize and leaf == "weight":
                for suffix, (dtype, shape) in scheme.outputs(info.shape).items():
                    name = f"{mod.name}.{suffix}"
                    outs[name] = OutTensor(name, dtype, shape, nbytes_of(dtype, shape))
            else:
                outs[info.name] = OutTensor(info.name, info.dtype, info.shape, info.nbytes)
    return outs


def _assign_shards(outs: dict[str, OutTensor], max_shard: int) -> tuple[dict[str, OutTensor], list[str]]:
    """Greedy size-capped shards in natural name order (independent of the source sharding)."""
    ordered = sorted(outs.values(), key=lambda o: natural_key(o.name))
    shards: list[list[OutTensor]] = [[]]
    size = 0
    for o in ordered:
        if shards[-1] and size + o.nbytes > max_shard:
            shards.append([])
            size = 0
        shards[-1].append(o)
        size += o.nbytes
    n = len(shards)
    names = ["model.safetensors"] if n == 1 else [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    placed: dict[str, OutTensor] = {}
    for idx, shard in enumerate(shards):
        offset = 0
        for o in shard:
            placed[o.name] = OutTensor(o.name, o.dtype, o.shape, o.nbytes, idx, offset)
            offset += o.nbytes
    return placed, names


def _tasks(mods: dict[str, Module], groups: dict[str, list[Module]], scheme: Scheme, order: dict[str, int]) -> list[Task]:
    tasks: list[Task] = []
    grouped: set[str] = set()
    if scheme.shares_global_amax:
        for prefix, members in groups.items():
            if all(m.quantize for m in members):
                tasks.append(Task("quantize", tuple(Member(m.name, m.weight) for m in members), group=prefix))  # type: ignore[arg-type]
                grouped.update(m.name for m in members)
    for mod in mods.values():
        for leaf, info in mod.tensors.items():
            if mod.quantize and leaf == "weight":
                if mod.name not in grouped:
                    tasks.append(Task("quantize", (Member(mod.name, info),), group=mod.fused_group))
            else:
                tasks.append(Task("copy", copy=info))
    # Read in source order (file, then offset): sequential I/O whatever the output order.
    return sorted(tasks, key=lambda t: min(order[s.path] * (1 << 62) + s.offset for s in t.sources))


def build_plan(
    source: Source,
    scheme: Scheme,
    recipe: Recipe,
    exclude: list[str] | tuple[str, ...] = (),
    max_shard_size: int = 5 * 10**9,
    kv_cache_dtype: str | None = None,
) -> Plan:
    """Decide everything about a conversion without reading tensor data."""
    num_layers = source.config.get("num_hidden_layers")
    if not isinstance(num_layers, int):
        num_layers = (source.config.get("text_config") or {}).get("num_hidden_layers")
    tensors, problems = expand(source.tensors, recipe, lambda module: _user_excludes(module, exclude))
    mods = classify(tensors, recipe, list(exclude), num_layers if isinstance(num_layers, int) else None)
    groups = fused_groups(mods, recipe)
    problems += _problems_for_groups(mods, groups) + _moe_problems(mods, scheme)
    for mod in mods.values():
        if mod.quantize:
            why = scheme.shape_problem(mod.weight.shape)  # type: ignore[union-attr]
            if why:
                target = mod.vllm_prefix if mod.vllm_prefix != mod.name else mod.name  # whole fused group / MoE layer
                problems.append(
                    f"{mod.weight.name} {list(mod.weight.shape)}: {scheme.algo} {why}; "  # type: ignore[union-attr]
                    f"fix: --exclude {target!r}, or choose another --algo"
                )
    packed = dict(recipe.fused)
    entries = build_exclude_modules(mods, packed)
    problems += verify_exclusions(mods, entries, packed)
    order = {path: i for i, path in enumerate(dict.fromkeys(t.path for t in tensors.values()))}
    outs, shard_names = _assign_shards(_outputs(mods, scheme), max_shard_size)
    warnings = list(source.warnings)
    if scheme.static_input_scale is not None and any(m.quantize for m in mods.values()):
        warnings.append(
            f"{scheme.algo} uses static activation scales and no calibration data was given: every input_scale is the "
            f"documented constant {scheme.static_input_scale:g} (activation amax 448); accuracy is not calibrated"
        )
    for pat in exclude:
        if not any(pat in m.matched_by for m in mods.values()):
            warnings.append(f"--exclude {pat!r} matches no Linear module (vLLM's exact/substring/wildcard rules); check the pattern")
    if not any(m.quantize for m in mods.values()):
        warnings.append("no Linear is quantized: every weight is excluded or not a Linear")
    return Plan(
        source=source,
        scheme=scheme,
        recipe=recipe,
        modules=mods,
        groups={k: [m.name for m in v] for k, v in groups.items()},
        tasks=_tasks(mods, groups, scheme, order),
        outputs=outs,
        shard_names=shard_names,
        exclude_modules=entries,
        kv_cache_dtype=kv_cache_dtype,
        problems=problems,
        warnings=warnings,
    )


__all__ = ["Plan", "Task", "Member", "OutTensor", "build_plan", "parse_size", "natural_key", "LINEAR"]
