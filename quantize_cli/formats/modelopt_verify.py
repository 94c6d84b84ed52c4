"""``quantize verify`` for ModelOpt checkpoints (ours or any ModelOpt 0.47 export).

Findings (errors unless noted): both config files present and consistent; every quantized module
has exactly the spec's tensors, dtypes and shapes; every kept Linear is excluded under vLLM's rules
and no quantized one is; fused groups share their scales (NVFP4: error; per-tensor FP8: warning, as
ModelOpt's own FP8 exports differ); plus the shared checks of formats/readback.py.
"""

from __future__ import annotations

import os

from ..checkpoint.safetensors_header import TensorInfo
from ..errors import QuantizeError
from ..modules.classify import LINEAR, classify, fused_groups, natural_key
from ..modules.recipe import load_recipe, recipe_of_output
from ..problems import ERROR, WARNING
from ..schemes import SCHEMES, Scheme, scheme_for_quant_algo as scheme_for
from .modelopt_documents import flat_quantization_config
from .modelopt_exclusions import verify_exclusions
from .readback import QUANT_LEAVES, VerifyResult, check_finite, compare_as_made, load_json_checked, read_index

MIXED = "MIXED_PRECISION"

def _configs(path: str, res: VerifyResult, served_mixed) -> tuple[dict | None, dict | None]:
    nested = load_json_checked(os.path.join(path, "hf_quant_config.json"), res, "hf_quant_config.json", "a ModelOpt checkpoint")
    config = load_json_checked(os.path.join(path, "config.json"), res, "config.json", "a ModelOpt checkpoint")
    if nested is None or config is None:
        return nested, config
    q = nested.get("quantization") or {}
    flat = config.get("quantization_config")
    if (nested.get("producer") or {}).get("name") != "modelopt":
        res.add(ERROR, "config", "hf_quant_config.json", "hf_quant_config.json: producer.name must be 'modelopt' for loaders to recognise it")
    if not isinstance(flat, dict):
        res.add(ERROR, "config", "config.json", "config.json has no quantization_config: vLLM would load the checkpoint as unquantized")
        return nested, config
    if q.get("quant_algo") == MIXED:
        layers = q.get("quantized_layers")
        if not isinstance(layers, dict) or not layers:
            res.add(ERROR, "config", "quantized_layers", "MIXED_PRECISION needs a non-empty quantized_layers map (vLLM refuses the checkpoint)")
            return nested, config
        for mod, cfg in layers.items():
            algo = str((cfg or {}).get("quant_algo", "")).upper()
            if algo not in served_mixed:
                res.add(ERROR, "config", mod, f"quantized_layers[{mod!r}]: quant_algo {algo!r} is not one vLLM's MIXED_PRECISION serves ({', '.join(served_mixed)})")
                return nested, config
    elif scheme_for(q.get("quant_algo")) is None:
        res.add(ERROR, "config", "quant_algo", f"quant_algo {q.get('quant_algo')!r} is not one this tool verifies ({', '.join(s.quant_algo for s in SCHEMES.values())})")
        return nested, config
    expected = flat_quantization_config(nested)
    for key, value in expected.items():
        if flat.get(key) != value:
            res.add(ERROR, "config-mismatch", key,
                    f"config.json quantization_config[{key!r}] = {flat.get(key)!r} but hf_quant_config.json implies {value!r}; the two files disagree")
    return nested, config


def _logical_shape(scheme: Scheme, weight: TensorInfo) -> tuple[int, int]:
    return scheme.logical_shape(weight.shape)


