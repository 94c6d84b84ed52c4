"""Every rule that decides whether a plan would load and compute right, as findings.

One implementation serves ``convert`` (which refuses on errors before reading a tensor) and
``check`` (which reports errors and warnings). A finding is an *error* when the output would not
load or would compute wrong (untakeable shape, also per tensor-parallel part; a partial fused
group or partial MoE-layer exclusion; an expert format vLLM's MoE path cannot serve; an
exclude list vLLM would misread), a *warning* when it loads but deserves a look.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .algorithms import is_expert_linear
from .checkpoint.safetensors_io import FLOAT_SOURCE_DTYPES
from .classify import LINEAR, Module
from .exclusions import verify_exclusions
from .formats.exclusions import ct_misread, is_ct
from .schemes import Scheme

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class Finding:
    """One result of a rule: level (error/warning), a stable code, what it is about, one line."""

    level: str
    code: str
    subject: str
    message: str

    def to_json(self) -> dict:
        return asdict(self)


class FindingsResult:
    """Mixin for results holding ``self.findings``: the errors and the warnings among them."""

    findings: list[Finding]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == WARNING]


def fused_group_findings(groups: dict[str, list[Module]]) -> list[Finding]:
    out = []
    for prefix, members in groups.items():
        kept = [m.name for m in members if not m.quantize]
        if kept and len(kept) != len(members):
            names = ", ".join(m.name for m in members)
            out.append(Finding(ERROR, "fused-partial", prefix,
                f"{prefix}: only {', '.join(kept)} of the fused group ({names}) is excluded; vLLM loads the group as one "
                f"layer and refuses mixed precision; exclude all members (--exclude {prefix!r}) or none"))
    return out


def moe_layers(mods: dict[str, Module]) -> dict[str, list[Module]]:
    """vLLM FusedMoE prefix (``...mlp.experts``) -> its per-expert Linears."""
    layers: dict[str, list[Module]] = {}
    for m in mods.values():
        if m.kind == LINEAR and is_expert_linear(m.name, m.vllm_prefix):
            layers.setdefault(m.vllm_prefix, []).append(m)
    return layers


def moe_findings(mods: dict[str, Module], scheme: Scheme, check_format: bool = True) -> list[Finding]:
    """Partial expert exclusions, and expert formats vLLM's ModelOpt MoE path cannot serve."""
    layers = moe_layers(mods)
    out = []
    for prefix, experts in layers.items():
        kept = [m.name for m in experts if not m.quantize]
        if kept and len(kept) != len(experts):
            out.append(Finding(ERROR, "moe-partial", prefix,
                f"{prefix}: {len(kept)} of its {len(experts)} expert Linears are excluded (e.g. {kept[0]}); vLLM loads all "
                f"experts of a layer as one module, so exclude the whole layer (--exclude {prefix!r}) or none"))
    served = [p for p, ex in layers.items() if any(m.quantize for m in ex)]
    if served and check_format and not scheme.moe_served:
        out.append(Finding(ERROR, "moe-format", served[0],
            f"{len(served)} MoE layer(s) (e.g. {served[0]}): vLLM's ModelOpt MoE path serves only FP8 (per-tensor), MXFP8, "
            f"NVFP4 and W4A16_NVFP4 experts, not {scheme.algo}; fix: --exclude '*.experts' to keep the experts in "
            f"the source dtype, or choose --algo NVFP4 / W4A16_NVFP4 / FP8"))
    return out


def parallel_style(mod: Module, recipe) -> str:
    """How vLLM splits this Linear under tensor parallelism: ``column`` (N), ``row`` (K) or ``replicated``."""
    last = mod.name.rpartition(".")[2]
    par = recipe.parallel
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


