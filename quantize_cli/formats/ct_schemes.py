"""compressed-tensors weight math: pure torch references equal to llm-compressor 0.14's output.

llm-compressor (``model_free_ptq`` on the CPU) computes every scale in the weight's own dtype
(bf16 for a bf16 checkpoint) and stores it in that dtype, which differs from ModelOpt's fp32
math (``schemes/``). For a weight ``w [N, K]`` of dtype ``dt``:

    FP8 (tensor / channel / 128x128 block)   INT8 (channel)
        s = dt(amax / 448), 0 -> eps(dt)          s = dt(amax / 127.5), 0 -> eps(dt)
        q = e4m3(clamp(dt(w / s), +-448))         q = int8(round(clamp(dt(w / s), -128, 127)))

    NVFP4 (16-groups, fp32 global)
        g  = fp32(dt(dt(1 / max(gamax, tiny)) * 2688))      gamax: max |w| over the fused group
        s  = e4m3(clamp(g * dt(group_amax / 6), +-448)), 0 -> 0.125   (stored e4m3 [N, K/16])
        q  = E2M1(clamp(w / (float(s) / g), +-6))           ties to even; sign bit when < 0
        packed byte j = code(2j) | code(2j+1) << 4

``dt(x / y)`` is one division rounded to ``dt`` (bf16 / bf16 in torch), exactly what
compressed-tensors' CPU path does; its GPU path (Triton, fp32 quotient) gives slightly different
bytes (docs/formats.md). Every division here divides by a tensor on the same device, so CUDA
gives the CPU's bytes (CUDA turns a division by a Python number into a reciprocal multiply).

Output names and shapes follow compressed-tensors: ``weight`` + ``weight_scale`` ([1], [N, 1] or
[ceil(N/128), ceil(K/128)], dtype of the source) for FP8/INT8; ``weight_packed`` +
``weight_scale`` + ``weight_global_scale`` for NVFP4; static activation scales as
``input_scale`` (FP8) and ``input_global_scale`` (NVFP4). Per-tensor values are returned 0-d
(so row chunks concatenate) and declared ``[1]`` in :meth:`outputs`: the bytes are the same.

torch is imported inside the numeric functions: the classes describe their outputs without it
(planning, ``check`` and ``--dry-run`` import no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..algorithms import ALGORITHMS, E2M1_MAX, E4M3_MAX, FP8_BLOCK, NVFP4_GROUP
from ..schemes.base import Scheme, Spec, k_group_problem
from .static_scales import static_input_value

if TYPE_CHECKING:
    import torch

BLOCK = FP8_BLOCK
INT8_HALF_RANGE = 127.5  # compressed-tensors: (qmax - qmin) / 2 = (127 - -128) / 2
NVFP4_ZERO_SCALE = 0.125  # compressed-tensors replaces a zero e4m3 group scale by e4m3's eps
SCALE_DTYPES = ("BF16", "F16", "F32")  # source dtypes whose scales keep that dtype (others: bf16)


def _t(value: float, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A 0-d tensor on `like`'s device (a true division there, not a reciprocal multiply)."""
    import torch

    return torch.tensor(value, dtype=dtype or like.dtype, device=like.device)


def ct_scale(amax: torch.Tensor, half_range: float) -> torch.Tensor:
    """``amax / half_range`` in amax's dtype; zero -> that dtype's eps (compressed-tensors' rule)."""
    import torch

    scale = amax / _t(half_range, amax)
    return torch.where(scale == 0, _t(torch.finfo(scale.dtype).eps, scale), scale)


def _rows_amax(w: torch.Tensor) -> torch.Tensor:
    from ..schemes.numerics import abs_max

    return abs_max(w, (1,)).unsqueeze(1)


def _pad_blocks(w: torch.Tensor) -> torch.Tensor:
    import torch

    n, k = w.shape
    return torch.nn.functional.pad(w, (0, -k % BLOCK, 0, -n % BLOCK))


