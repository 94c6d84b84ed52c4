"""From measured amax to the scales a plan writes (the one interface writers read).

:func:`resolve` turns a :class:`ScalesDoc` into :class:`ActScales` for one plan:

* ``input_amax[module]``: the amax each quantized Linear's ``input_scale`` is made from; members
  of a fused group (q/k/v, gate/up, an expert's w1/w3) share their max, because vLLM keeps one
  input scale per fused layer;
* experts that received no calibration token take the max over the same projection (gate, up
  or down) of the experts of the same MoE layer that did (ModelOpt's rule for uncalibrated
  experts); they are listed in ``no_tokens``;
* ``kv_amax[attn] = (k_amax, v_amax)`` for the FP8 KV cache.

The scales themselves follow ModelOpt's export (fp32, 0-d): FP8 ``amax / 448``, NVFP4
``amax / (6 * 448)``, KV ``amax / 448`` named ``<attn>.k_proj.k_scale`` / ``<attn>.v_proj.v_scale``
(the names vLLM's ``maybe_remap_kv_scale_name`` maps to ``<attn>.attn.k_scale``).
A compressed-tensors writer reads the same ``input_amax`` / ``kv_amax``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..algorithms import E4M3_MAX
from ..modules.classify import expert_container
from .document import ScalesDoc

if TYPE_CHECKING:
    import torch

KV_NAMES = (("k_proj.k_scale", "k_amax"), ("v_proj.v_scale", "v_amax"))


@dataclass
class ActScales:
    """Resolved calibration for one plan (see the module doc)."""

    input_amax: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    no_tokens: list[str] = field(default_factory=list)
    kv_amax: dict[str, tuple[float, float]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def input_scale(self, module: str, algo: str) -> float:
        """ModelOpt's ``input_scale`` of `module` under `algo`: ``amax / 448`` (FP8) or ``amax / 2688`` (NVFP4),
        the fp32 quotient the written tensor holds (``Scheme.calibrated_inputs``)."""
        import struct

        from ..algorithms import ALGORITHMS

        def f32(x: float) -> float:  # the quotient of two fp32 values, correctly rounded to fp32 (as torch divides)
            return struct.unpack("f", struct.pack("f", x))[0]

        return f32(f32(self.input_amax[module]) / f32(ALGORITHMS[algo].activation_bound))

    def digest(self) -> str:
        """sha256 of every resolved amax: what the written scales depend on (resume fingerprint)."""
        import hashlib
        import json

        return hashlib.sha256(json.dumps([sorted(self.input_amax.items()), sorted(self.kv_amax.items())]).encode()).hexdigest()

    def kv_tensors(self) -> dict[str, torch.Tensor]:
        """``<attn>.k_proj.k_scale`` / ``<attn>.v_proj.v_scale``: 0-d fp32 ``amax / 448``."""
        import torch

        out = {}
        for attn, amaxes in self.kv_amax.items():
            for (suffix, _), amax in zip(KV_NAMES, amaxes):
                out[f"{attn}.{suffix}"] = torch.tensor(amax, dtype=torch.float32) / E4M3_MAX
        return out


def resolve(doc: ScalesDoc, quantized: list[str], groups: dict[str, list[str]], kv: bool) -> ActScales:
    """The scales for the `quantized` Linear names (plan order), sharing within `groups`."""
    res = ActScales(meta={"source": doc.source, "data": doc.data, "run": doc.run, "file": doc.path})
    by_layer: dict[str, list[float]] = {}
    for name in quantized:
        got = doc.input_amax(name)
        if got is not None and got[1] > 0 and got[0] > 0:
            res.input_amax[name], res.tokens[name] = got
            if expert_container(name):
                by_layer.setdefault(_slot(name), []).append(got[0])
    for name in quantized:
        if name in res.input_amax:
            continue
        got, layer = doc.input_amax(name), expert_container(name)
        if layer and (got is None or got[1] == 0) and by_layer.get(_slot(name)):
            res.input_amax[name], res.tokens[name] = max(by_layer[_slot(name)]), 0
            res.no_tokens.append(name)
        elif got is None:
            res.problems.append(f"{name}: quantized with a static input scale but {_where(doc)} has no amax for it; "
                                f"calibrate this source again, or --exclude {name!r}")
        else:
            res.problems.append(f"{name}: {_where(doc)} records amax {got[0]:g} over {got[1]} tokens; an input scale "
                                f"must be positive; calibrate with more or other data")
    for members in groups.values():
        shared = [res.input_amax[m] for m in members if m in res.input_amax]
        if len(shared) == len(members) and members:
            top = max(shared)
            for m in members:
                res.input_amax[m] = top
    if kv:
        for attn, e in doc.kv.items():
            if e["k_amax"] > 0 and e["v_amax"] > 0:
                res.kv_amax[attn] = (float(e["k_amax"]), float(e["v_amax"]))
            else:
                res.problems.append(f"{attn}: {_where(doc)} records a zero K or V amax; KV scales must be positive; calibrate again")
    return res


def _slot(name: str) -> tuple[str, str]:
    """(MoE layer, projection): an expert's stand-in comes from the same projection of its layer."""
    return expert_container(name) or "", name.rpartition(".")[2]