def shape_findings(mods: dict[str, Module], scheme: Scheme, recipe, config: dict, tp: int,
                   schemes: dict[str, Scheme] | None = None) -> list[Finding]:
    out = []
    default = scheme
    for mod in mods.values():
        if not mod.quantize:
            continue
        scheme = (schemes or {}).get(mod.name, default)
        target = mod.vllm_prefix  # the whole fused group / MoE layer when the module is part of one
        w = mod.weight
        if len(w.shape) != 2 or w.dtype not in FLOAT_SOURCE_DTYPES:  # type: ignore[union-attr]
            out.append(Finding(ERROR, "shape", mod.name,
                f"{w.name} {w.dtype}{list(w.shape)}: a Linear weight must be a 2-D bf16/fp16/fp32 tensor; "  # type: ignore[union-attr]
                f"fix the checkpoint, or --exclude {target!r} to copy it unchanged"))
            continue
        part, why = partition_shape(mod, recipe, config, tp)
        if why is None:
            why = scheme.shape_problem(part)  # type: ignore[arg-type]
            if why and tp > 1 and part != tuple(mod.weight.shape):  # type: ignore[union-attr]
                why = f"{why.replace('got', 'got per rank')} (--tp {tp}, {parallel_style(mod, recipe)}-parallel)"
        if why:
            w = mod.weight
            out.append(Finding(ERROR, "shape", mod.name,
                f"{w.name} {list(w.shape)}: {scheme.algo} {why}; fix: --exclude {target!r}, or choose another --algo"))  # type: ignore[union-attr]
    return out


def warning_findings(mods: dict[str, Module], scheme: Scheme, exclude, source_warnings: list[str],
                     schemes: dict[str, Scheme] | None = None) -> list[Finding]:
    out = [Finding(WARNING, "source", "", w) for w in source_warnings]
    quantized = any(m.quantize for m in mods.values())
    for s in {x.algo: x for x in (schemes or {scheme.algo: scheme}).values()}.values():
        if s.static_input_scale is not None and quantized:
            out.append(Finding(WARNING, "uncalibrated", s.algo,
                f"{s.algo} uses static activation scales and no calibration data was given: every input_scale is the "
                f"documented constant {s.static_input_scale:g} (activation amax 448); accuracy is not calibrated; "
                f"calibrate with --calib-data default (docs/calibration.md)"))
    if scheme.algo == "INT8" and quantized and not schemes and not is_ct(scheme):  # compressed-tensors W8A8 is served by vLLM
        out.append(Finding(WARNING, "int8-vllm", scheme.algo,
            "INT8 is written as ModelOpt W8A16, which TensorRT-LLM serves but vLLM's ModelOpt loader does not"))
    for pat in exclude:
        if not any(pat in m.matched_by for m in mods.values()):
            out.append(Finding(WARNING, "pattern-unmatched", pat,
                f"--exclude {pat!r} matches no Linear module (vLLM's exact/substring/wildcard rules, on module names "
                f"such as model.layers.0.mlp.down_proj, not tensor names ending in .weight); check the pattern"))
    if not quantized:
        out.append(Finding(WARNING, "nothing-quantized", "", "no Linear is quantized: every weight is excluded or not a Linear"))
    return out


def validate(mods, groups, scheme: Scheme, recipe, config: dict, exclude, entries: list[str],
             source_warnings: list[str], tp: int = 1, schemes: dict[str, Scheme] | None = None) -> list[Finding]:
    """All findings for a decided set of modules and its ``exclude_modules`` list.

    `schemes`: mixed precision, module -> scheme (the expert formats are then checked by mixed.py)."""
    findings = (fused_group_findings(groups) + moe_findings(mods, scheme, check_format=not schemes)
                + shape_findings(mods, scheme, recipe, config, tp, schemes))
    findings += block_n_findings(mods, groups, scheme, recipe, config, tp)  # compressed-tensors FP8_BLOCK only
    partial = {f.subject for f in findings if f.code == "fused-partial"}  # already reported, with its fix
    misread = ct_misread if is_ct(scheme) else verify_exclusions  # each format's loader semantics
    findings += [Finding(ERROR, "exclude-misread", p.split(":")[0], p) for p in misread(mods, entries, dict(recipe.fused))
                 if p.split(":")[0] not in partial]
    return findings + warning_findings(mods, scheme, exclude, source_warnings, schemes)


from .formats.block_shapes import block_n_findings  # noqa: E402  (it imports this module's helpers)
