"""Every rule that decides whether a plan would load and compute right, as findings.

One implementation serves ``convert`` (which refuses on errors before reading a tensor) and
``check`` (which reports errors and warnings). A finding is an *error* when the output would not
load or would compute wrong, a *warning* when it loads but deserves a look. Its ``code`` is the
rule's stable id; code branches on it, never on the message (the messages are for people).

Other modules compute facts and return them as :class:`problems.Problem` (rule id, subject,
message): experts.py (fused expert tensors that do not split), exclusions.py and
formats/exclusions.py (lists vLLM would misread), formats/block_shapes.py (compressed-tensors
FP8 block rows vLLM cannot split, rule ``shape``), layouts/ (what a kernel layout takes); this
module decides their level. Tensor-parallel splits are facts of parallel.py. The rules, by code:

    error    shape                 untakeable weight shape or dtype, also per tensor-parallel part
    error    fused-partial         a fused group (q/k/v, gate/up) only partly excluded
    error    moe-partial           an MoE layer's experts only partly excluded
    error    moe-format            experts in a format vLLM's ModelOpt MoE path does not serve
    error    exclude-misread       vLLM would read exclude_modules / ignore otherwise (Problem)
    error    expert-layout         a fused 3-D expert tensor undeclared or unsplittable (Problem)
    error    layout                --layout refused: no activation dtype, no kernel, bad shape
    error    name-clash            a source tensor named like an output the conversion writes
    warning  layout-plain          --layout moves no bytes for this algorithm: written plain
    warning  source, uncalibrated, int8-vllm, pattern-unmatched, nothing-quantized

Rooms with rules of their own, collected into the same findings: mixed.py (``--algo-for``:
algo-split, mixed-unserved, mixed-moe-unserved, pattern-shadowed), calibration/apply.py (calibration, calib-ignored, kv-uncalibrated,
experts-no-tokens), audience.py (transformers-modelopt: an encoder written as ModelOpt) and check.py (pattern
analysis: pattern-partial-group, pattern-substring).
"""

from __future__ import annotations

from ..algorithms import is_expert_linear, is_experts_prefix
from ..checkpoint.safetensors_header import FLOAT_SOURCE_DTYPES
from ..modules.classify import LINEAR, Module
from ..modules.parallel import parallel_style, partition_shape
from ..problems import ERROR, WARNING, LAYOUT_NO_BYTES_MOVE, Finding, Problem
from ..schemes import Scheme

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


def moe_findings(mods: dict[str, Module], scheme: Scheme, fmt, check_format: bool = True) -> list[Finding]:
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
    if served and check_format and fmt.moe_unserved(scheme.algo):
        out.append(Finding(ERROR, "moe-format", served[0],
            f"{len(served)} MoE layer(s) (e.g. {served[0]}): vLLM's ModelOpt MoE path serves only FP8 (per-tensor), MXFP8, "
            f"NVFP4 and W4A16_NVFP4 experts, not {scheme.algo}; fix: --exclude '*.experts' to keep the experts in "
            f"the source dtype, or choose --algo NVFP4 / W4A16_NVFP4 / FP8"))
    return out


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
                     schemes: dict[str, Scheme] | None = None, fmt=None) -> list[Finding]:
    out = [Finding(WARNING, "source", "", w) for w in source_warnings]
    quantized = any(m.quantize for m in mods.values())
    for s in {x.algo: x for x in (schemes or {scheme.algo: scheme}).values()}.values():
        if s.static_input_scale is not None and quantized:
            out.append(Finding(WARNING, "uncalibrated", s.algo,
                f"{s.algo} uses static activation scales and no calibration data was given: every input_scale is the "
                f"documented constant {s.static_input_scale:g} (activation amax 448); accuracy is not calibrated; "
                f"calibrate with --calib-data default (docs/calibration.md)"))
    served = fmt.served.get(scheme.algo) if fmt is not None else None
    if quantized and not schemes and served is not None and not served.vllm and fmt.engines([scheme.algo]):
        # written, and served by another engine (the format's table), but not by vLLM: say so, and where vLLM serves it
        out.append(Finding(WARNING, f"{scheme.algo.lower()}-vllm", scheme.algo,
            f"{scheme.algo} is written as {fmt.name} {scheme.quant_algo}, which {' and '.join(fmt.engines([scheme.algo]))} "
            f"serves but vLLM 0.33's {fmt.name} loader does not; --format compressed-tensors is served by vLLM"))
    for pat in exclude:
        if not any(pat in m.matched_by for m in mods.values()):
            out.append(Finding(WARNING, "pattern-unmatched", pat,
                f"--exclude {pat!r} matches no Linear module (vLLM's exact/substring/wildcard rules, on module names "
                f"such as model.layers.0.mlp.down_proj, not tensor names ending in .weight); check the pattern"))
    if not quantized:
        out.append(Finding(WARNING, "nothing-quantized", "", "no Linear is quantized: every weight is excluded or not a Linear"))
    return out


