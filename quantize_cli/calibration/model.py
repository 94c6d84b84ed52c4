"""The source architecture, built by transformers on the meta device and filled one piece at a time.

:func:`build` makes the base model (``AutoModel.from_config``) with no memory behind it and finds
its stack of blocks (decoder layers, or BERT's ``encoder.layer``). :func:`materialize` gives one
sub-module real storage on a device and fills it from the checkpoint through the project's own
safetensors reader (``read_tensor``): parameters by name, buffers the checkpoint lacks (rotary
``inv_freq``, BERT ``position_ids``) by transformers' own ``_init_weights``. Fused 3-D expert
parameters of transformers 5 (``experts.gate_up_proj [E, 2I, H]``, ``experts.down_proj [E, H, I]``)
are stacked from per-expert checkpoint tensors when the checkpoint stores experts one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checkpoint.safetensors_io import TensorInfo, read_tensor
from ..errors import SourceError
from ..modules.experts import expert_names
from . import hooks


@dataclass
class Skeleton:
    """The meta model, its block stack, and how its names map to the checkpoint's."""

    model: torch.nn.Module
    blocks: torch.nn.ModuleList
    blocks_path: str  # "layers", "encoder.layer"
    prefix: str  # checkpoint name = prefix + model name ("model." for a causal LM checkpoint)
    roles: dict[str, str]  # per-expert gate/up/down module names of the checkpoint


def install_hint() -> str:
    return "install the calibration extra: pip install 'quantize-cli[calib]'"


def require_transformers():
    try:
        import transformers  # noqa: F401
    except ImportError:
        from ..errors import CalibrationError

        raise CalibrationError(f"calibration runs the model with transformers, which is not installed; {install_hint()}") from None
    return transformers


def build(root: str, config: dict, tensors: dict[str, TensorInfo], recipe, dtype: torch.dtype) -> Skeleton:
    """The meta-device base model of the checkpoint at `root` (config.json), ready for streaming."""
    require_transformers()
    from transformers import AutoConfig, AutoModel

    hooks.register()
    model_type = config.get("model_type")
    try:
        hf_config = AutoConfig.from_pretrained(root, local_files_only=True)  # remote code never runs (default)
    except (ValueError, KeyError, OSError) as exc:
        raise SourceError(
            f"{root}/config.json: model_type {model_type!r} is not an architecture this transformers knows "
            f"({type(exc).__name__}), so it cannot be run for calibration; convert without --calib-data "
            f"(constant scales), or pass --act-scales made elsewhere") from None
    try:
        with torch.device("meta"):
            model = AutoModel.from_config(hf_config, attn_implementation=hooks.IMPL, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - any failure here means: cannot build this architecture
        raise SourceError(f"{root}/config.json: model_type {model_type!r}: transformers cannot build it on the meta device "
                          f"({type(exc).__name__}: {exc}); convert without --calib-data") from None
    _set_experts_impl(model)
    model.eval()
    blocks_path, blocks = _find_blocks(model, model_type)
    prefix = _prefix(model, tensors, model_type, root)
    return Skeleton(model, blocks, blocks_path, prefix, expert_names(recipe))


def _set_experts_impl(model: torch.nn.Module) -> None:
    for mod in model.modules():
        cfg = getattr(mod, "config", None)
        if cfg is not None and hasattr(cfg, "_experts_implementation"):
            cfg._experts_implementation = hooks.IMPL


def _find_blocks(model: torch.nn.Module, model_type) -> tuple[str, torch.nn.ModuleList]:
    """The ModuleList holding the most parameters: the decoder layers / encoder blocks."""
    best, best_n = None, 0
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) and len({type(m) for m in mod}) == 1:
            n = sum(p.numel() for p in mod.parameters())
            if n > best_n:
                best, best_n = (name, mod), n
    if best is None:
        raise SourceError(f"model_type {model_type!r}: no stack of layers found in the transformers model; cannot calibrate it layer by layer")
    return best


def _prefix(model: torch.nn.Module, tensors: dict[str, TensorInfo], model_type, root: str) -> str:
    """"" or "<base_model_prefix>.": whichever makes the model's parameter names checkpoint names."""
    names = [n for n, _ in model.named_parameters()]
    best, hits = "", -1
    for prefix in ("", f"{getattr(model, 'base_model_prefix', '') or 'model'}.", "model."):
        n = sum(1 for p in names if prefix + p in tensors)
        if n > hits:
            best, hits = prefix, n
    if hits <= 0:
        raise SourceError(f"{root}: no tensor of the checkpoint matches the transformers {model_type!r} model's parameter names "
                          f"(e.g. {names[0] if names else '?'}); cannot load it for calibration")
    return best


