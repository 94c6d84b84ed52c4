"""The plan: pure data, built from config.json and the safetensors headers alone.

``build_plan`` decides every module (classify.py), groups fused members, lays out every output
tensor (name, dtype, shape, shard, byte offset) and orders the work by source position. Problems
(untakeable shapes, partial fused-group exclusions, exclusions vLLM would misread) are collected,
all of them, as findings (validate.py); ``convert`` refuses any error before a tensor is read. ``--dry-run`` prints :meth:`Plan.to_text`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .checkpoint.safetensors_io import TensorInfo, nbytes_of
from .checkpoint.source import Source
from .classify import LINEAR, Module, classify, fused_groups, natural_key
from .exclusions import build_exclude_modules
from .experts import expand
from .matching import match_reason, vllm_rewrite
from .recipe import Recipe
from .schemes import Scheme
from .validate import ERROR, WARNING, Finding, validate


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
    findings: list[Finding] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """Error messages: the conversion is refused while there is any."""
        return [f.message for f in self.findings if f.level == ERROR]

    @property
    def warnings(self) -> list[str]:
        return [f.message for f in self.findings if f.level == WARNING]

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


def _user_excludes(module: str, patterns) -> bool:
    return any(match_reason(module, e) for p in patterns for e in vllm_rewrite([p]))


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
    tp: int = 1,
) -> Plan:
    """Decide everything about a conversion without reading tensor data."""
    num_layers = source.config.get("num_hidden_layers")
    if not isinstance(num_layers, int):
        num_layers = (source.config.get("text_config") or {}).get("num_hidden_layers")
    tensors, split_problems = expand(source.tensors, recipe, lambda module: _user_excludes(module, exclude))
    mods = classify(tensors, recipe, list(exclude), num_layers if isinstance(num_layers, int) else None)
    groups = fused_groups(mods, recipe)
    entries = build_exclude_modules(mods, dict(recipe.fused))
    findings = [Finding(ERROR, "expert-layout", p.split(" ")[0], p) for p in split_problems]
    findings += validate(mods, groups, scheme, recipe, source.config, exclude, entries, source.warnings, tp)
    order = {path: i for i, path in enumerate(dict.fromkeys(t.path for t in tensors.values()))}
    outs, shard_names = _assign_shards(_outputs(mods, scheme), max_shard_size)
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
        findings=findings,
    )


__all__ = ["Plan", "Task", "Member", "OutTensor", "build_plan", "parse_size", "natural_key", "LINEAR"]