def _where(doc: ScalesDoc) -> str:
    return f"the scales file {doc.path}" if doc.path else "the calibration run"


def for_plan(doc: ScalesDoc | None, mods: dict, groups: dict, scheme_of, kv_cache_dtype: str | None, findings: list) -> ActScales | None:
    """Resolve `doc` for a plan being built; problems and notices become findings (`findings` is
    extended in place, and its "uncalibrated" warning dropped when the scales are calibrated).

    `scheme_of(module)`: each quantized module's own scheme (mixed precision: not always --algo's):
    the modules whose scheme has a static input scale take calibrated ones, and the KV cache
    (``--kv-cache-dtype fp8``) its calibrated K/V scales whatever the algorithms."""
    from ..problems import CALIB_IGNORED, ERROR, WARNING, Finding

    if doc is None:
        return None
    if getattr(doc, "planned", False):  # a dry run with --calib-data: checked, not measured (entry.PlannedCalibration)
        findings[:] = [f for f in findings if f.code != "uncalibrated"]
        return None
    static = [m.name for m in mods.values() if m.quantize and scheme_of(m.name).static_input_scale is not None]
    kv = kv_cache_dtype == "fp8"
    if not static and not kv:
        from .uses import decides_bytes

        if not decides_bytes(scheme_of(m.name) for m in mods.values() if m.quantize):  # else it weights the search (search_weights.py)
            algos = sorted({scheme_of(m.name).algo for m in mods.values() if m.quantize}) or ["--algo"]
            findings.append(Finding(WARNING, CALIB_IGNORED, algos[0], f"{'/'.join(algos)} quantizes activations dynamically "
                                    "(or not at all) and the KV cache is not FP8: the calibration data / --act-scales is ignored"))
        return None
    shared = {k: [m.name for m in v] for k, v in groups.items() if all(m.name in static for m in v)}
    res = resolve(doc, static, shared, kv=kv)
    findings[:] = [f for f in findings if f.code != "uncalibrated"]
    findings.extend(Finding(ERROR, "calibration", p.split(":")[0], p) for p in res.problems)
    if kv_cache_dtype == "fp8" and not res.kv_amax:
        findings.append(Finding(WARNING, "kv-uncalibrated", "kv", "--kv-cache-dtype fp8: the calibration recorded no "
                                "attention keys/values (encoder or unsupported attention); no KV scales are written"))
    if res.no_tokens:
        findings.append(Finding(WARNING, "experts-no-tokens", "experts", f"{len(res.no_tokens)} expert Linear(s) received no "
                                f"calibration token (e.g. {res.no_tokens[0]}); they use the max amax of their layer's experts"))
    return res


def calibration_summary(plan, full: bool) -> dict:
    """What was calibrated: data, run (its clock times only when `full`: the report's, never the
    output's, issue 35 item 18), and (`full`) per module amax, the ModelOpt ``input_scale`` of its
    own algorithm (mixed precision: the module's), tokens; per attention layer its K/V amax and scales."""
    cal = plan.act_scales
    run = cal.meta.get("run")
    if not full and isinstance(run, dict):  # hf_quant_config: no clock times (identical runs write identical files)
        run = {k: v for k, v in run.items() if not k.endswith("seconds")}
    out = {"calibrated": True, "data": cal.meta.get("data"), "run": run,
           "source": cal.meta.get("source"), "modules": len(cal.input_amax), "kv_scales": len(cal.kv_amax),
           "experts_without_tokens": list(cal.no_tokens)}
    if full:
        out["per_module"] = {m: {"amax": a, "input_scale": cal.input_scale(m, plan.scheme_of(m).algo), "tokens": cal.tokens.get(m, 0)}
                             for m, a in cal.input_amax.items()}
        out["kv"] = {a: {"k_amax": k, "v_amax": v, "k_scale": k / E4M3_MAX, "v_scale": v / E4M3_MAX} for a, (k, v) in cal.kv_amax.items()}
    return out
