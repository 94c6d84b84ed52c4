"""The architecture on the meta device, filled one block at a time from a checkpoint as written
(the source) or as served (a converted checkpoint: :mod:`.weights`).

:func:`build` makes the model with its head (``AutoModelForCausalLM`` when the config names a
causal LM, else the base model: encoders) from config.json without its ``quantization_config``,
with transformers' own attention (SDPA) and MoE expert loop registered under our name, so that
FP8 KV caches and per-expert activation quantization can be applied (:data:`STATE`).
:func:`fill` gives one module real storage and its tensors; a quantized Linear gets the served
fp32 weight and a forward that quantizes its input as the engine does (:mod:`.activations`),
after multiplying it by the Linear's ``pre_quant_scale`` where ModelOpt's AWQ left one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import torch

from ..calibration.model import Skeleton, _find_blocks, _prefix
from ..errors import CalibrationError, SourceError
from ..plan.audience import CAUSAL_LM, model_kind
from .activations import NONE, ActRule, fp8_tensor, kv_fp8, quantize_activation

IMPL = "quantize_eval"  # our attention / experts functions' registered name


@dataclass
class State:
    """Serve-time rules of the modules now materialized, by ``id(module)``."""

    kv: dict[int, tuple[float, float, float]] = field(default_factory=dict)  # attention -> (q, k, v) scales
    experts: dict[int, tuple[ActRule, ActRule]] = field(default_factory=dict)  # experts -> (w13 rule, w2 rule)


STATE = State()


def build(root: str, config: dict, tensors: dict, dtype: torch.dtype = torch.float32) -> tuple[Skeleton, bool]:
    """(meta-device model of the checkpoint at `root`, whether it is a causal LM)."""
    try:
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    except ImportError:
        from ..calibration.model import install_hint

        raise CalibrationError(f"quantize eval runs the model with transformers, which is not installed; {install_hint()}") from None

    register()
    model_type = config.get("model_type")
    try:
        cfg = AutoConfig.from_pretrained(root, local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        raise SourceError(f"{root}/config.json: model_type {model_type!r} is not an architecture this transformers knows "
                          f"({type(exc).__name__}); eval runs the model with transformers") from None
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config  # we apply the quantization ourselves, from the written tensors
    causal = model_kind(config) == CAUSAL_LM
    try:
        with torch.device("meta"):
            cls = AutoModelForCausalLM if causal else AutoModel
            model = cls.from_config(cfg, attn_implementation=IMPL, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - any failure here means: cannot build this architecture
        raise SourceError(f"{root}/config.json: model_type {model_type!r}: transformers cannot build it "
                          f"({type(exc).__name__}: {exc})") from None
    for mod in model.modules():
        cfg_ = getattr(mod, "config", None)
        if cfg_ is not None and hasattr(cfg_, "_experts_implementation"):
            cfg_._experts_implementation = IMPL
    model.eval()
    blocks_path, blocks = _find_blocks(model, model_type)
    from ..modules.recipe import load_recipe
    from ..modules.experts import expert_names

    roles = expert_names(load_recipe(None, model_type))
    return Skeleton(model, blocks, blocks_path, _prefix(model, tensors, model_type, root), roles), causal


class Loader:
    """Where a model's tensors come from: `tensor(name)` a checkpoint tensor or None;
    `linear(name)` the served ``(fp32 weight [N, K], activation rule, pre_quant_scale [K] or None)``
    of a quantized Linear, or None."""

    def tensor(self, name: str) -> torch.Tensor | None:
        raise NotImplementedError

    def linear(self, name: str) -> tuple[torch.Tensor, ActRule, torch.Tensor | None] | None:
        return None

    def quantized(self, name: str) -> bool:
        """Whether `name` is a quantized Linear (cheap: nothing is read)."""
        return False

    def kv(self, attn: str) -> tuple[float, float, float] | None:
        return None


def fill(sk: Skeleton, module: torch.nn.Module, path: str, loader: Loader, device: torch.device,
         skip: tuple[str, ...] = ()) -> None:
    """Give `module` (named `path` in the model; "" for the root) storage on `device` and its tensors.

    `skip`: module paths left on the meta device (the blocks, when the root is filled)."""
    tied = getattr(sk.model, "_tied_weights_keys", None) or {}
    retie = False
    for sub_name, sub in module.named_modules():
        full = _join(path, sub_name)
        if any(full == s or full.startswith(s + ".") for s in skip):
            continue
        ck = sk.prefix + full
        kv = loader.kv(ck)
        if kv is not None:  # the attention module (no tensors of its own): its KV cache rule
            STATE.kv[id(sub)] = kv
        own = list(sub.named_parameters(recurse=False)) + list(sub.named_buffers(recurse=False))
        if not own:
            continue
        sub.to_empty(device=device, recurse=False)
        if list(sub.named_buffers(recurse=False)):  # rotary inv_freq, position_ids: transformers' init
            try:
                sk.model._init_weights(sub)
            except Exception:  # noqa: BLE001 - a module without an init rule keeps the checkpoint's buffers
                pass
        if _is_experts(sub):
            _fill_experts(sk, sub, ck, loader)
            continue
        served = loader.linear(ck) if isinstance(sub, torch.nn.Linear) else None
        for leaf, p in sub.named_parameters(recurse=False):
            if served is not None and leaf == "weight":
                value = served[0]
            else:
                value = loader.tensor(f"{ck}.{leaf}")
            if value is None:
                if _join(full, leaf) in tied:
                    retie = True
                    continue
                raise SourceError(f"{ck}.{leaf}: the transformers model needs this tensor but the checkpoint has none; "
                                  "this checkpoint's naming is not supported by eval")
            _copy(p, value, f"{ck}.{leaf}")
        for leaf, b in sub.named_buffers(recurse=False):
            value = loader.tensor(f"{ck}.{leaf}")
            if value is not None:
                _copy(b, value, f"{ck}.{leaf}")
        if served is not None:
            _serve_linear(sub, served[1], served[2])
    if retie:
        sk.model.tie_weights()


def release(module: torch.nn.Module) -> None:
    """Drop `module`'s storage (back to the meta device) and its serve-time rules."""
    for sub in module.modules():
        STATE.kv.pop(id(sub), None)
        STATE.experts.pop(id(sub), None)
        if "forward" in sub.__dict__:
            del sub.forward  # the class's forward again
    module.to_empty(device="meta")


