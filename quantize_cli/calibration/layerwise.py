"""GPTQ and smoothing inside the layer-streamed forward, one decoder layer at a time.

For each block, once :mod:`.forward` has loaded it (weights of this block only, on the device):

    1. statistics pass: every batch through the block with :class:`.hessian.BlockStats` on the
       Linear inputs (and the inputs of the modules the smoothing search inspects); the outputs
       are dropped
    2. smoothing (``--smooth``): scales searched per mapping on the original weights, then folded
       into the source tensors (:class:`.smooth.Fold`); the block runs with the new tensors and
       the Hessians follow (``H / (s s^T)``: the balance inputs are ``x / s`` now)
    3. quantization of every Linear the plan quantizes in this block, fused members under their
       shared global amax: GPTQ (:mod:`.gptq`, members that read the same input solved as one) or
       round to nearest; the block's weights become the dequantized values
    4. (:mod:`.forward`) the recorded pass: input amax and K/V of the quantized block, whose
       outputs are the next block's inputs: later layers see the quantization of earlier ones

Memory: one block's weights, its Hessians (one per distinct input, fp32 ``[K, K]``), on the CPU
GPTQ's working copies of a row slice sized from ``--memory-budget`` (:func:`.gptq.slice_rows`), and with
``--smooth`` the inspected modules' inputs over the calibration tokens; nothing else grows with
the depth. What changes the checkpoint goes to a :class:`.weights_file.WeightsWriter`, one file
per block.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..errors import CalibrationError
from . import gptq, hooks, smooth
from .fake_quant import activation_quant
from .grid import fixed_grid
from .hessian import BlockStats


@dataclass(frozen=True)
class Target:
    """A Linear the plan quantizes: checkpoint module name, source weight, scheme, and the key of
    the fused group it shares a global amax with (its own name when it shares none)."""

    module: str
    info: object
    scheme: object
    group: str


class Layerwise:
    """The per-block transform (``transform`` of :func:`.forward.run`); see the module doc."""

    def __init__(self, targets: dict[str, Target], rounding: str, method: str, writer, device: torch.device,
                 num_heads: int | None, log=None):
        self.targets, self.rounding, self.method = targets, rounding, method
        self.writer, self.device, self.num_heads = writer, device, num_heads
        self.log = log or (lambda msg: None)
        self.memory_budget: int | None = None  # host bytes (--memory-budget; calibrate() sets it): GPTQ's row slices on the CPU
        self._roles: dict = {}
        self._tensors: dict = {}
        self.report: dict = {"gptq_error": 0.0, "rtn_error": 0.0, "modules": 0, "damp_raised": [], "no_tokens": [],
                             "smoothed": 0, "smooth_loss": 0.0, "smooth_loss_unsmoothed": 0.0, "seconds": 0.0,
                             "peak_hessian_bytes": 0}

    # -- the transform -------------------------------------------------------------------------
    def __call__(self, sk, index: int, block: torch.nn.Module, path: str, run_block) -> None:
        t0 = time.perf_counter()
        self._roles = sk.roles
        prefix = sk.prefix + path
        mine = {n: t for n, t in self.targets.items() if n.startswith(prefix + ".")}
        maps = smooth.mappings(block, self.method, self.num_heads) if self.method != "none" else []
        if not mine and not maps:
            self.writer.flush()
            return
        stats = BlockStats(hessian=self.rounding == "gptq", channels=bool(maps))
        caps, handles = smooth.attach_captures(block, maps)
        with hooks.active(stats):
            handles += hooks.attach(stats, block, prefix, sk.roles)
            try:
                run_block()
            finally:
                hooks.detach(handles)
                stats.release()
        self.report["peak_hessian_bytes"] = max(self.report["peak_hessian_bytes"], sum(
            s.hessian.numel() * 4 for s in stats.inputs.values() if s.hessian is not None))
        replaced = self._smooth(block, prefix, maps, caps, stats, mine) if maps else {}
        del caps
        self._quantize(sk, block, prefix, mine, stats, replaced)
        self.writer.flush()
        self.report["seconds"] += time.perf_counter() - t0

    # -- smoothing -----------------------------------------------------------------------------
    def _smooth(self, block, prefix: str, maps, caps, stats: BlockStats, mine: dict) -> dict[str, torch.Tensor]:
        """Search every mapping on the original weights, fold them all, update block and Hessians."""
        with smooth.search_precision(block, caps, self.device):
            chosen = self._search(block, prefix, maps, caps, stats, mine)
        fold, done = smooth.Fold(block, prefix, self._read), set()
        for m, s in chosen:
            eff = fold.add(m, s)
            for b in m.balance:  # the balance inputs are x / eff now: so are their Hessians
                key = stats.key.get(f"{prefix}.{b}")
                st = stats.inputs.get(key) if key else None
                if st is not None and st.hessian is not None and key not in done:
                    e = eff.to(st.hessian.device)
                    st.hessian.div_(e[:, None] * e[None, :])
                    done.add(key)
        self.report["smoothed"] += len(chosen)
        new = fold.tensors()
        for name, t in new.items():
            self.writer.add_replaced(name, t)
            self._set(block, prefix, name, t)
        return new

    def _search(self, block, prefix: str, maps, caps, stats: BlockStats, mine: dict) -> list:
        """(mapping, scales) for every mapping with tokens and something quantized behind it."""
        chosen = []
        for m in maps:
            st = stats.of(f"{prefix}.{m.balance[0]}")
            if st is None or st.tokens == 0 or self._touches_kept(block, prefix, m, mine):
                continue
            balance = [self._balance(block, prefix, b, mine) for b in m.balance]
            scheme = next((b.scheme for b in balance if b.scheme is not None), None)
            if scheme is None:
                continue  # nothing quantized behind this op: scaling cannot help
            search = smooth.Search(m, block, caps[m.inspect], balance, activation_quant(scheme), st.amax)
            s, info = smooth.choose(self.method, search, st.mean_abs(), st.amax)
            chosen.append((m, s))
            if "loss" in info:
                self.report["smooth_loss"] += info["loss"]
                self.report["smooth_loss_unsmoothed"] += info["loss_unsmoothed"]
        return chosen

    @staticmethod
    def _touches_kept(block, prefix: str, m, mine: dict) -> bool:
        """Would mapping `m` rewrite a Linear that is not quantized (``--exclude``, a recipe's kept
        layer)? Its scales fold into the balance Linears' columns and out of a Linear prev's rows; a
        kept module must keep the source bytes the card and ``exclude_modules`` promise (issue 35)."""
        kept = [b for b in m.balance if f"{prefix}.{b}" not in mine]
        if isinstance(smooth._get(block, m.prev), torch.nn.Linear) and f"{prefix}.{m.prev}" not in mine:
            kept.append(m.prev)
        return bool(kept)

    def _balance(self, block, prefix: str, rel: str, mine: dict) -> smooth.Balance:
        name = f"{prefix}.{rel}"
        target = mine.get(name)
        w = self._read(f"{name}.weight").to(self.device) if target is not None else smooth._get(block, rel).weight.detach()
        return smooth.Balance(smooth._get(block, rel), w, target.scheme if target else None, target.group if target else None)

    # -- quantization --------------------------------------------------------------------------
    def _quantize(self, sk, block, prefix: str, mine: dict, stats: BlockStats, replaced: dict) -> None:
        weights = {n: (replaced.get(f"{n}.weight") if f"{n}.weight" in replaced else self._read_target(t)).to(self.device)
                   for n, t in mine.items()}
        gamax: dict[str, torch.Tensor] = {}
        for n, t in mine.items():
            if t.scheme.shares_global_amax:
                a = t.scheme.global_amax(weights[n])
                gamax[t.group] = a if t.group not in gamax else torch.maximum(gamax[t.group], a)
        solved: set[str] = set()
        for n, t in mine.items():
            if n in solved:
                continue
            st = stats.of(n) if self.rounding == "gptq" else None
            members = [m for m, u in mine.items() if m not in solved and u.scheme == t.scheme
                       and (st is None or stats.key.get(m) == stats.key.get(n))] if st is not None else [n]
            grids = [fixed_grid(mine[m].scheme, weights[m], gamax.get(mine[m].group), _searched(mine[m].scheme, st))
                     for m in members]
            if st is None or st.hessian is None:
                if self.rounding == "gptq":
                    self.report["no_tokens"].append(n)
                values = [mine[m].scheme.dequantize(g.out).float() for m, g in zip(members, grids)]
            else:
                rows = gptq.slice_rows(st.hessian.shape[0], self.memory_budget) if self.device.type == "cpu" else None
                sol = _solve(members, torch.cat([weights[m] for m in members]), st.mean_hessian(), grids, rows)
                values = list(torch.split(sol.values, [g.codes.shape[0] for g in grids]))
                self.report["gptq_error"] += sol.error
                self.report["rtn_error"] += sol.rtn_error
                if sol.damp != gptq.DAMP:
                    self.report["damp_raised"].append(n)
                for m, g in zip(members, grids):
                    self.writer.add_quantized(m, g.outputs())
            for m, v in zip(members, values):
                self._set(block, prefix, f"{m}.weight", v)
                solved.add(m)
                self.report["modules"] += 1

    # -- tensors -------------------------------------------------------------------------------
    def _read(self, name: str) -> torch.Tensor:
        """A source tensor by checkpoint name (KeyError: the checkpoint has none)."""
        from ..checkpoint.safetensors_io import read_tensor

        target = self.targets.get(name.rpartition(".")[0])
        if target is not None and name.endswith(".weight"):
            return self._read_target(target)
        info = self._tensors[name]
        return read_tensor(info)

    @staticmethod
    def _read_target(t: Target) -> torch.Tensor:
        from ..modules.experts import read_virtual

        return read_virtual(t.info)

    def bind(self, tensors: dict) -> "Layerwise":
        """The source's tensors (norm weights and biases are read from them)."""
        self._tensors = tensors
        return self

    def _set(self, block, prefix: str, name: str, value: torch.Tensor) -> None:
        """Give the block's parameter for checkpoint tensor `name` the value `value` (cast to its dtype)."""
        rel = name[len(prefix) + 1 :]
        module_path, _, leaf = rel.rpartition(".")
        mod = smooth._get(block, module_path)
        p = getattr(mod, leaf, None) if mod is not None else None
        if isinstance(p, torch.Tensor):
            with torch.no_grad():
                p.copy_(value.to(device=p.device, dtype=p.dtype).reshape(p.shape))
            return
        _set_expert(block, module_path, leaf, value, self._roles)


