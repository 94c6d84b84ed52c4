"""The plan: pure data, built from config.json and the safetensors headers alone.

``build_plan`` decides every module (classify.py), groups fused members, lays out every output
tensor (name, dtype, shape, shard, byte offset) and orders the work by source position. Problems
(untakeable shapes, partial fused-group exclusions, exclusions vLLM would misread) are collected,
all of them, as findings (validate.py); ``convert`` refuses any error before a tensor is read. ``--dry-run`` prints :meth:`Plan.to_text`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..checkpoint.safetensors_header import TensorInfo, nbytes_of
from ..checkpoint.source import Source
from ..modules.classify import LINEAR, Module, classify, fused_groups, natural_key
from ..modules.experts import expand
from ..modules.matching import match_reason, vllm_rewrite
from ..modules.recipe import Recipe
from ..modules.tied_head import tied_head
from ..schemes import Scheme
from ..problems import ERROR, WARNING, Finding
from .validate import dense_layout_findings, layout_plain_finding, layout_request, moe_layers, moe_roles_finding, moe_stack_finding, name_clash_finding, problem_findings, validate
from . import mixed
from .audience import modelopt_audience_finding
from ..modules.experts import expert_names
from ..layouts import Layout
from ..layouts.packing import Packing, act_dtype_from_config
from ..calibration.apply import ActScales, for_plan
from ..calibration.search_weights import SearchWeights, for_plan as search_for_plan


if TYPE_CHECKING:
    from ..formats.base import Format


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
    Linear); ``moe``: every expert Linear of one MoE layer, packed into stacks (``--layout``);
    ``copy``: one tensor copied byte for byte. ``outputs``: the output tensors it writes."""

    kind: str
    members: tuple[Member, ...] = ()
    copy: TensorInfo | None = None
    group: str | None = None
    outputs: tuple[str, ...] = ()
    scheme: Scheme | None = None  # the members' scheme (mixed precision); None: the plan's

    @property
    def sources(self) -> list[TensorInfo]:
        if self.kind == "const":  # calibrated KV scales: written from the plan, nothing read
            return []
        return [m.source for m in self.members] if self.kind != "copy" else [self.copy]  # type: ignore[list-item]

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


@dataclass(frozen=True)
class Plan:
    """What a conversion will do, decided before any tensor is read. Frozen: execution never
    changes it (a resolved Hub source is a new plan, ``dataclasses.replace``)."""

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
    packing: Packing | None = None
    act_scales: "ActScales | None" = None  # calibrated input/KV amax (calibration/apply.py); None: constants
    search_weights: "SearchWeights | None" = None  # --scale-search mse with data: E[x_j^2] per module (calibration/search_weights.py)
    schemes: dict[str, Scheme] = field(default_factory=dict)  # mixed precision: module -> its scheme
    scheme_rules: dict[str, str] = field(default_factory=dict)  # mixed precision: module -> the rule that chose it
    format: "Format" = None  # type: ignore[assignment]  # the output format (formats/): documents, exclusions, serving
    weights: object | None = None  # --rounding gptq / --smooth: the side folder (calibration/weights_file.WeightsDoc)
    transform: object | None = None  # convert's GPTQ / smoothing stage (calibration/stage.Pending): decided, run under DST's lock
    max_shard_size: str | int = 5 * 10**9  # as given (--max-shard-size); the shard layout above is derived from it

    def __post_init__(self):
        if self.format is None:  # plans built by hand in tests: ModelOpt, the default
            from ..formats import MODELOPT

            object.__setattr__(self, "format", MODELOPT)

    @property
    def mixed(self) -> bool:
        """More than one algorithm: written as ModelOpt MIXED_PRECISION (mixed.py)."""
        return bool(self.schemes)

    def scheme_of(self, module: str) -> Scheme:
        """The scheme quantizing `module` (the plan's own unless mixed precision chose another)."""
        return self.schemes.get(module, self.scheme)

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
        from .render import plan_text

        return plan_text(self)

    def to_json(self) -> dict:
        from .render import plan_json

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
    try:
        return int(float(m.group(1)) * base**power)
    except OverflowError:  # thousands of digits: float() gives inf
        raise ValueError(f"{str(text)[:40]!r}... is too large to be a size; use e.g. 5GB") from None


def _packing(layout: str, scheme: Scheme, config: dict, findings: list[Finding]) -> Packing | None:
    """The --layout to pack into, or None (plain, or refused with a finding).

    Where the dense kernel reads the plain bytes ("no bytes move", e.g. CUTLASS FP8) but its MoE
    kernel has a layout of its own, dense Linears are written plain and MoE stacks packed.
    """
    if layout in (None, "plain"):
        return None
    act, why = act_dtype_from_config(config)
    refusal, dense = layout_request(layout, scheme.algo, why if act is None else None)
    if refusal is not None:
        findings.append(refusal)
        return None
    return Packing(Layout(layout), scheme.algo, act, dense=dense)


def _user_excludes(module: str, patterns) -> bool:
    return any(match_reason(module, e) for p in patterns for e in vllm_rewrite([p]))


