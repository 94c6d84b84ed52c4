"""Helpers shared by the kernel tests: test weights, tie tables, byte-exact comparison."""

from __future__ import annotations

import torch


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def weight(shape, dtype=torch.bfloat16, seed: int = 0) -> torch.Tensor:
    """A CPU test weight ``[N, K]``: rows and columns of very different magnitudes (so a wrong
    row/block-to-scale mapping fails), one all-zero row, and some -0.0 entries."""
    g = torch.Generator().manual_seed(seed)
    n, k = shape
    w = torch.randn(n, k, generator=g)
    w *= torch.exp2(torch.randint(-8, 5, (n, 1), generator=g).float())
    w *= torch.exp2(torch.randint(-3, 3, (1, k), generator=g).float())
    if n > 2:
        w[n // 3] = 0.0
    w.view(-1)[::7] = -0.0
    return w.to(dtype)


def e4m3_ties() -> torch.Tensor:
    """fp32: every positive finite e4m3 value, every midpoint between neighbours (the ties), and
    the fp32 values one ulp either side of each midpoint; sorted, all in [0, 448]."""
    values = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (values[:-1] + values[1:]) / 2  # exact in fp32
    inf = torch.tensor(float("inf"))
    around = torch.cat([mids, torch.nextafter(mids, inf), torch.nextafter(mids, -inf), values])
    return around.unique()


def around(values: torch.Tensor, scale: float, ulps: int = 2) -> torch.Tensor:
    """fp32 ``fl(values * scale)`` and its neighbours up to `ulps` ulps away: inputs whose quotient
    by `scale` lands on or next to the given values, where an inexact division shows."""
    x = (values.double() * scale).float()
    out, up, down = [x], x, x
    for _ in range(ulps):
        up, down = torch.nextafter(up, torch.tensor(float("inf"))), torch.nextafter(down, torch.tensor(-float("inf")))
        out += [up, down]
    return torch.cat(out)


def pad_rows(values: torch.Tensor, k: int, first: float) -> torch.Tensor:
    """Lay 1-D `values` out as ``[rows, k]`` with column 0 of every row set to `first` (so each
    row's amax is known), padding the tail with zeros."""
    per_row = k - 1
    rows = -(-values.numel() // per_row)
    body = torch.zeros(rows * per_row)
    body[: values.numel()] = values
    return torch.cat([torch.full((rows, 1), first), body.reshape(rows, per_row)], dim=1)


def assert_same(out: dict, ref: dict, what: str = "") -> None:
    """Same keys in the same order and, per tensor, the same dtype, shape (0-d stays 0-d) and bytes
    (so -0.0 != +0.0). Compares on the kernel's device; reports the first differing element."""
    assert list(out) == list(ref), f"{what}: keys {list(out)} != {list(ref)}"
    for key, r in ref.items():
        o = out[key]
        assert o.dtype == r.dtype, f"{what}[{key}]: dtype {o.dtype} != {r.dtype}"
        assert tuple(o.shape) == tuple(r.shape), f"{what}[{key}]: shape {tuple(o.shape)} != {tuple(r.shape)}"
        ob = o.detach().contiguous().reshape(-1).view(torch.uint8)
        rb = r.detach().to(o.device).contiguous().reshape(-1).view(torch.uint8)
        bad = (ob != rb).nonzero()
        if bad.numel():
            i = bad[0].item() // r.element_size()
            fo, fr = o.detach().cpu().reshape(-1)[i : i + 1], r.detach().cpu().reshape(-1)[i : i + 1]
            raise AssertionError(
                f"{what}[{key}]: {bad.numel()} byte(s) differ; first at element {i}: "
                f"kernel {fo.float().item()!r} {_bytes(fo).tolist()} vs reference {fr.float().item()!r} {_bytes(fr).tolist()}"
            )


# E2M1 rounding boundaries (ties) and a few values between them, as magnitudes.
E2M1_TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_POINTS = (0.0, 0.1, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 4.5, 5.5, 6.0)


def signed(values: torch.Tensor) -> torch.Tensor:
    """`values` followed by their negatives (so -0.0 appears when 0.0 does)."""
    return torch.cat([values, -values])


def reference(scheme, w: torch.Tensor, global_amax: torch.Tensor | None = None, channel_weights: torch.Tensor | None = None) -> dict:
    """``scheme.quantize`` run on the CPU: the specification the kernels must equal.

    Not on the GPU: there torch divides a tensor by a Python scalar (``amax / 448`` in
    ``numerics.scale_from_amax``, ``gamax / 2688`` in ``nvfp4.global_scale``) as a multiplication by
    the rounded reciprocal, which can be one ulp off the exact quotient the CPU (and the kernels)
    compute.
    """
    g = None if global_amax is None else global_amax.detach().cpu()
    if channel_weights is not None:  # a searched scheme's activation weights
        return scheme.quantize(w.detach().cpu(), g, channel_weights.detach().cpu())
    return scheme.quantize(w.detach().cpu(), g)


def channel_weights(k: int, seed: int, device) -> torch.Tensor:
    """Weights like a calibration's E[x_j^2]: a wide range, exact zeros, one massive channel."""
    g = torch.Generator().manual_seed(seed)
    cw = torch.exp2(torch.randn(k, generator=g) * 6)
    cw[torch.rand(k, generator=g) < 0.1] = 0.0
    cw[k // 3] = 3e7
    return cw.to(device)
