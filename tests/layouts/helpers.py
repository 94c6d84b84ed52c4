"""Shared pieces of the layout tests: golden inputs, synthetic weights, supported combinations."""

from __future__ import annotations

import torch

from quantize_cli.layouts import ALGOS, Layout, supported
from quantize_cli.schemes import SCHEMES

PACKED = (Layout.MARLIN, Layout.CUTLASS, Layout.FLASHINFER)
DENSE = [(lay, algo) for lay in PACKED for algo in ALGOS if supported(lay, algo) is None]
MOE = [(lay, algo) for lay in PACKED for algo in ALGOS if supported(lay, algo, moe=True) is None]
TORCH_DTYPE = {"I32": torch.int32, "U8": torch.uint8, "F8_E4M3": torch.float8_e4m3fn, "BF16": torch.bfloat16,
               "F16": torch.float16, "F32": torch.float32, "I8": torch.int8}


def inputs(case: dict[str, torch.Tensor], prefix: str = "input.") -> dict[str, torch.Tensor]:
    """``input.<name>`` tensors of a golden case, keyed by ``<name>``."""
    return {k[len(prefix):]: v for k, v in case.items() if k.startswith(prefix)}


def weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """bf16 ``[N, K]`` with rows and 16-groups of very different magnitude, a zero row, a zero
    group and a group so small that its NVFP4 scale is an e4m3 sub-normal."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    w *= torch.exp2(torch.randint(-6, 3, (n, 1), generator=g).float())
    w[n // 2] = 0
    w[0, :16] = 0
    if n > 1 and k >= 16:  # block amax 2e-5 of the global one: e4m3 block scale ~2^-6.8 (sub-normal)
        w[1, :16] *= 2e-5 * w.abs().amax() / w[1, :16].abs().amax()
    return w.to(torch.bfloat16)


def quantize(algo: str, n: int, k: int, seed: int = 0) -> dict[str, torch.Tensor]:
    return {k_: v for k_, v in SCHEMES[algo].quantize(weight(n, k, seed)).items() if v is not None}


def moe_plain(algo: str, e: int, i: int, h: int, seed: int = 0) -> tuple[dict, dict]:
    """Stacked plain experts as vLLM holds them: gate/up quantized as one fused group per expert."""
    scheme = SCHEMES[algo]
    w13: dict[str, list] = {}
    w2: dict[str, list] = {}
    for x in range(e):
        gate, up, down = (weight(r, c, seed + 10 * x + j) for j, (r, c) in enumerate(((i, h), (i, h), (h, i))))
        gamax = torch.maximum(scheme.global_amax(gate), scheme.global_amax(up))
        qg, qu, qd = scheme.quantize(gate, gamax), scheme.quantize(up, gamax), scheme.quantize(down)
        w13.setdefault("weight", []).append(torch.cat([qg["weight"], qu["weight"]]))
        w2.setdefault("weight", []).append(qd["weight"])
        if algo == "FP8_PB_WO":
            w13.setdefault("weight_scale", []).append(torch.cat([qg["weight_scale"], qu["weight_scale"]])[:, 0, :, 0])
            w2.setdefault("weight_scale", []).append(qd["weight_scale"][:, 0, :, 0])
        elif algo == "FP8":
            w13.setdefault("weight_scale", []).append(torch.stack([qg["weight_scale"], qu["weight_scale"]]))
            w2.setdefault("weight_scale", []).append(qd["weight_scale"])
        elif algo == "MXFP8":
            w13.setdefault("weight_scale", []).append(torch.cat([qg["weight_scale"], qu["weight_scale"]]))
            w2.setdefault("weight_scale", []).append(qd["weight_scale"])
        else:
            w13.setdefault("weight_scale", []).append(torch.cat([qg["weight_scale"], qu["weight_scale"]]))
            w13.setdefault("weight_scale_2", []).append(torch.stack([qg["weight_scale_2"], qu["weight_scale_2"]]))
            w2.setdefault("weight_scale", []).append(qd["weight_scale"])
            w2.setdefault("weight_scale_2", []).append(qd["weight_scale_2"])
    return {k: torch.stack(v) for k, v in w13.items()}, {k: torch.stack(v) for k, v in w2.items()}