def _outputs(mods: dict[str, Module], scheme: Scheme, packing: Packing | None, stacks: dict[str, dict],
             schemes: dict[str, Scheme], findings: list[Finding] | None = None) -> dict[str, OutTensor]:
    outs = _ClashCheckingDict(findings)
    for mod in mods.values():
        for leaf, info in mod.tensors.items():
            if mod.quantize and leaf == "weight":
                if packing is None:
                    specs = schemes.get(mod.name, scheme).outputs_for(info)
                elif mod.vllm_prefix in stacks:  # an expert: its plain scales; the weight goes into the stacks
                    specs = {k: v for k, v in scheme.outputs_for(info).items() if k != "weight"}
                elif packing.dense and not packing.dense_problem(info.shape):
                    specs = packing.dense_specs(info.shape)
                else:  # written plain (no bytes move for this kernel), or refused by a finding
                    specs = scheme.outputs_for(info)
                for suffix, (dtype, shape) in specs.items():
                    name = f"{mod.name}.{suffix}"
                    outs[name] = OutTensor(name, dtype, shape, nbytes_of(dtype, shape))
            else:
                outs[info.name] = OutTensor(info.name, info.dtype, info.shape, info.nbytes)
    for specs in stacks.values():
        for name, (dtype, shape) in specs.items():
            outs[name] = OutTensor(name, dtype, shape, nbytes_of(dtype, shape))
    return dict(outs)


class _ClashCheckingDict(dict):
    """Output name -> OutTensor; a second writer for one name (a source tensor named like a tensor
    the conversion generates, e.g. ``up_proj.input_scale``) is an error finding, never an overwrite."""

    def __init__(self, findings: list[Finding] | None):
        super().__init__()
        self.findings = findings if findings is not None else []

    def __setitem__(self, name: str, out: OutTensor) -> None:
        if name in self:
            self.findings.append(name_clash_finding(name))
            return
        super().__setitem__(name, out)


def _moe_stacks(mods: dict[str, Module], recipe: Recipe, packing: Packing | None, findings: list[Finding]) -> dict[str, dict]:
    """Packed-stack output specs per quantized MoE layer (``--layout`` only); problems as findings."""
    if packing is None:
        return {}
    names = expert_names(recipe)
    stacks = {}
    for container, experts in moe_layers(mods).items():
        if not all(m.quantize for m in experts):
            continue
        by_role = {r: [m for m in experts if m.name.endswith("." + names[r])] for r in ("gate", "up", "down")}
        count = len(by_role["down"])
        if not count or any(len(v) != count for v in by_role.values()):
            findings.append(moe_roles_finding(container, names, packing.layout.value))
            continue
        i, h = by_role["gate"][0].weight.shape  # type: ignore[union-attr]
        why = packing.moe_problem(count, i, h)
        if why:
            findings.append(moe_stack_finding(container, (count, i, h), packing.layout.value, why))
            continue
        stacks[container] = packing.moe_stack_specs(container, count, i, h)
    return stacks


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


def _expert_order(container: str, m: Module, names: dict[str, str]) -> tuple[int, int]:
    e, _, proj = m.name[len(container) + 1 :].partition(".")
    return int(e), ["gate", "up", "down"].index(next(r for r, n in names.items() if n == proj))


def _tasks(mods: dict[str, Module], groups: dict[str, list[Module]], scheme: Scheme, order: dict[str, int],
           stacks: dict[str, dict], recipe: Recipe, outs: dict[str, OutTensor], schemes: dict[str, Scheme],
           constants: tuple[str, ...] = ()) -> list[Task]:
    by_module: dict[str, list[str]] = {}
    for name in outs:
        if name not in constants:  # written by the const task only (calibrated KV scales named under k_proj / v_proj)
            by_module.setdefault(name.rpartition(".")[0], []).append(name)

    def written(members) -> tuple[str, ...]:
        """What quantizing `members` writes: their outputs except the other leaves copied as-is (bias)."""
        return tuple(n for m in members for n in by_module.get(m.name, ())
                     if n.rpartition(".")[2] == "weight" or n.rpartition(".")[2] not in m.tensors)

    tasks: list[Task] = []
    grouped: set[str] = set()
    names = expert_names(recipe)
    for container, experts in moe_layers(mods).items():
        if container in stacks:
            members = sorted(experts, key=lambda m: _expert_order(container, m, names))
            tasks.append(Task("moe", tuple(Member(m.name, m.weight) for m in members), group=container,  # type: ignore[arg-type]
                              outputs=written(members) + tuple(stacks[container])))
            grouped.update(m.name for m in members)
    for prefix, members in groups.items():
        own = schemes.get(members[0].name) if schemes else None  # a fused group has one scheme (mixed.findings)
        if (own or scheme).shares_global_amax and all(m.quantize for m in members) and not grouped & {m.name for m in members}:
            tasks.append(Task("quantize", tuple(Member(m.name, m.weight) for m in members), group=prefix,  # type: ignore[arg-type]
                              outputs=written(members), scheme=own))
            grouped.update(m.name for m in members)
    for mod in mods.values():
        for leaf, info in mod.tensors.items():
            if mod.quantize and leaf == "weight":
                if mod.name not in grouped:
                    tasks.append(Task("quantize", (Member(mod.name, info),), group=mod.fused_group, outputs=written([mod]),
                                      scheme=schemes.get(mod.name)))
            else:
                tasks.append(Task("copy", copy=info, outputs=(info.name,)))
    # Read in source order (file, then offset): sequential I/O whatever the output order.
    return sorted(tasks, key=lambda t: min(order[s.path] * (1 << 62) + s.offset for s in t.sources))