def _check_modules(tensors: dict[str, TensorInfo], scheme_of, res: VerifyResult) -> dict[str, dict[str, TensorInfo]]:
    """`scheme_of(module)`: the scheme the configs give it (None: listed nowhere, mixed precision)."""
    by_module: dict[str, dict[str, TensorInfo]] = {}
    for info in tensors.values():
        by_module.setdefault(info.module, {})[info.leaf] = info
    quantized = {}
    for mod, leaves in by_module.items():
        w = leaves.get("weight")
        if "weight_scale" not in leaves and not (w and w.dtype in ("F8_E4M3", "U8", "I8")):
            continue
        quantized[mod] = leaves
        scheme = scheme_of(mod)
        if scheme is None:
            res.add(ERROR, "mixed-unlisted", mod, f"{mod}: quantized tensors but not in quantized_layers; vLLM would load it as unquantized")
            continue
        if w is None or len(w.shape) != 2:
            res.add(ERROR, "tensors", mod, f"{mod}: quantized module without a 2-D weight")
            continue
        spec = scheme.outputs(_logical_shape(scheme, w))
        have = {k: v for k, v in leaves.items() if k in QUANT_LEAVES or k.startswith("weight")}
        if _contradicts(mod, scheme, have, spec, res):
            continue
        for suffix in sorted(set(spec) - set(have)):
            res.add(ERROR, "tensors", f"{mod}.{suffix}", f"{mod}.{suffix}: missing; {scheme.quant_algo} needs {spec[suffix][0]}{list(spec[suffix][1])}")
        for suffix in sorted(set(have) - set(spec)):
            res.add(ERROR, "tensors", f"{mod}.{suffix}", f"{mod}.{suffix}: unexpected for {scheme.quant_algo} (a loader would not know it)")
        for suffix in sorted(set(have) & set(spec)):
            got, want = (have[suffix].dtype, have[suffix].shape), spec[suffix]
            if got != want:
                res.add(ERROR, "tensors", f"{mod}.{suffix}",
                        f"{mod}.{suffix}: {got[0]}{list(got[1])}, but {scheme.quant_algo} needs {want[0]}{list(want[1])}")
    res.quantized = sorted(quantized, key=natural_key)
    bad = {f.subject.rsplit(".", 1)[0] if f.subject not in quantized else f.subject
           for f in res.findings if f.code in ("tensors", "contradiction")}
    for mod in bad & set(quantized):  # reported: never read as the configs say (scales of another shape)
        res.unreadable.add(mod)
    return quantized


def _layout_of(have: dict[str, TensorInfo]) -> dict[str, tuple]:
    return {k: (v.dtype, tuple(v.shape)) for k, v in have.items()}


def _contradicts(mod: str, scheme: Scheme, have: dict[str, TensorInfo], spec: dict, res: VerifyResult) -> bool:
    """When `mod`'s tensors are exactly another algorithm's (FP8_PB_WO block scales under a config
    saying FP8), say that contradiction in one finding naming the tensor; True if said."""
    got = _layout_of(have)
    if got == {k: (d, tuple(sh)) for k, (d, sh) in spec.items()}:
        return False
    for other in SCHEMES.values():
        if other.quant_algo == scheme.quant_algo:
            continue
        try:
            want = other.outputs(other.logical_shape(have["weight"].shape))
        except Exception:  # noqa: BLE001 - a shape the other scheme cannot take: not its tensors
            continue
        if got == {k: (d, tuple(sh)) for k, (d, sh) in want.items()}:
            name = next((k for k in sorted(got) if got[k] != (spec.get(k) or (None, None))[:2]), "weight")
            dtype, shape = got[name]
            res.add(ERROR, "contradiction", f"{mod}.{name}",
                    f"{mod}.{name}: {dtype}{list(shape)} is {other.algo}'s layout, but hf_quant_config.json / config.json "
                    f"say quant_algo {scheme.quant_algo!r} (which needs {_needs(spec, name)}); the configs contradict the tensors: "
                    f"fix quant_algo in both files, or convert again")
            return True
    return False


def _needs(spec: dict, name: str) -> str:
    if name not in spec:
        return f"no {name}"
    dtype, shape = spec[name]
    return f"{dtype}{list(shape)}"


def _check_exclusions(tensors, quantized, config, exclude, res: VerifyResult, nested: dict | None = None, mixed: bool = False):
    """vLLM's exclude rules (single format); MIXED_PRECISION has no exclude list: a Linear absent
    from quantized_layers is unquantized, which _check_modules and the listed check cover."""
    try:  # the recipe the output was converted with (recorded), else the one for its model_type
        recipe = recipe_of_output(nested, config.get("model_type"), os.path.join(res.path, "hf_quant_config.json"))
    except QuantizeError as exc:
        res.add(ERROR, "config", "converter.recipe", exc.message)
        recipe = load_recipe(None, config.get("model_type"))
    float_view = {n: (TensorInfo(n, "BF16", t.shape, t.path, t.offset, t.nbytes) if t.module in quantized and t.leaf == "weight" else t)
                  for n, t in tensors.items()}
    mods = classify(float_view, recipe, [], config.get("num_hidden_layers"))
    for m in mods.values():
        m.quantize = m.name in quantized
        if m.quantize:
            m.kind = LINEAR
    for p in [] if mixed else verify_exclusions(mods, exclude, dict(recipe.fused)):
        res.add(ERROR, "exclusions", p.subject, p.message)
    return mods, recipe