@dataclass(frozen=True)
class CtScheme(Scheme):
    """A compressed-tensors scheme: `preset` names llm-compressor's preset (``FP8_BLOCK`` ...).

    The scale dtype is the source weight's dtype, so :meth:`outputs` needs it: the plan passes
    the source dtype through :meth:`with_dtype` (bf16 by default)."""

    preset: str = ""
    source_dtype: str = "BF16"
    # what vLLM 0.33 does with it (formats/vllm_ct.py): its Linear scheme, the scheme's static-input
    # flag (None: the scheme has no such flag) and its MoE method
    vllm_linear: str = ""
    vllm_static: bool | None = None
    vllm_moe: str = ""

    def outputs_for(self, info):
        """The outputs of a source tensor: scales take its dtype (bf16, fp16 or fp32)."""
        from dataclasses import replace

        return replace(self, source_dtype=info.dtype if info.dtype in SCALE_DTYPES else "BF16").outputs(tuple(info.shape))

    def calibrated_inputs(self, amax: float, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """compressed-tensors' static activation parameters for a calibrated input `amax`, as
        llm-compressor derives them: FP8 ``input_scale = dt(amax / 448)`` in the weight's dtype (as its
        weight scales), NVFP4 ``input_global_scale = 2688 / amax`` in fp32."""
        import torch

        if "input_global_scale" in out:
            return {"input_global_scale": torch.tensor(ALGORITHMS[self.algo].activation_bound, dtype=torch.float32) / torch.tensor(amax, dtype=torch.float32)}
        like = out["input_scale"]
        return {"input_scale": ct_scale(torch.tensor(amax, dtype=torch.float32).to(like.dtype), E4M3_MAX).reshape(like.shape)}

    def _static_input(self, w: torch.Tensor, module: str | None = None) -> torch.Tensor:
        import torch

        return torch.tensor(static_input_value(self.algo), dtype=self._input_dtype(w))

    def _input_dtype(self, w: torch.Tensor) -> torch.dtype:
        return w.dtype


@dataclass(frozen=True)
class CtFp8(CtScheme):
    """FP8 e4m3 weights: ``granularity`` is ``tensor`` (FP8), ``channel`` (FP8_DYNAMIC) or ``block``."""

    granularity: str = "channel"

    def shape_problem(self, shape):
        problem = super().shape_problem(shape)
        if problem is None and self.granularity == "block":
            # vLLM needs K in 128-multiples per row-parallel part; llm-compressor 0.14 crashes on other K.
            # Out-features may be ragged (the last block is partial) except where block_n_problems says.
            problem = k_group_problem(shape, BLOCK, "128x128 blocks")
        return problem

    def outputs(self, shape):
        n, k = shape
        sshape = {"tensor": (1,), "channel": (n, 1), "block": (-(-n // BLOCK), -(-k // BLOCK))}[self.granularity]
        out: dict[str, Spec] = {"weight": ("F8_E4M3", (n, k)), "weight_scale": (self.source_dtype, sshape)}
        if self.static_input_scale is not None:
            out["input_scale"] = (self.source_dtype, (1,))
        return out

    def quantize(self, w, global_amax=None):
        import torch

        from ..schemes.numerics import abs_max

        lo, hi = _t(-E4M3_MAX, w), _t(E4M3_MAX, w)
        if self.granularity == "block":
            n, k = w.shape
            p = _pad_blocks(w)
            nb, kb = p.shape[0] // BLOCK, p.shape[1] // BLOCK
            blocks = p.reshape(nb, BLOCK, kb, BLOCK)
            scale = ct_scale(abs_max(blocks, (1, 3)), E4M3_MAX)  # [nb, kb]
            q = (blocks / scale[:, None, :, None]).clamp_(lo, hi).to(torch.float8_e4m3fn)
            return {"weight": q.reshape(p.shape)[:n, :k].contiguous(), "weight_scale": scale}
        if self.granularity == "channel":
            scale = ct_scale(_rows_amax(w), E4M3_MAX)  # [N, 1]
        else:
            amax = abs_max(w) if global_amax is None else global_amax.to(w.device, w.dtype)
            scale = ct_scale(amax.reshape(()), E4M3_MAX)  # 0-d, written [1]
        out = {"weight": (w / scale).clamp_(lo, hi).to(torch.float8_e4m3fn), "weight_scale": scale}
        if self.static_input_scale is not None:
            out["input_scale"] = self._static_input(w)
        return out

    def dequantize(self, q):
        w, s = q["weight"].float(), q["weight_scale"].float()
        if self.granularity == "block":
            n, k = w.shape
            s = s.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
        return w * s.to(w.device)


@dataclass(frozen=True)
class CtInt8(CtScheme):
    """W8A8: int8 per-channel weights, scale = amax / 127.5 in the source dtype."""

    act_kind = "int8_token"  # W8A8: dynamic per-token int8 activations (ModelOpt's INT8 is W8A16)

    def outputs(self, shape):
        n, k = shape
        return {"weight": ("I8", (n, k)), "weight_scale": (self.source_dtype, (n, 1))}

    def quantize(self, w, global_amax=None):
        import torch

        scale = ct_scale(_rows_amax(w), INT8_HALF_RANGE)
        q = (w / scale).clamp_(_t(-128.0, w), _t(127.0, w)).round_().to(torch.int8)
        return {"weight": q, "weight_scale": scale}

    def dequantize(self, q):
        return q["weight"].float() * q["weight_scale"].float()


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """E2M1 magnitudes of fp32 `x` (already clamped to +-6), ties to even, as codes 0..7."""
    import torch

    a = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for t in (0.75, 1.75, 3.5):  # a tie goes up to the even code
        code += a >= t
    for t in (0.25, 1.25, 2.5, 5.0):  # a tie stays at the even code
        code += a > t
    return code


@dataclass(frozen=True)
class CtNvfp4(CtScheme):
    """NVFP4 (``input_global_scale`` when static) and NVFP4A16: packed E2M1, e4m3 group scales."""

    global_scale_key = "weight_global_scale"
    inverse_input_scale = True  # input_global_scale = 2688 / amax

    def shape_problem(self, shape):
        return super().shape_problem(shape) or k_group_problem(shape, NVFP4_GROUP, "NVFP4 groups")

    def outputs(self, shape):
        n, k = shape
        out: dict[str, Spec] = {
            "weight_packed": ("U8", (n, k // 2)),
            "weight_scale": ("F8_E4M3", (n, k // NVFP4_GROUP)),
            "weight_global_scale": ("F32", (1,)),
        }
        if self.static_input_scale is not None:
            out["input_global_scale"] = ("F32", (1,))
        return out

    def quantize(self, w, global_amax=None):
        import torch

        from ..schemes.numerics import abs_max, pack_nibbles

        n, k = w.shape
        gamax = (abs_max(w) if global_amax is None else global_amax.to(w.device)).to(w.dtype).reshape(())
        gamax = torch.clamp(gamax, min=torch.finfo(w.dtype).tiny)
        # compressed-tensors evaluates `2688 / amax` as torch does a Python number over a tensor:
        # reciprocal(amax) rounded to the source dtype, times 2688, rounded again
        g = torch.reciprocal(gamax) * _t(E4M3_MAX * E2M1_MAX, w)
        g = torch.nan_to_num(g, nan=1.0, posinf=1.0, neginf=1.0).float()
        groups = w.reshape(n, k // NVFP4_GROUP, NVFP4_GROUP)
        local = groups.abs().amax(dim=2) / _t(E2M1_MAX, w)  # [N, K/16] in the source dtype
        s = (g.reshape(1) * local).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()  # [1]: an fp32 product
        s = torch.where(s == 0, _t(NVFP4_ZERO_SCALE, s), s)
        x = (groups / (s / g)[:, :, None]).clamp_(-E2M1_MAX, E2M1_MAX).reshape(n, k)
        codes = e2m1_round(x) | ((x < 0).to(torch.uint8) << 3)  # -0.0 -> 0x0, a small negative -> 0x8
        out = {"weight_packed": pack_nibbles(codes), "weight_scale": s.to(torch.float8_e4m3fn), "weight_global_scale": g}
        if self.static_input_scale is not None:
            out["input_global_scale"] = torch.tensor(static_input_value(self.algo), dtype=torch.float32)
        return out

    def dequantize(self, q):
        from ..schemes.numerics import e2m1_values, unpack_nibbles

        vals = e2m1_values(unpack_nibbles(q["weight_packed"]))
        n, k = vals.shape
        s = q["weight_scale"].float() / q["weight_global_scale"].float().to(vals.device)
        return (vals.reshape(n, k // NVFP4_GROUP, NVFP4_GROUP) * s[:, :, None]).reshape(n, k)