def build_plan(
    source: Source,
    scheme: Scheme,
    recipe: Recipe,
    exclude: list[str] | tuple[str, ...] = (),
    max_shard_size: int | str = 5 * 10**9,
    kv_cache_dtype: str | None = None,
    tp: int = 1,
    layout: str = "plain",
    act_scales=None,
    algo_for: list | tuple = (),
    fmt: "Format | None" = None,
) -> Plan:
    """Decide everything about a conversion without reading tensor data.

    `scheme`: --algo's scheme in format `fmt` (ModelOpt when None); `algo_for`: :class:`mixed.AlgoRule` s
    choosing another scheme for some modules; `max_shard_size`: bytes, or a size such as ``"5GB"``."""
    if fmt is None:
        from ..formats import MODELOPT as fmt
    num_layers = source.config.get("num_hidden_layers")
    if not isinstance(num_layers, int):
        num_layers = (source.config.get("text_config") or {}).get("num_hidden_layers")
    tensors, split_problems = expand(source.tensors, recipe, lambda module: _user_excludes(module, exclude))
    mods = classify(tensors, recipe, list(exclude), num_layers if isinstance(num_layers, int) else None)
    groups = fused_groups(mods, recipe)
    entries = fmt.exclusion_list(mods, dict(recipe.fused))  # ModelOpt exclude_modules or compressed-tensors ignore
    head = tied_head(source.config, source.tensors)  # the tied LM head: a kept Linear with no tensor of its own
    if head and head not in entries:
        entries = sorted([*entries, head])
    findings = problem_findings(split_problems)
    schemes, rules_used = mixed.assign(mods, scheme, list(algo_for))
    if algo_for:
        findings += mixed.findings(mods, groups, moe_layers(mods), schemes, rules_used, list(algo_for), layout, fmt)
    if not mixed.is_mixed(schemes):  # one algorithm after all: the plain single-format checkpoint
        scheme = next(iter(schemes.values()), scheme)
        schemes, rules_used = {}, {}
    findings += validate(mods, groups, scheme, recipe, source.config, exclude, entries, source.warnings, tp, schemes, fmt)
    audience = modelopt_audience_finding(source.config, source.sidecars, not fmt.transformers_loads)  # an encoder transformers cannot load
    findings += [audience] if audience else []
    if schemes:
        layout = "plain"  # refused above (mixed.findings) when another was asked for
    packing = _packing(layout, scheme, source.config, findings)
    stacks = _moe_stacks(mods, recipe, packing, findings)
    if packing is not None and not packing.dense and not stacks:  # nothing moves: say so, write plain
        findings.append(layout_plain_finding(layout, scheme.algo))
        packing = None
    if packing is not None:
        findings += dense_layout_findings(mods, packing, stacks)
    calib = for_plan(act_scales, mods, groups, lambda m: schemes.get(m, scheme), kv_cache_dtype, findings)  # a ScalesDoc or None
    search = search_for_plan(act_scales, mods, groups, scheme, findings)
    if search is not None:  # recorded in hf_quant_config.json (converter.scale_search_weights)
        scheme = replace(scheme, weighting="activations")
    kv_outs = {n: OutTensor(n, "F32", (), 4) for n in (calib.kv_tensors() if calib else {})}
    order = {path: i for i, path in enumerate(dict.fromkeys(t.path for t in tensors.values()))}
    outs, shard_names = _assign_shards({**_outputs(mods, scheme, packing, stacks, schemes, findings), **kv_outs}, parse_size(max_shard_size))
    return Plan(
        source=source,
        scheme=scheme,
        recipe=recipe,
        modules=mods,
        groups={k: [m.name for m in v] for k, v in groups.items()},
        tasks=_tasks(mods, groups, scheme, order, stacks, recipe, outs, schemes, tuple(kv_outs))
        + ([Task("const", outputs=tuple(kv_outs))] if kv_outs else []),
        outputs=outs,
        shard_names=shard_names,
        exclude_modules=entries,
        kv_cache_dtype=kv_cache_dtype,
        findings=findings,
        packing=packing,
        act_scales=calib,
        search_weights=search,
        schemes=schemes,
        scheme_rules=rules_used,
        format=fmt,
        max_shard_size=max_shard_size,
    )


__all__ = ["Plan", "Task", "Member", "OutTensor", "build_plan", "parse_size", "natural_key", "LINEAR"]