def validate(mods, groups, scheme: Scheme, recipe, config: dict, exclude, entries: list[str],
             source_warnings: list[str], tp: int = 1, schemes: dict[str, Scheme] | None = None, fmt=None) -> list[Finding]:
    """All findings for a decided set of modules and its ``exclude_modules`` list, in format `fmt`.

    `schemes`: mixed precision, module -> scheme (the expert formats are then checked by mixed.py)."""
    if fmt is None:
        from ..formats import MODELOPT as fmt
    findings = (fused_group_findings(groups) + moe_findings(mods, scheme, fmt, check_format=not schemes)
                + shape_findings(mods, scheme, recipe, config, tp, schemes))
    findings += [Finding.of(ERROR, p) for p in fmt.shape_problems(mods, groups, scheme, recipe, config, tp, schemes)]
    partial = {f.subject for f in findings if f.code == "fused-partial"}  # already reported, with its fix
    findings += [Finding.of(ERROR, p) for p in fmt.misread(mods, entries, dict(recipe.fused)) if p.subject not in partial]  # each format's loader semantics
    return findings + warning_findings(mods, scheme, exclude, source_warnings, schemes, fmt)



def problem_findings(problems: list[Problem]) -> list[Finding]:
    """Errors for facts computed elsewhere that always refuse (fused expert tensors that do not split)."""
    return [Finding.of(ERROR, p) for p in problems]


def name_clash_finding(name: str) -> Finding:
    return Finding(ERROR, "name-clash", name,
        f"{name}: the source has a tensor of this name and the conversion also writes one; the checkpoint is "
        "already (partly) quantized or mislabelled; remove that tensor or convert the original checkpoint")


def layout_request(layout: str, algo: str, act_problem: str | None) -> tuple[Finding | None, bool]:
    """--layout `layout` for `algo`: (its refusal or None, whether dense Linears are packed).

    `act_problem`: why the activation dtype is unknown (config.json), or None. One rule for every
    algorithm (docs/layouts.md): where the dense kernel reads the plain bytes (rule
    ``layout-no-bytes-move``: CUTLASS FP8 / FP8_PER_CHANNEL_PER_TOKEN / FP8_PB_WO / INT8,
    FlashInfer FP8 / FP8_PB_WO) dense Linears are written plain; MoE stacks are packed where the
    layout has an MoE kernel (refused per layer where it has none: build._moe_stacks), and a plan
    where nothing moves at all says so (warning ``layout-plain``; an error under --strict)."""
    from .. import layouts

    if act_problem is not None:
        return Finding(ERROR, "layout", layout, f"--layout {layout}: {act_problem}"), False
    dense = layouts.support(layout, algo)
    if dense and dense.rule != LAYOUT_NO_BYTES_MOVE:
        return Finding(ERROR, "layout", layout, f"--layout {layout} --algo {algo}: {dense.message}"), False
    return None, dense is None


def layout_plain_finding(layout: str, algo: str) -> Finding:
    """The warning when --layout moves no bytes for `algo` and no MoE stack is packed either."""
    from .. import layouts

    why = layouts.supported(layout, algo)
    return Finding(WARNING, "layout-plain", layout, f"--layout {layout} --algo {algo}: {why}; writing the plain layout")


def moe_roles_finding(container: str, names: dict[str, str], layout: str) -> Finding:
    return Finding(ERROR, "layout", container, f"{container}: experts lack gate/up/down ({', '.join(names.values())}); "
                   f"cannot stack them for --layout {layout}")


def moe_stack_finding(container: str, eih: tuple[int, int, int], layout: str, why: str) -> Finding:
    """An MoE layer of `eih` = (experts, intermediate, hidden) that `layout`'s stacks cannot take."""
    count, i, h = eih
    return Finding(ERROR, "layout", container, f"{container} (E={count}, I={i}, H={h}): --layout {layout}: {why}")


def dense_layout_findings(mods: dict[str, Module], packing, stacks: dict) -> list[Finding]:
    """Dense quantized Linears whose shape the packed layout cannot take (MoE experts are stacked instead)."""
    out = []
    for mod in mods.values():
        if not packing.dense:
            break
        if mod.quantize and mod.vllm_prefix not in stacks and not is_experts_prefix(mod.vllm_prefix):
            why = packing.dense_problem(mod.weight.shape)  # type: ignore[union-attr]
            if why:
                out.append(Finding(ERROR, "layout", mod.name, f"{mod.weight.name} {list(mod.weight.shape)}: --layout {packing.layout.value} --algo {packing.algo}: {why}; fix: --exclude {mod.vllm_prefix!r} or --layout plain"))  # type: ignore[union-attr]
    return out

