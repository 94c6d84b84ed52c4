"""The written tensors -> the weights and activation rules the serving engine computes with.

One entry point, :func:`open_served`, reads a converted checkpoint (ModelOpt, incl.
MIXED_PRECISION and the packed layouts, or compressed-tensors, incl. several config groups) and
answers, per quantized Linear, *what vLLM 0.33 multiplies*: the dequantized fp32 weight and the
activation rule (:mod:`.activations`). The format object gives the schemes (``Format.scheme``), each
scheme its activation kind and global-scale tensor; what lives here is how vLLM merges per-tensor scales over a fused
layer (q/k/v -> qkv_proj, gate/up -> gate_up_proj) and over a MoE layer:

    ModelOpt / compressed-tensors FP8 (per tensor), dense fused layer and each expert's w1/w3:
        w = requantize_with_max_scale: e4m3(fp16(q_i * s_i) * (1 / max s)) * max s
        (w8a8_utils.requantize_with_max_scale; fp8_utils.process_fp8_weight_tensor_strategy_moe)
        input scale = max over the fused layer (modelopt.KFp8StaticTensor.process), over all
        experts of a MoE layer (fp8_utils.process_fp8_input_tensor_strategy_moe)
    NVFP4 / W4A16_NVFP4, dense fused layer:
        ModelOpt: weight_scale_2 = max over the layer, block scales NOT rescaled
        (modelopt.KNvfp4Static.process); activation global scale 1 / max input_scale
        (modelopt.KNvfp4Dynamic.process)
        compressed-tensors: weight global = 1 / max weight_global_scale, activations
        max input_global_scale (compressed_tensors_w4a4_nvfp4.process_weights_after_loading)
    NVFP4 experts: w1's (gate's) global scale serves w3 too (modelopt.ModelOptNvFp4FusedMoE and
        compressed_tensors_moe_w4a4_nvfp4: ``w13_weight_scale_2[:, 0]``); activations
        1 / max over the layer's experts (fused_moe/oracle/nvfp4.py)
    everything else: each tensor as written (scales per row / block / group do not merge).

The dequantization itself is each scheme's ``dequantize`` (ModelOpt: ``schemes/``,
compressed-tensors: ``formats/ct_schemes.py``), which is the engine's ``q * scale`` in fp32.

ModelOpt's AWQ exports (``NVFP4_AWQ``, ``W4A16_AWQ`` after ``INT4_AWQ_CFG``) are read as the
algorithm of their tensors (``Algorithm.awq_quant_algo``); a Linear's ``pre_quant_scale`` [K] (AWQ's
smoothing where the exporter could not fold it into the preceding norm or Linear) is applied as
TensorRT-LLM does, ``linear(act(x * pre_quant_scale), W)``: vLLM 0.33 reads no pre_quant_scale.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..algorithms import MIXED_PRECISION, algo_of_awq_quant_algo, algo_of_quant_algo, canonical_algo
from ..errors import SourceError
from .activations import NONE, ActRule

if TYPE_CHECKING:
    import torch

    from ..formats.base import Format

_STATIC_INPUT = ("input_scale", "input_global_scale")
_EXPERT = re.compile(r"^(?P<layer>.*\.experts)\.(?P<e>\d+)\.(?P<role>[^.]+)$")


@dataclass(frozen=True)
class ServedLinear:
    """One quantized Linear as served: its algorithm, its activation rule and its merge group.

    `unit`: the modules whose per-tensor weight scales vLLM merges with this one (the fused
    layer's members; an expert's gate and up), itself alone otherwise. `act_group`: the modules
    whose static input scales are merged (the fused layer; every expert of the MoE layer on the
    same side, w13 or w2). `pre_quant_scale`: the checkpoint has one for this Linear (ModelOpt AWQ)."""

    name: str
    algo: str
    act: ActRule
    unit: tuple[str, ...]
    act_group: tuple[str, ...]
    pre_quant_scale: bool = False


@dataclass
class Served:
    """A converted checkpoint, read as vLLM serves it (:func:`open_served`)."""

    source: object  # checkpoint.source.Source: root, config, tensors
    format: Format | None  # formats.MODELOPT / COMPRESSED_TENSORS, or None (not quantized)
    quant_algo: str | None
    linears: dict[str, ServedLinear]
    kv_cache: bool  # FP8 KV cache declared
    layout: str | None = None
    act_dtype: str = "bfloat16"
    recipe: object = None
    _stacks: dict = field(default_factory=dict)  # packed MoE layer -> unpacked expert weights (one at a time)
    _modules: dict = field(default_factory=dict)  # module -> {leaf: TensorInfo}, built once

    @property
    def tensors(self):
        return self.source.tensors

    @property
    def fmt(self) -> str | None:
        """The format's name (the eval report's ``format``), None when not quantized."""
        return self.format.name if self.format is not None else None

    def leaves(self, module: str) -> dict:
        """TensorInfo of every tensor of `module`, by leaf name (``weight``, ``weight_scale`` ...)."""
        if not self._modules:
            for info in self.tensors.values():
                self._modules.setdefault(info.module, {})[info.leaf] = info
        return dict(self._modules.get(module, {}))

    def weight(self, name: str, device=None) -> torch.Tensor:
        """fp32 ``[N, K]``: the weight vLLM computes with for quantized Linear `name`, dequantized
        on `device` (the written tensors are moved there first: a GPU dequantizes in a blink)."""
        spec = self.linears[name]
        scheme = self.format.scheme(spec.algo)
        q = {k: v.to(device) if device is not None else v for k, v in self._plain(name).items()}
        if scheme.global_scale_key is not None:
            q = self._merged_fp4_global(spec, q, scheme.global_scale_key)
        w = scheme.dequantize(q)
        if spec.algo == "FP8" and len(spec.unit) > 1:
            w = self._requantize_to_max(spec, q, w)
        return w.float()

    def pre_quant_scale(self, name: str, k: int, device=None) -> torch.Tensor | None:
        """fp32 ``[K]`` (`k`): what TensorRT-LLM multiplies Linear `name`'s input by before quantizing
        it and the GEMM (ModelOpt AWQ; the weight was quantized as ``W / pre_quant_scale``), or None."""
        from ..checkpoint.safetensors_io import read_tensor

        if not self.linears[name].pre_quant_scale:
            return None
        p = read_tensor(self.tensors[f"{name}.pre_quant_scale"])
        if p.numel() != k:
            raise SourceError(f"{name}.pre_quant_scale: shape {list(p.shape)} but the Linear's input has {k} channels; "
                              "re-export it")
        return p.to(device).float().reshape(k)

    def kv_scales(self, attn: str) -> tuple[float, float, float] | None:
        """(q, k, v) scales of attention module `attn` when the KV cache is FP8, else None.

        ModelOpt writes ``<attn>.k_proj.k_scale``; llm-compressor ``<attn>.k_scale`` (both mapped
        by vLLM's ``maybe_remap_kv_scale_name``). A missing scale is 1.0 (kv_cache.py)."""
        if not self.kv_cache:
            return None
        if not (self.leaves(f"{attn}.k_proj") or f"{attn}.k_scale" in self.tensors):
            return None  # not an attention module with a K projection
        out = []
        for kind in ("q", "k", "v"):
            info = self.tensors.get(f"{attn}.{kind}_proj.{kind}_scale") or self.tensors.get(f"{attn}.{kind}_scale")
            out.append(_scalar(info) if info is not None else 1.0)
        return tuple(out)  # type: ignore[return-value]

    # ----------------------------------------------------------------------------------------

    def _plain(self, name: str) -> dict:
        """The plain scheme tensors of `name` (a packed layout unpacked, exactly)."""
        from ..checkpoint.safetensors_io import read_tensor

        leaves = {k: read_tensor(v) for k, v in self.leaves(name).items()}
        if self.layout in (None, "plain"):
            return leaves
        from .. import layouts

        m = _EXPERT.match(name)
        if m and "weight" not in leaves:  # the expert's weight lives in its layer's packed stack
            leaves["weight"] = self._expert_weight(m.group("layer"), int(m.group("e")), m.group("role"))
            return leaves
        return layouts.unpack(self.layout, self.linears[name].algo, leaves, self.act_dtype)

    def _expert_weight(self, layer: str, e: int, role: str) -> torch.Tensor:
        from .. import layouts
        from ..checkpoint.safetensors_io import read_tensor
        from ..layouts.packing import unstack
        from ..modules.experts import expert_names

        if layer not in self._stacks:
            self._stacks.clear()  # one MoE layer's stack at a time
            sfx = layouts.suffix(self.layout)
            side = {"w13": {}, "w2": {}}
            for leaf, info in self.leaves(layer).items():
                if leaf.startswith(("w13_", "w2_")) and leaf.endswith(sfx):
                    side[leaf.split("_", 1)[0]][leaf.split("_", 1)[1]] = read_tensor(info)
            algo = next(s.algo for n, s in self.linears.items() if n.startswith(layer + "."))
            plain = layouts.unpack_moe(self.layout, algo, side)
            self._stacks[layer] = unstack(plain["w13"]["weight"], plain["w2"]["weight"])
        names = {v: k for k, v in expert_names(self.recipe).items()}
        return self._stacks[layer][e][names[role]].contiguous()

    def _merged_fp4_global(self, spec: ServedLinear, q: dict, key: str) -> dict:
        """NVFP4: the global weight scale vLLM applies (see the module docstring); `key`: its tensor's
        name in this format (``Scheme.global_scale_key``)."""
        import torch

        values = [_scalar(self.tensors[f"{m}.{key}"]) for m in spec.unit if f"{m}.{key}" in self.tensors]
        if not values:
            return q
        if _EXPERT.match(spec.name):  # w13 of an expert: w1's (the first member, gate) for both
            chosen = values[0]
        else:
            chosen = max(values)
        q = dict(q)
        q[key] = torch.tensor(chosen, dtype=torch.float32, device=q[key].device if key in q else None)
        return q

    def _requantize_to_max(self, spec: ServedLinear, q: dict, w: torch.Tensor) -> torch.Tensor:
        """FP8 per tensor in a fused layer with different scales: vLLM's requantize_with_max_scale
        (``per_tensor_dequantize`` in fp16, then ``scaled_fp8_quant`` with the max: ``x * (1/s)``)."""
        import torch

        from .activations import fp8_tensor

        scales = [_scalar(self.tensors[f"{m}.weight_scale"]) for m in spec.unit if f"{m}.weight_scale" in self.tensors]
        s_max = max(scales)
        own = float(q["weight_scale"].float().reshape(-1)[0])
        if own == s_max and all(s == s_max for s in scales):
            return w
        dq = q["weight"].to(torch.float16) * torch.tensor(own, dtype=torch.float32, device=q["weight"].device)  # fp16 (0-d fp32 scale)
        return fp8_tensor(dq.float(), s_max)


def _scalar(info) -> float:
    from ..checkpoint.safetensors_io import read_tensor

    return float(read_tensor(info).float().reshape(-1).max())


def open_served(path: str, weights_only: bool = False) -> Served:
    """Read the converted checkpoint at `path` (folder or Hub id) as vLLM would serve it.

    `weights_only`: activations and KV cache stay unquantized (what a weight-only kernel such
    as Marlin serves on GPUs without FP4 / MX support). Raises SourceError (one line) for a
    quantization config this tool cannot read.
    """
    from ..checkpoint.source import open_source
    from ..formats import COMPRESSED_TENSORS, MODELOPT, format_of_config

    source = open_source(path, allow_quantized=True)
    fmt = format_of_config(source.config)
    if fmt is COMPRESSED_TENSORS:
        algo_of, quant_algo, kv, recipe, layout = _ct_config(source)
    elif fmt is not None or os.path.exists(os.path.join(source.root, "hf_quant_config.json")):
        fmt = MODELOPT
        algo_of, quant_algo, kv, recipe, layout = _modelopt_config(source)
    else:
        algo_of, quant_algo, kv, recipe, layout = (lambda m: None), None, False, _recipe(None, source), None
    quantized = _quantized_modules(source.tensors, layout)
    served = Served(source, fmt, quant_algo, {}, kv and not weights_only, layout,
                    ((source.config.get("quantization_config") or {}).get("layout") or {}).get("activation_dtype", "bfloat16"),
                    recipe)
    algos = {}
    for mod in quantized:
        algo = algo_of(mod)
        if algo is None:
            raise SourceError(f"{path}: {mod} holds quantized tensors but the quantization config gives it no algorithm; "
                              "run `quantize verify` on it")
        algos[mod] = algo
    units, groups = _merge_groups(list(algos), recipe)
    for mod, algo in algos.items():
        rule = NONE if weights_only else _act_rule(served, fmt.scheme(algo), groups[mod])
        served.linears[mod] = ServedLinear(mod, algo, rule, units[mod], groups[mod],
                                           f"{mod}.pre_quant_scale" in source.tensors)
    return served


def _recipe(nested, source):
    from ..modules.recipe import recipe_of_output

    return recipe_of_output(nested, source.config.get("model_type"), os.path.join(source.root, "hf_quant_config.json"))


def _modelopt_config(source):
    from ..jsonfile import JsonFileError, load_json

    try:
        nested = load_json(os.path.join(source.root, "hf_quant_config.json"), "hf_quant_config.json",
                           fix="re-convert or restore it", missing="a ModelOpt checkpoint needs it")
    except JsonFileError as exc:
        raise SourceError(exc.message) from None
    q = nested.get("quantization") or {}
    quant_algo = str(q.get("quant_algo"))
    static = lambda m: f"{m}.input_scale" in source.tensors  # noqa: E731 - NVFP4_AWQ: W4A4 or W4A16
    if quant_algo == MIXED_PRECISION:
        layers = {m: str((cfg or {}).get("quant_algo", "")) for m, cfg in (q.get("quantized_layers") or {}).items()}
        algo_of = lambda m: _algo(layers[m], static(m)) if m in layers else None  # noqa: E731
    else:
        if _algo(quant_algo) is None:
            raise SourceError(f"{source.root}/hf_quant_config.json: quant_algo {quant_algo!r} is not one this tool evaluates")
        algo_of = lambda m: _algo(quant_algo, static(m))  # noqa: E731
    layout = ((nested.get("converter") or {}).get("layout") or {}).get("name")
    return algo_of, quant_algo, str(q.get("kv_cache_quant_algo") or "").upper() == "FP8", _recipe(nested, source), layout


def _algo(quant_algo: str, static: bool = True) -> str | None:
    """ModelOpt's quant_algo -> our algorithm: its own name, the ModelOpt name it is written as
    (``W4A16_AWQ`` -> INT4: ModelOpt never writes INT4_ASYM), or the name ModelOpt's AWQ export gives
    it (``NVFP4_AWQ`` -> NVFP4, W4A16_NVFP4 for a Linear without an input scale: `static` False)."""
    return canonical_algo(quant_algo) or algo_of_quant_algo(quant_algo) or algo_of_awq_quant_algo(quant_algo, static)


def _ct_config(source):
    from ..formats import CT_SCHEMES
    from ..formats.ct_mixed import group_of, group_targets
    from ..formats.ct_verify import group_preset

    q = source.config["quantization_config"]
    presets = {g: group_preset(cfg or {}, q) for g, cfg in (q.get("config_groups") or {}).items()}
    bad = [g for g, p in presets.items() if p is None]
    if not presets or bad:
        raise SourceError(f"{source.root}/config.json: compressed-tensors config group(s) {bad or '(none)'} are not a preset "
                          "this tool evaluates; see docs/formats.md")
    algo_by_group = {g: next(s.algo for s in CT_SCHEMES.values() if s.preset == p) for g, p in presets.items()}
    targets = group_targets(q)

    def algo_of(mod: str):
        group = group_of(mod, targets)
        return algo_by_group.get(group) if group is not None else None

    quant_algo = next(iter(algo_by_group.values())) if len(algo_by_group) == 1 else MIXED_PRECISION
    return algo_of, quant_algo, q.get("kv_cache_scheme") is not None, _recipe(None, source), None


def _quantized_modules(tensors, layout) -> list[str]:
    """Modules with quantized tensors: a weight scale, a packed weight, or an 8-bit weight."""
    out = []
    for name, info in tensors.items():
        leaf = name.rpartition(".")[2]
        if leaf in ("weight_scale", "weight_packed") or (leaf == "weight" and info.dtype in ("F8_E4M3", "I8")):
            if info.module not in out and not info.module.endswith("experts"):
                out.append(info.module)
    return out


def _merge_groups(mods: list[str], recipe) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """(`unit`, `act_group`) of every quantized module (see :class:`ServedLinear`)."""
    from ..modules.experts import expert_names

    fused = recipe.member_to_fused()
    roles = expert_names(recipe)
    present = set(mods)
    units, groups = {}, {}
    for mod in mods:
        m = _EXPERT.match(mod)
        if m and m.group("role") in roles.values():
            layer, e = m.group("layer"), m.group("e")
            w13 = m.group("role") in (roles["gate"], roles["up"])
            units[mod] = tuple(f"{layer}.{e}.{roles[r]}" for r in ("gate", "up") if f"{layer}.{e}.{roles[r]}" in present) if w13 else (mod,)
            side = ("gate", "up") if w13 else ("down",)
            groups[mod] = tuple(n for n in mods if (x := _EXPERT.match(n)) and x.group("layer") == layer
                                and x.group("role") in {roles[r] for r in side})
            continue
        parent, _, leaf = mod.rpartition(".")
        if leaf in fused:
            members = [f"{parent}.{m}" for m in recipe.fused[fused[leaf]] if f"{parent}.{m}" in present]
            units[mod] = groups[mod] = tuple(members)
        else:
            units[mod] = groups[mod] = (mod,)
    return units, groups


def _act_rule(served: Served, scheme, group: tuple[str, ...]) -> ActRule:
    """The activation rule of a module written with `scheme` (its format's; ``Scheme.act_kind``: the
    INT8 of compressed-tensors is W8A8, ModelOpt's W8A16) whose static input scales merge over `group`."""
    algo, kind = scheme.algo, scheme.act_kind
    if kind is None:
        return NONE
    if kind not in ("fp8_tensor", "nvfp4"):
        return ActRule(kind)
    values = {}
    for key in _STATIC_INPUT:
        found = [_scalar(served.tensors[f"{m}.{key}"]) for m in group if f"{m}.{key}" in served.tensors]
        if found:
            values[key] = found
    if not values:
        raise SourceError(f"{group[0]}: {algo} serves with a static input scale but the checkpoint has none "
                          "(input_scale / input_global_scale); vLLM would read garbage; re-convert it")
    if kind == "fp8_tensor":
        return ActRule(kind, max(values.get("input_scale") or values["input_global_scale"]))
    if "input_global_scale" in values:  # compressed-tensors stores 2688 / amax
        g = values["input_global_scale"]
        return ActRule(kind, 1.0 / max(1.0 / v for v in g) if _EXPERT.match(group[0]) else max(g))
    return ActRule(kind, 1.0 / max(values["input_scale"]))