def _join(a: str, b: str) -> str:
    return f"{a}.{b}" if a and b else (a or b)


def _copy(dst: torch.Tensor, value: torch.Tensor, name: str) -> None:
    if tuple(value.shape) != tuple(dst.shape):
        raise SourceError(f"{name}: shape {list(value.shape)} but the model built from config.json expects {list(dst.shape)}")
    with torch.no_grad():
        dst.copy_(value.to(device=dst.device, dtype=dst.dtype))


def _serve_linear(lin: torch.nn.Linear, rule: ActRule, pre_quant_scale: torch.Tensor | None = None) -> None:
    """The Linear's forward as served: its input times `pre_quant_scale` [K] when given (TensorRT-LLM
    scales before it quantizes, as ModelOpt's AWQ calibrated), quantized by `rule`, fp32 GEMM with
    the served weight."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        xs = x if pre_quant_scale is None else x.float() * pre_quant_scale
        y = torch.nn.functional.linear(quantize_activation(rule, xs), lin.weight.float(),
                                       None if lin.bias is None else lin.bias.float())
        return y.to(x.dtype)

    lin.forward = forward


def _is_experts(mod: torch.nn.Module) -> bool:
    p = getattr(mod, "gate_up_proj", None)
    return isinstance(p, torch.nn.Parameter) and p.dim() == 3


def _fill_experts(sk: Skeleton, mod, container: str, loader: Loader) -> None:
    """transformers-5 fused experts (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``) from the
    checkpoint's per-expert tensors, one expert at a time; their serve-time rules into STATE."""
    rules = {}
    for leaf in ("gate_up_proj", "down_proj"):
        p = getattr(mod, leaf)
        roles = ("gate", "up") if leaf == "gate_up_proj" else ("down",)
        whole = None if loader.quantized(f"{container}.0.{sk.roles[roles[0]]}") else loader.tensor(f"{container}.{leaf}")
        if whole is not None:  # a checkpoint with transformers' own fused expert tensors (unquantized)
            _copy(p, whole, f"{container}.{leaf}")
            continue
        for e in range(p.shape[0]):
            parts = []
            for r in roles:
                name = f"{container}.{e}.{sk.roles[r]}"
                served = loader.linear(name)
                if served is not None and served[2] is not None:  # one GEMM per side: no per-expert input scale
                    raise SourceError(f"{name}.pre_quant_scale: eval does not apply a MoE expert's pre_quant_scale "
                                      "(ModelOpt AWQ) yet")
                w = served[0] if served is not None else loader.tensor(f"{name}.weight")
                if w is None:
                    raise SourceError(f"{name}.weight: needed for {container}.{leaf} but the checkpoint has no such tensor")
                rules[leaf] = served[1] if served is not None else NONE
                parts.append(w)
            w = torch.cat(parts, dim=0)
            w = w.t() if getattr(mod, "is_transposed", False) else w
            _copy(p[e], w, f"{container}.{e}")
        bias = getattr(mod, f"{leaf}_bias", None)
        if isinstance(bias, torch.Tensor):
            value = loader.tensor(f"{container}.{leaf}_bias")
            if value is not None:
                _copy(bias, value, f"{container}.{leaf}_bias")
    if rules.get("gate_up_proj", NONE) is not NONE or rules.get("down_proj", NONE) is not NONE:
        STATE.experts[id(mod)] = (rules.get("gate_up_proj", NONE), rules.get("down_proj", NONE))


def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' eager expert loop (calibration.hooks.expert_loop) with each expert's inputs
    quantized as the MoE kernel does (one static scale per layer and side)."""
    from ..calibration.hooks import expert_loop

    rules = dict(zip(("gate_up", "down"), STATE.experts.get(id(self), (NONE, NONE))))

    def linear(e: int, side: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(quantize_activation(rules[side], x), w.float()).to(x.dtype)

    return expert_loop(self, hidden_states, top_k_index, top_k_weights, linear)


def attention_forward(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention after the FP8 KV cache's rounding (and FlashAttention 3's FP8
    query) when the module has KV scales: vLLM's Attention.forward quantizes the query with
    ``q_scale`` (``query_quant``, static per tensor) and the cache stores ``e4m3(k / k_scale)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    scales = STATE.kv.get(id(module))
    if scales is not None:
        q_scale, k_scale, v_scale = scales
        query = fp8_tensor(query.float(), q_scale).to(query.dtype)
        key, value = kv_fp8(key, k_scale), kv_fp8(value, v_scale)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register() -> None:
    """Make :data:`IMPL` a valid ``attn_implementation`` / ``experts_implementation`` (idempotent)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(IMPL, attention_forward)
    AttentionMaskInterface.register(IMPL, sdpa_mask)
    ALL_EXPERTS_FUNCTIONS.register(IMPL, experts_forward)

