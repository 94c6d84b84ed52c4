"""``quantize verify``: check a converted checkpoint (ours or any ModelOpt one) as a loader would.

Findings (errors unless noted): both config files present and consistent; the index covers every
tensor and file; every quantized module has exactly the spec's tensors, dtypes and shapes; every
kept Linear is excluded under vLLM's rules and no quantized one is; fused groups share their
scales (NVFP4: error; per-tensor FP8: warning, as ModelOpt's own FP8 exports differ); no NaN/Inf
in any tensor. With ``source``: per-tensor relative error and SQNR of the dequantized weights,
flagging any under the algorithm's floor (error) or more than 6 dB below the checkpoint's median
(warning). Floors are justified in docs/verify.md.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

from .formats.modelopt_documents import flat_quantization_config
from .checkpoint.safetensors_header import TensorInfo, read_header
from .checkpoint.source import regular_file_inside
from .plan.classify import LINEAR, classify, fused_groups, natural_key
from .errors import QuantizeError, display
from .formats.modelopt_exclusions import verify_exclusions
from .jsonfile import MISSING, JsonFileError, load_json, read_json_or_none
from .plan.mixed import LINEAR_SERVED, MIXED
from .plan.recipe import load_recipe, recipe_of_output
from .schemes import SCHEMES, Scheme, scheme_for_quant_algo as scheme_for
from .plan.validate import ERROR, WARNING, Finding, FindingsResult

# Absolute SQNR floors (dB) per algorithm, justified in docs/verify.md (measured typical values there).
SQNR_FLOOR_DB = {"FP8": 20.0, "FP8_PER_CHANNEL_PER_TOKEN": 20.0, "FP8_PB_WO": 20.0, "NVFP4": 12.0, "W4A16_NVFP4": 12.0, "INT8": 20.0,
                 "MXFP8": 20.0}
MEDIAN_MARGIN_DB = 6.0
_QUANT_LEAVES = ("weight", "weight_scale", "weight_scale_2", "input_scale",
                 "weight_packed", "weight_global_scale", "input_global_scale")  # ModelOpt + compressed-tensors
READ_CHUNK = 64 << 20


@dataclass
class VerifyResult(FindingsResult):
    path: str
    algo: str | None
    findings: list[Finding] = field(default_factory=list)
    quantized: list[str] = field(default_factory=list)
    errors_by_tensor: dict[str, dict] = field(default_factory=dict)
    input_scales: str | None = None  # static input scales: calibrated (on what) or constant; None when none
    unreadable: set = field(default_factory=set)  # modules whose tensors contradict the configs (not read further)

    def add(self, level: str, code: str, subject: str, message: str) -> None:
        self.findings.append(Finding(level, code, subject, message))

    def to_json(self) -> dict:
        return {
            "schema_version": 1,  # docs/ci.md: bumped when a key is removed or changes meaning
            "command": "verify", "path": self.path, "algo": self.algo, "ok": not self.errors,
            "summary": {"errors": len(self.errors), "warnings": len(self.warnings), "quantized_modules": len(self.quantized)},
            "findings": [f.to_json() for f in self.findings],
            "tensor_errors": self.errors_by_tensor,
            "input_scales": self.input_scales,
        }

    def to_text(self) -> str:
        lines = [f"verify: {self.path}  algo {self.algo}  {len(self.quantized)} quantized module(s)"]
        for name, e in sorted(self.errors_by_tensor.items(), key=lambda kv: natural_key(kv[0])):
            gain = f"  vs round-to-nearest {e['sqnr_gain_db']:+.2f} dB (mse -{100 * e['mse_reduction']:.1f}%)" if "sqnr_gain_db" in e else ""
            lines.append(f"  {display(name):<60} sqnr {e['sqnr_db']:7.2f} dB  rel.err {e['rel_error']:.4f}{gain}")
        if self.input_scales:
            lines.append(f"input scales: {display(self.input_scales)}")
        lines += [f"{f.level.upper():<7}  [{f.code}] {display(f.message)}" for f in self.findings]  # one line each
        lines.append(f"result: {len(self.errors)} error(s), {len(self.warnings)} warning(s) -> {'FAIL' if self.errors else 'OK'}")
        return "\n".join(lines)


def _load_json(path: str, res: VerifyResult, what: str) -> dict | None:
    try:
        if os.path.lexists(path):  # never through a link out of the checkpoint, never a FIFO
            regular_file_inside(os.path.dirname(path), os.path.basename(path))
    except QuantizeError as exc:
        res.add(ERROR, "bad-file", what, exc.message)
        return None
    try:
        return load_json(path, what, fix="a loader cannot read it")
    except JsonFileError as exc:
        if exc.rule == MISSING:
            res.add(ERROR, "missing-file", what, f"{path}: missing; a ModelOpt checkpoint needs {what}")
        else:
            res.add(ERROR, "bad-file", what, exc.message)
    return None


def _configs(path: str, res: VerifyResult) -> tuple[dict | None, dict | None]:
    nested = _load_json(os.path.join(path, "hf_quant_config.json"), res, "hf_quant_config.json")
    config = _load_json(os.path.join(path, "config.json"), res, "config.json")
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
            if algo not in LINEAR_SERVED:
                res.add(ERROR, "config", mod, f"quantized_layers[{mod!r}]: quant_algo {algo!r} is not one vLLM's MIXED_PRECISION serves ({', '.join(LINEAR_SERVED)})")
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


def _index(path: str, res: VerifyResult) -> dict[str, TensorInfo]:
    """Every tensor of the checkpoint, checking that the index and the shards agree."""
    shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    index_path = os.path.join(path, "model.safetensors.index.json")
    wmap = None
    if os.path.exists(index_path):
        doc = _load_json(index_path, res, "model.safetensors.index.json") or {}
        wmap = doc.get("weight_map") if isinstance(doc.get("weight_map"), dict) else {}
    elif len(shards) > 1:
        res.add(ERROR, "index", "model.safetensors.index.json", f"{path}: {len(shards)} shards but no model.safetensors.index.json")
    tensors: dict[str, TensorInfo] = {}
    for shard in shards:
        try:
            header = read_header(regular_file_inside(path, shard))
        except QuantizeError as exc:
            res.add(ERROR, "shard", shard, exc.message)
            continue
        for name, info in header.tensors.items():
            if name in tensors:
                res.add(ERROR, "index", name, f"tensor {name!r} is in two shards ({os.path.basename(tensors[name].path)}, {shard})")
            tensors[name] = info
    if wmap is not None:
        for name, shard in sorted(wmap.items()):
            where = os.path.basename(tensors[name].path) if name in tensors else None
            if where != shard:
                res.add(ERROR, "index", name, f"index maps {name!r} to {shard} but it is {'in ' + where if where else 'in no shard'}")
        for name in sorted(set(tensors) - set(wmap)):
            res.add(ERROR, "index", name, f"tensor {name!r} is in {os.path.basename(tensors[name].path)} but not in the index; loaders using the index miss it")
        for shard in sorted(set(shards) - set(wmap.values())):
            res.add(WARNING, "index", shard, f"{shard} is not referenced by the index")
    if not tensors:
        res.add(ERROR, "empty", path, f"{path}: no safetensors tensors")
    return tensors


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
        have = {k: v for k, v in leaves.items() if k in _QUANT_LEAVES or k.startswith("weight")}
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

    from .checkpoint.safetensors_io import read_tensor
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


def _check_finite(tensors: dict[str, TensorInfo], res: VerifyResult) -> None:
    import torch

    from .checkpoint.safetensors_io import read_tensor
    from .run.finite import all_finite
    for name, info in tensors.items():
        if info.dtype not in ("BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2") or not info.shape and info.nbytes == 0:
            continue
        rows = info.shape[0] if info.shape else 1
        row_bytes = max(1, info.nbytes // max(rows, 1))
        step = max(1, READ_CHUNK // row_bytes)
        for start in range(0, rows, step):
            t = read_tensor(info, start, min(step, rows - start)) if info.shape else read_tensor(info)
            if info.dtype == "F8_E4M3":
                bad = bool(((t.view(torch.uint8) & 0x7F) == 0x7F).any())
            else:
                bad = not all_finite(t)
            if bad:
                res.add(ERROR, "non-finite", name, f"{name}: contains NaN or Inf; the checkpoint would compute garbage")
                break


def verify_checkpoint(path: str, source: str | None = None) -> VerifyResult:
    """Run every check on the checkpoint folder at `path` (see the module docstring)."""
    res = VerifyResult(path, None)
    if not os.path.isdir(path):
        res.add(ERROR, "missing-file", path, f"{path}: no such checkpoint folder")
        return res
    if _verify_other_format(path, source, res):
        return res
    nested, config = _configs(path, res)
    tensors = _index(path, res)
    if not nested or not config or not tensors:
        return res
    q = nested.get("quantization") or {}
    scheme = scheme_for(q.get("quant_algo"))
    layers = q.get("quantized_layers") if q.get("quant_algo") == MIXED else None
    if scheme is None and layers is None:
        return res
    layout = ((nested.get("converter") or {}).get("layout") or {}).get("name")
    if layout not in (None, "plain"):
        res.add(ERROR, "packed", layout, f"{path}: holds the packed '{layout}' layout, which stock loaders cannot read by design; "
                "verify its plain form: quantize unpack DST -o PLAIN && quantize verify PLAIN (the round trip is exact)")
        return res
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
    _check_finite(tensors, res)
    if source:
        searched = (nested.get("converter") or {}).get("scale_search", "none") != "none"
        _compare_with_source(source, quantized, scheme_of, recipe, res, searched)
    return res


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




def _verify_other_format(path: str, source: str | None, res: VerifyResult) -> bool:
    """A compressed-tensors checkpoint is verified by its own rules (formats/ct_verify.py)."""
    from .formats import COMPRESSED_TENSORS, detect_format
    from .formats.ct_verify import verify_ct

    config = read_json_or_none(os.path.join(path, "config.json"))
    if config is None or detect_format(config) != COMPRESSED_TENSORS:
        return False
    verify_ct(path, config, res, source)
    return True


def _compare_with_source(src: str, quantized, scheme_of, recipe, res: VerifyResult, searched: bool = False) -> None:
    from .checkpoint.safetensors_io import read_tensor
    from .checkpoint.source import open_source
    from .plan.experts import expand, read_virtual
    from .schemes.numerics import error_fields, square_sums
    from .schemes.search import compare_with_rtn

    source = open_source(src)
    tensors, _ = expand(source.tensors, recipe, lambda m: True)
    algo_of = {}
    for mod, leaves in quantized.items():
        scheme = scheme_of(mod)
        if scheme is None or mod in res.unreadable:  # its tensor findings say why it is not compared
            continue
        algo_of[f"{mod}.weight"] = scheme.algo
        ref = tensors.get(f"{mod}.weight")
        if ref is None:
            res.add(WARNING, "source", mod, f"{mod}: not found in the source {src}; not compared")
            continue
        w = read_virtual(ref).float()
        q = {k: read_tensor(v) for k, v in leaves.items() if k in _QUANT_LEAVES}
        deq = scheme.dequantize(q)
        if tuple(deq.shape) != tuple(w.shape):
            res.add(ERROR, "source", mod, f"{mod}: shape {list(deq.shape)} differs from the source's {list(w.shape)}")
            continue
        res.errors_by_tensor[f"{mod}.weight"] = error_fields(*square_sums(w, deq))
        if searched:  # written with --scale-search: how much better than round-to-nearest under the same global scale
            res.errors_by_tensor[f"{mod}.weight"].update(compare_with_rtn(scheme, w, q, deq))
    by_algo: dict[str, list[float]] = {}  # medians per algorithm (a mixed checkpoint holds several)
    for name, e in res.errors_by_tensor.items():
        if e["sqnr_db"] != float("inf"):
            by_algo.setdefault(algo_of[name], []).append(e["sqnr_db"])
    for name, e in res.errors_by_tensor.items():
        floor = SQNR_FLOOR_DB[algo_of[name]]
        values = by_algo.get(algo_of[name])
        median = statistics.median(values) if values else float("inf")
        if e["sqnr_db"] < floor:
            res.add(ERROR, "accuracy-floor", name, f"{name}: SQNR {e['sqnr_db']:.1f} dB is under the {algo_of[name]} floor of {floor:g} dB (docs/verify.md)")
        elif values and e["sqnr_db"] < median - MEDIAN_MARGIN_DB:
            res.add(WARNING, "accuracy-outlier", name, f"{name}: SQNR {e['sqnr_db']:.1f} dB is more than {MEDIAN_MARGIN_DB:g} dB below the checkpoint's median {median:.1f} dB")
