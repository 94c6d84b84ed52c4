"""``quantize verify`` for compressed-tensors checkpoints (ours, llm-compressor's, any).

The same checks as for ModelOpt (verify.py), with this format's rules: config.json carries a
``quantization_config`` whose config groups are presets we know (docs/formats.md); every
quantized module has exactly the tensors, dtypes and shapes of the preset of the group vLLM
gives it (mixed precision: exact / ``re:`` targets first, then ``Linear``; scales in the
weight's dtype); vLLM's ``ignore`` semantics (exact / ``re:``, fused shards all or none) keep
every unquantized Linear unquantized and no quantized one; no NaN/Inf; with a source, the
dequantized weights' SQNR against the same floors.
"""

from __future__ import annotations

import os

from ..checkpoint.safetensors_header import TensorInfo
from ..modules.classify import EMBEDDING, LINEAR, classify
from ..modules.recipe import load_recipe
from ..modules.tied_head import tied_head
from ..algorithms import MIXED_PRECISION
from ..problems import ERROR
from .readback import check_finite, compare_as_made, read_index
from .ct_config import PRESETS
from .ct_mixed import LINEAR_TARGET, group_of, group_targets

_IGNORED_ARGS = ("observer", "observer_kwargs")
# llm-compressor's GPTQModifier records actorder "static": the columns were visited in activation
# order but the groups keep their places, so no g_idx is written and the tensors read as the preset's.
_SAME_ACTORDER = (None, "static")


def _same_args(a: dict | None, b: dict | None) -> bool:
    if a is None or b is None:
        return a is b
    if a.get("actorder") in _SAME_ACTORDER and b.get("actorder") in _SAME_ACTORDER:
        a, b = {**a, "actorder": None}, {**b, "actorder": None}
    return all(a.get(k) == v for k, v in b.items() if k not in _IGNORED_ARGS)


def group_preset(group: dict, qconfig: dict) -> str | None:
    """The preset whose weights / input activations / format config group `group` has."""
    fmt = group.get("format") or qconfig.get("format")
    for name, (pfmt, weights, inputs) in PRESETS.items():
        if fmt == pfmt and _same_args(group.get("weights"), weights) and _same_args(group.get("input_activations"), inputs):
            return name
    return None


def preset_of(qconfig: dict) -> str | None:
    """The preset of the single config group (None: unknown, or several groups)."""
    groups = qconfig.get("config_groups") or {}
    return group_preset(next(iter(groups.values())) or {}, qconfig) if len(groups) == 1 else None


def describe(qconfig: dict) -> str:
    """``FP8_BLOCK`` or, for several groups, ``mixed: FP8_BLOCK (8 modules), NVFP4A16 (Linear)``."""
    groups = qconfig.get("config_groups") or {}
    if len(groups) == 1:
        return preset_of(qconfig) or f"unknown ({', '.join(groups)})"
    parts = []
    for name, targets in group_targets(qconfig).items():
        what = "Linear" if targets == [LINEAR_TARGET] else f"{len(targets)} target(s)"
        parts.append(f"{group_preset(groups[name] or {}, qconfig) or 'unknown ' + repr(name)} ({what})")
    return "mixed: " + ", ".join(parts)


def verify_ct(path: str, config: dict, res, source: str | None, schemes, method: dict | None = None) -> None:
    """Fill `res` (a VerifyResult) for the compressed-tensors checkpoint at `path`; `schemes`: the
    format's algo -> scheme table (formats/compressed_tensors.py); `method`: how the weights were made
    when the caller knows it (convert --verify runs before the card that records it is written), else
    the card's record."""
    q = config["quantization_config"]
    groups = q.get("config_groups") or {}
    presets = {g: group_preset(cfg or {}, q) for g, cfg in groups.items()}
    if not presets or None in presets.values():
        bad = [g for g, p in presets.items() if p is None]
        res.add(ERROR, "config", "quantization_config", f"{path}/config.json: compressed-tensors config group(s) {bad or '(none)'} "
                f"are not one of the presets this tool verifies ({', '.join(PRESETS)}); nothing else was checked")
        return
    if q.get("quantization_status") != "compressed":
        res.add(ERROR, "config", "quantization_status", f"quantization_status is {q.get('quantization_status')!r}; loaders expect 'compressed'")
    if os.path.exists(os.path.join(path, "hf_quant_config.json")):
        res.add(ERROR, "config", "hf_quant_config.json", "hf_quant_config.json is present beside a compressed-tensors config: "
                "vLLM would pick the ModelOpt loader; delete it")
    by_group = {g: next(s for s in schemes.values() if s.preset == p) for g, p in presets.items()}
    targets = group_targets(q)
    res.algo = next(iter(by_group.values())).algo if len(by_group) == 1 else MIXED_PRECISION

    def scheme_of(module: str):  # the group vLLM gives the module: exact / re: targets first, then Linear
        group = group_of(module, targets)
        return by_group.get(group) if group is not None else None

    tensors = read_index(path, res)
    if not tensors:
        return
    quantized = _check_modules(tensors, scheme_of, res)
    _check_listed(targets, quantized, tensors, res)
    _check_ignore(tensors, quantized, config, list(q.get("ignore") or []), res)
    check_finite(tensors, res)
    if source:
        recipe = load_recipe(None, config.get("model_type"))
        compare_as_made(source, method if method is not None else (_card_method(path) or {}), quantized, scheme_of,
                        recipe, res)