def _check_shared_scales(mods, recipe, scheme_of, tensors, res: VerifyResult) -> None:
    import torch

    from ..checkpoint.safetensors_io import read_tensor

    for group, members in fused_groups(mods, recipe).items():
        if not all(m.quantize for m in members) or any(m.name in res.unreadable for m in members):
            continue
        scheme = scheme_of(members[0].name)
        if scheme is None:
            continue
        keys = ["weight_scale_2", "input_scale"] if scheme.group_size else (["weight_scale", "input_scale"] if scheme.shares_global_amax else [])
        for key in keys:
            vals = [tensors.get(f"{m.name}.{key}") for m in members]
            if any(v is None for v in vals):
                continue
            loaded = [read_tensor(v).float().reshape(-1) for v in vals]
            if any(not torch.equal(x, loaded[0]) for x in loaded):
                level = ERROR if scheme.group_size else WARNING
                why = ("vLLM keeps one per fused layer without rescaling the block scales: wrong results" if scheme.group_size
                       else "vLLM re-quantizes the members to the max scale at load (a second rounding)")
                res.add(level, "fused-scales", group, f"{group}: members have different {key} ({', '.join(f'{x.item():.6g}' for x in loaded)}); {why}")


def verify_modelopt(path: str, res: VerifyResult, source: str | None, served_mixed) -> None:
    """Fill `res` for the ModelOpt checkpoint at `path` (`served_mixed`: the algorithms vLLM serves per layer in MIXED_PRECISION)."""
    nested, config = _configs(path, res, served_mixed)
    tensors = read_index(path, res)
    if not nested or not config or not tensors:
        return
    q = nested.get("quantization") or {}
    scheme = scheme_for(q.get("quant_algo"))
    layers = q.get("quantized_layers") if q.get("quant_algo") == MIXED else None
    if scheme is None and layers is None:
        return
    layout = ((nested.get("converter") or {}).get("layout") or {}).get("name")
    if layout not in (None, "plain"):
        res.add(ERROR, "packed", layout, f"{path}: holds the packed '{layout}' layout, which stock loaders cannot read by design; "
                "verify its plain form: quantize unpack DST -o PLAIN && quantize verify PLAIN (the round trip is exact)")
        return
    if layers is None:
        res.algo = scheme.algo
        res.input_scales = _input_scales(nested, scheme)
        scheme_of = lambda mod: scheme  # noqa: E731
    else:  # each layer against its own algorithm
        res.algo = MIXED
        schemes = {m: scheme_for(cfg.get("quant_algo")) for m, cfg in layers.items()}
        scheme_of = schemes.get
    quantized = _check_modules(tensors, scheme_of, res)
    exclude = list(q.get("exclude_modules") or [])
    mods, recipe = _check_exclusions(tensors, quantized, config, exclude, res, nested, mixed=layers is not None)
    if layers is not None:
        for mod in sorted(set(layers) - set(quantized), key=natural_key):
            res.add(ERROR, "mixed-listed", mod, f"{mod}: in quantized_layers as {layers[mod].get('quant_algo')} but has no quantized tensors")
    _check_shared_scales(mods, recipe, scheme_of, tensors, res)
    check_finite(tensors, res)
    if source:
        searched = (nested.get("converter") or {}).get("scale_search", "none") != "none"
        compare_as_made(source, _method(nested), quantized, scheme_of, recipe, res, searched)


def _method(nested: dict) -> dict:
    """The weights method convert records in hf_quant_config.json (converter.weights.method; {} when none)."""
    return (((nested.get("converter") or {}).get("weights") or {}).get("method") or {})


def _input_scales(nested: dict, scheme: Scheme) -> str | None:
    """From the metadata convert records (converter.calibration): are the static input scales calibrated?"""
    if scheme.static_input_scale is None:
        return None
    cal = (nested.get("converter") or {}).get("calibration")
    if not isinstance(cal, dict) or not cal.get("calibrated"):
        return f"constant {scheme.static_input_scale:g} (not calibrated: activations above amax 448 clip at serve time)"
    data = cal.get("data") or {}
    return (f"calibrated for {cal.get('modules')} module(s) on {data.get('spec')!r} ({data.get('samples')} samples, "
            f"{data.get('tokens')} tokens), {cal.get('kv_scales', 0)} KV scale pair(s), "
            f"{len(cal.get('experts_without_tokens') or [])} expert(s) without tokens")