def _solve(members: list[str], w: torch.Tensor, h: torch.Tensor, grids, rows: int | None) -> gptq.Solution:
    """GPTQ of the fused `members` (`w` in the source dtype: the solver takes fp32 copies of a row
    slice at a time); a Hessian it cannot solve is a one-line error naming them."""
    try:
        return gptq.solve(w, h, grids, rows=rows)
    except gptq.HessianError as e:
        names = ", ".join(members)
        raise CalibrationError(f"{names}: --rounding gptq cannot round this module: {e}; check the source's weights "
                               f"for overflowing values, or keep the module unquantized with --exclude {members[0]}") from None


def _searched(scheme, st):
    """--scale-search mse: the search weighted by the inputs' ``E[x_j^2]``, the Hessian's diagonal (the
    activation-weighted search of the nearest path, on the inputs GPTQ sees); None: the scheme's own."""
    if getattr(scheme, "scale_search", "none") == "none" or st is None or st.hessian is None:
        return None
    energy = torch.diagonal(st.mean_hessian()).float().clone()
    return lambda w, global_amax=None: scheme.quantize(w, global_amax, channel_weights=energy)


def _set_expert(block, module_path: str, leaf: str, value: torch.Tensor, roles: dict) -> None:
    """A per-expert checkpoint weight (``...experts.<e>.<role>.weight``) into transformers' fused
    3-D parameters (``gate_up_proj [E, 2I, H]`` rows gate then up, ``down_proj [E, H, I]``)."""
    container_path, e, role = module_path.rsplit(".", 2)
    owner = smooth._get(block, container_path)
    if owner is None or leaf != "weight":
        raise KeyError(f"{module_path}.{leaf}: no parameter of the block holds it")
    which = {v: k for k, v in roles.items()}.get(role)
    transposed = getattr(owner, "is_transposed", False)
    with torch.no_grad():
        if which in ("gate", "up"):
            p = owner.gate_up_proj[int(e)]
            half = p.shape[1 if transposed else 0] // 2
            sl = slice(0, half) if which == "gate" else slice(half, 2 * half)
            dst = p[:, sl] if transposed else p[sl]
            dst.copy_((value.t() if transposed else value).to(p.dtype))
        elif which == "down":
            p = owner.down_proj[int(e)]
            p.copy_((value.t() if transposed else value).to(p.dtype))
        else:
            raise KeyError(f"{module_path}.{leaf}: not an expert weight this model fuses")


__all__ = ["Layerwise", "Target"]