def _card_method(path: str) -> dict | None:
    """The ``--rounding`` / ``--smooth`` the card records (calibration/record.py; config.json has no field
    for it), None when the folder has no card or the card no record (then: round to nearest)."""
    from ..calibration.record import from_card, read_method_comment

    return from_card(path, read_method_comment)


def _per_element(w: TensorInfo) -> int:
    """Weight elements per stored element along K: ``weight_packed`` holds two E2M1 codes per byte
    (NVFP4, U8) or eight int4 codes per int32 (pack-quantized, I32); ``weight`` one."""
    if w.leaf != "weight_packed":
        return 1
    return 8 if w.dtype == "I32" else 2


def _check_listed(targets: dict[str, list[str]], quantized, tensors, res) -> None:
    """A module named exactly in a group's targets must hold quantized tensors (it exists, not kept)."""
    modules = {t.module for t in tensors.values()}
    for group, names in targets.items():
        for name in names:
            if name != LINEAR_TARGET and not name.startswith("re:") and name in modules and name not in quantized:
                res.add(ERROR, "mixed-listed", name, f"{name}: a target of config group {group!r} but it holds no quantized "
                        "tensors; vLLM would expect that group's tensors")


def _check_modules(tensors: dict[str, TensorInfo], scheme_of, res) -> dict[str, dict[str, TensorInfo]]:
    """`scheme_of(module)`: the scheme of the config group vLLM would give it (None: no group)."""
    by_module: dict[str, dict[str, TensorInfo]] = {}
    for info in tensors.values():
        by_module.setdefault(info.module, {})[info.leaf] = info
    quantized = {}
    for mod, leaves in by_module.items():
        if "weight_scale" not in leaves and "weight_packed" not in leaves:
            continue
        quantized[mod] = leaves
        scheme = scheme_of(mod)
        if scheme is None:
            res.add(ERROR, "mixed-unlisted", mod, f"{mod}: quantized tensors but no config group targets it; vLLM would "
                    "load it unquantized")
            continue
        w, scale = leaves.get("weight_packed") or leaves.get("weight"), leaves.get("weight_scale")
        if w is None or scale is None or len(w.shape) != 2:
            res.add(ERROR, "tensors", mod, f"{mod}: quantized module without a 2-D weight and its weight_scale")
            continue
        n, k = w.shape
        shape = (n, k * _per_element(w))
        dtype = scale.dtype if scale.dtype in ("BF16", "F16", "F32") else "BF16"
        spec = scheme.outputs_for(TensorInfo(f"{mod}.weight", dtype, shape, w.path, 0, 0))
        have = {k: v for k, v in leaves.items() if k.startswith(("weight", "input"))}
        for suffix in sorted(set(spec) - set(have)):
            res.add(ERROR, "tensors", f"{mod}.{suffix}", f"{mod}.{suffix}: missing; {scheme.preset} needs {spec[suffix][0]}{list(spec[suffix][1])}")
        for suffix in sorted(set(have) - set(spec)):
            res.add(ERROR, "tensors", f"{mod}.{suffix}", f"{mod}.{suffix}: unexpected for {scheme.preset} (a loader would not know it)")
        for suffix in sorted(set(have) & set(spec)):
            got, want = (have[suffix].dtype, tuple(have[suffix].shape)), spec[suffix]
            if got != want:
                res.add(ERROR, "tensors", f"{mod}.{suffix}", f"{mod}.{suffix}: {got[0]}{list(got[1])}, but {scheme.preset} needs {want[0]}{list(want[1])}")
    res.quantized = sorted(quantized)
    return quantized


def _check_ignore(tensors, quantized, config: dict, ignore: list[str], res) -> None:
    from .ct_exclusions import ct_is_ignored, ct_misread

    recipe = load_recipe(None, config.get("model_type"))
    view = {n: (TensorInfo(n, "BF16", (t.shape[0], t.shape[1] * _per_element(t)), t.path, t.offset, t.nbytes)
                if t.module in quantized and t.leaf in ("weight", "weight_packed") else t)
            for n, t in tensors.items() if not (t.module in quantized and t.leaf == "weight" and f"{t.module}.weight_packed" in tensors)}
    view = {(f"{t.module}.weight" if t.leaf == "weight_packed" else n): t for n, t in view.items()}
    view = {n: TensorInfo(n, t.dtype, t.shape, t.path, t.offset, t.nbytes) for n, t in view.items()}
    mods = classify(view, recipe, [], config.get("num_hidden_layers"))
    for m in mods.values():
        m.quantize = m.name in quantized
        if m.quantize and m.kind == EMBEDDING:  # e.g. llm-compressor model_free_ptq with ignore=["lm_head"]
            res.add(ERROR, "quantized-embedding", m.name, f"{m.name}: an embedding holds quantized weights, but vLLM's "
                    "compressed-tensors path loads embeddings unquantized (only INT weight-only schemes); reconvert keeping it")
        if m.quantize:
            m.kind = LINEAR
    for p in ct_misread(mods, ignore, dict(recipe.fused)):
        res.add(ERROR, "exclusions", p.subject, p.message)
    head = tied_head(config, tensors)
    if head and not ct_is_ignored(head, ignore, {}):
        res.add(ERROR, "exclusions", head, f"{head}: tied to the embeddings (no {head}.weight in the files) but not in "
                f"quantization_config.ignore, so transformers quantizes it and the load fails ('Linear has no attribute "
                f"weight'); add \"{head}\" to ignore")