def materialize(sk: Skeleton, module: torch.nn.Module, path: str, tensors: dict[str, TensorInfo], device: torch.device,
                skip: tuple[str, ...] = ()) -> None:
    """Give `module` (named `path` in the model; "" for the root) real storage on `device` and fill it.

    `skip`: sub-module paths (relative to the root model) left on the meta device (the blocks,
    when the root's embeddings and norms are materialized).
    """
    dtype = next((p.dtype for p in sk.model.parameters() if p.is_floating_point()), torch.bfloat16)
    for sub_name, sub in module.named_modules():
        full = _join(path, sub_name)
        if any(full == s or full.startswith(s + ".") for s in skip):
            continue
        own = list(sub.named_parameters(recurse=False)) + list(sub.named_buffers(recurse=False))
        if not own:
            continue
        sub.to_empty(device=device, recurse=False)
        if list(sub.named_buffers(recurse=False)):  # buffers the checkpoint lacks (inv_freq, position_ids);
            try:                                    # parameters are all overwritten below: never initialised
                sk.model._init_weights(sub)
            except Exception:  # noqa: BLE001 - a module without an init rule keeps the checkpoint's buffers
                pass
        for leaf, p in sub.named_parameters(recurse=False):
            _load(sk, _join(full, leaf), tensors, p, sub)
        for leaf, b in sub.named_buffers(recurse=False):
            info = tensors.get(sk.prefix + _join(full, leaf))
            if info is not None:
                with torch.no_grad():
                    b.copy_(read_tensor(info).to(device=device, dtype=b.dtype).reshape(b.shape))


def release(module: torch.nn.Module) -> None:
    """Drop `module`'s storage (back to the meta device)."""
    module.to_empty(device="meta")


def _join(a: str, b: str) -> str:
    return f"{a}.{b}" if a and b else (a or b)


def _load(sk: Skeleton, name: str, tensors: dict[str, TensorInfo], p: torch.Tensor, owner) -> None:
    """Fill model parameter `name` from the checkpoint (per-expert tensors go into fused experts one
    expert at a time, so the host holds one expert's weights, never the whole stack)."""
    ck = sk.prefix + name
    info = tensors.get(ck)
    if info is not None:
        if tuple(info.shape) != tuple(p.shape):
            raise SourceError(f"{info.name} in {info.path}: shape {list(info.shape)} but the {type(owner).__name__} built from "
                              f"config.json expects {list(p.shape)}; the checkpoint and its config.json disagree")
        with torch.no_grad():
            p.copy_(read_tensor(info).to(device=p.device, dtype=p.dtype))
        return
    container, _, leaf = ck.rpartition(".")
    if p.dim() == 3 and leaf in ("gate_up_proj", "down_proj"):
        return _fill_experts(sk, container, leaf, tensors, p, owner)
    raise SourceError(f"{ck}: the transformers model needs this parameter but the checkpoint has no such tensor; "
                      f"this checkpoint's naming is not supported for calibration (convert without --calib-data, or pass --act-scales)")


def _fill_experts(sk: Skeleton, container: str, leaf: str, tensors, p: torch.Tensor, owner) -> None:
    """``p[e]`` = expert e's [gate ; up] rows (``gate_up_proj [E, 2I, H]``) or its down weight
    (``down_proj [E, H, I]``), transposed when the module keeps them transposed."""
    roles = ("gate", "up") if leaf == "gate_up_proj" else ("down",)
    for e in range(p.shape[0]):
        ws = []
        for r in roles:
            info = tensors.get(f"{container}.{e}.{sk.roles[r]}.weight")
            if info is None:
                raise SourceError(f"{container}.{e}.{sk.roles[r]}.weight: needed to build {container}.{leaf} for calibration "
                                  f"but the checkpoint has no such tensor; convert without --calib-data, or pass --act-scales")
            ws.append(read_tensor(info))
        w = torch.cat(ws, dim=0)
        w = w.t() if getattr(owner, "is_transposed", False) else w
        if tuple(w.shape) != tuple(p.shape[1:]):
            raise SourceError(f"{container}.{e}: expert weights give {list(w.shape)} but config.json implies {list(p.shape[1:])}")
        with torch.no_grad():
            p[e].copy_(w.to(device=p.device, dtype=p.dtype))
