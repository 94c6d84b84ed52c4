"""What calibration observes: the amax of every Linear input, per expert, and of keys/values.

The recorder is plain Python state; three kinds of taps feed it while a layer runs:

* a forward pre-hook on every ``nn.Linear``: ``amax(|x|)`` of its input ``x [..., K]`` (and, for
  the recorder's observers, the input itself: ``stats.ChannelEnergy`` sums ``x_j^2`` per channel);
* an experts forward (registered in transformers' ``ExpertsInterface``) for the fused 3-D
  expert modules of transformers 5: it computes what the eager loop computes and records, per
  expert, the input of ``gate_up_proj[e]`` (the routed tokens) and of ``down_proj[e]``;
* an attention function (registered in ``AttentionInterface``) that records ``amax(|k|)`` and
  ``amax(|v|)`` as the attention kernel receives them (after RoPE and k-norm), which is what
  ModelOpt's ``k_bmm_quantizer`` / ``v_bmm_quantizer`` see and what an FP8 KV cache stores.

Amax is taken in the activation dtype (exact: ``abs``/``max`` do not round) and kept as a Python
float (an fp32 value), so the order in which samples arrive cannot change it.

transformers is imported inside functions only: the base install never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..schemes.numerics import abs_max

IMPL = "quantize_calib"  # the name our attention / experts functions are registered under


@dataclass
class Stat:
    """Running max |x| and the number of tokens (rows of ``x [..., K]``) seen."""

    amax: float = 0.0
    tokens: int = 0

    def add(self, x: torch.Tensor, tokens: int | None = None) -> None:
        if x.numel():
            self.amax = max(self.amax, float(abs_max(x.detach()).float()))
        self.tokens += tokens if tokens is not None else (x.numel() // max(1, x.shape[-1]) if x.dim() else 1)


@dataclass
class Recorder:
    """Per checkpoint module name: input stats (``inputs``) and K / V stats (``kv``)."""

    inputs: dict[str, Stat] = field(default_factory=dict)
    kv: dict[str, dict[str, Stat]] = field(default_factory=dict)
    observers: list = field(default_factory=list)  # objects with add(name, x): see every recorded input (stats.py)
    names: dict[int, str] = field(default_factory=dict)  # id(module) -> checkpoint module name
    experts: dict[int, tuple[str, dict[str, str]]] = field(default_factory=dict)  # id(experts) -> (name, role names)

    def record(self, name: str, x: torch.Tensor) -> None:
        self.inputs.setdefault(name, Stat()).add(x)
        for observer in self.observers:
            observer.add(name, x)

    def record_kv(self, module, key: torch.Tensor, value: torch.Tensor) -> None:
        name = self.names.get(id(module))
        if name is None:
            return
        slot = self.kv.setdefault(name, {"k": Stat(), "v": Stat()})
        tokens = key.shape[0] * key.shape[-2] if key.dim() == 4 else None  # [B, heads, L, D]: B*L tokens
        slot["k"].add(key, tokens)
        slot["v"].add(value, tokens)


_ACTIVE: list[Recorder] = []  # the recorder the registered functions report to (one run at a time)


def attach(recorder: Recorder, layer: torch.nn.Module, prefix: str, expert_roles: dict[str, str]) -> list:
    """Register the taps on `layer` (checkpoint module names start with `prefix`); returns handles."""
    handles = []
    for sub_name, mod in layer.named_modules():
        name = f"{prefix}.{sub_name}" if prefix and sub_name else (prefix or sub_name)
        recorder.names[id(mod)] = name
        if isinstance(mod, torch.nn.Linear):
            handles.append(mod.register_forward_pre_hook(_linear_hook(recorder, name)))
        elif _is_fused_experts(mod):
            recorder.experts[id(mod)] = (name, expert_roles)
    return handles


def detach(handles: list) -> None:
    for h in handles:
        h.remove()


def _linear_hook(recorder: Recorder, name: str):
    def hook(module, args):
        recorder.record(name, args[0])

    return hook


def _is_fused_experts(mod: torch.nn.Module) -> bool:
    return isinstance(getattr(mod, "gate_up_proj", None), torch.nn.Parameter) and getattr(mod, "gate_up_proj").dim() == 3


def expert_loop(mod, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                linear) -> torch.Tensor:
    """transformers' eager loop over fused 3-D experts (``hidden_states [T, H]``, ``top_k_* [T, k]``),
    with each expert's projection computed by ``linear(e, side, x, w)`` (`side`: ``gate_up`` or
    ``down``; `x` its routed inputs, `w` the [out, in] weight). Calibration records there, eval
    quantizes the inputs as the MoE kernel does. Written for this project; the arithmetic follows
    the eager loop (linear, gate, linear, routing weight, index_add)."""
    out = torch.zeros_like(hidden_states)
    num = mod.gate_up_proj.shape[0]
    transposed, bias = getattr(mod, "is_transposed", False), getattr(mod, "has_bias", False)
    with torch.no_grad():
        hit = torch.nn.functional.one_hot(top_k_index, num_classes=num + 1).permute(2, 1, 0)  # [E+1, k, T]
        experts = torch.greater(hit.sum(dim=(-1, -2)), 0).nonzero()
    for e in experts[:, 0].tolist():
        if e == num:
            continue
        pos, tok = torch.where(hit[e])
        x = hidden_states[tok]
        gate_up = linear(e, "gate_up", x, mod.gate_up_proj[e].t() if transposed else mod.gate_up_proj[e])
        if bias:
            gate_up = gate_up + mod.gate_up_proj_bias[e]
        h = mod._apply_gate(gate_up)
        y = linear(e, "down", h, mod.down_proj[e].t() if transposed else mod.down_proj[e])
        if bias:
            y = y + mod.down_proj_bias[e]
        y = y * top_k_weights[tok, pos, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out


def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """The eager expert loop (:func:`expert_loop`), recording each expert's gate/up input (its
    routed tokens) and down input."""
    recorder = _ACTIVE[-1] if _ACTIVE else None
    name, roles = recorder.experts.get(id(self), (None, None)) if recorder else (None, None)

    def linear(e: int, side: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if name is not None:
            for role in ("gate", "up") if side == "gate_up" else ("down",):
                recorder.record(f"{name}.{e}.{roles[role]}", x)
        return torch.nn.functional.linear(x, w)

    return expert_loop(self, hidden_states, top_k_index, top_k_weights, linear)


def attention_forward(module, query, key, value, attention_mask, **kwargs):
    """SDPA attention (transformers' own), after recording K and V of `module`."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _ACTIVE:
        _ACTIVE[-1].record_kv(module, key, value)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register() -> None:
    """Make :data:`IMPL` a valid ``attn_implementation`` / ``experts_implementation`` (idempotent)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(IMPL, attention_forward)
    AttentionMaskInterface.register(IMPL, sdpa_mask)
    ALL_EXPERTS_FUNCTIONS.register(IMPL, experts_forward)


class active:
    """``with active(recorder):`` routes the registered functions' records to `recorder`."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder

    def __enter__(self):
        _ACTIVE.append(self.recorder)
        return self.recorder

    def __exit__(self, *exc):
        _ACTIVE.pop()
