"""The compute stage: runs a task's steps (:mod:`~quantize_cli.run.schedule`) on the device.

It owns the numerics of a run: amax passes, held groups and their shared amax, quantization
(the Triton kernels or the torch reference, through `quantize_fn`), calibrated input scales,
packing, the NaN/Inf checks and the error statistics for --report. It neither decides what to
read (the schedule did) nor performs I/O: data comes from the read stage (``fetch``/``release``)
and outputs go to the write stage (``write(name, tensor, byte offset)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .finite import check_finite, finite_flag, raise_non_finite, refuse_non_finite_copy
from .pipeline import Read, Timers
from ..plan.build import Member, Plan, Task
from .stats import RunStats
from .schedule import Amax, Const, Copy, Hold, PackExperts, PackGroup, Quantize, Share, Step
from ..schemes.numerics import error_fields, square_sums
from ..schemes.rtn_baseline import error_reduction, searched_baseline

# A fused-group member under this fraction of the group's shared amax quantizes to (almost) zero:
# 448 x 1e-4 is under e4m3's smallest normal step (2^-6), so its values are subnormal or zero.
DROWNED = 1e-4


@dataclass
class ErrorStats:
    """Running sums for a quantized tensor's error (||ref||^2, ||ref - deq||^2 and, with a searched
    scale, ||ref - rtn||^2 of the round-to-nearest baseline)."""

    signal: float = 0.0
    noise: float = 0.0
    noise_rtn: float | None = None

    def add(self, ref: torch.Tensor, deq: torch.Tensor, rtn: torch.Tensor | None = None) -> None:
        sums = square_sums(ref, deq, *([] if rtn is None else [rtn]))
        self.signal += sums[0]
        self.noise += sums[1]
        if rtn is not None:
            self.noise_rtn = (self.noise_rtn or 0.0) + sums[2]

    def summary(self) -> dict:
        out = error_fields(self.signal, self.noise)
        if self.noise_rtn is not None:
            out.update(error_reduction(self.signal, self.noise, self.noise_rtn))
        return out


@dataclass
class _TaskState:
    """What a task's steps hand each other: per-member running amax and held data, the shared
    amax, the outputs collected for packing, and the NaN flags checked once at the task's end."""

    amax: dict = field(default_factory=dict)  # slot -> 0-d fp32
    held: dict = field(default_factory=dict)  # slot -> (data, its Read)
    shared: torch.Tensor | None = None
    collected: list = field(default_factory=list)  # (member, plain outputs)
    finite: list = field(default_factory=list)  # (source, 0-d bool)


class ComputeStage:
    """Runs steps for `plan` on `device`.

    Args:
        fetch: ``Read -> tensor`` (the read stage's data, already on `device`); release(read)
            returns its bytes to the read budget.
        write: ``(output name, tensor, byte offset)`` to the write stage.
        quantize_fn: ``(scheme, w, global_amax) -> dict`` (the Triton kernels), default the reference;
            with the plan's search weights it is also given ``channel_weights=`` (fp32 ``[K]``).
        resolve: where a NaN scan reads a tensor (the --low-disk resolver), or None.
    """

    def __init__(self, plan: Plan, device: torch.device, fetch: Callable[[Read], torch.Tensor], release: Callable[[Read], None],
                 write: Callable, quantize_fn=None, measure_error: bool = False, progress: Callable[[int], None] | None = None,
                 resolve=None, timers: Timers | None = None):
        self.plan = plan
        self.device = device
        self.fetch = fetch
        self.release = release
        self.write = write
        self.quantize_fn = quantize_fn or (lambda scheme, w, g, **kw: scheme.quantize(w, g, **kw))
        self.measure_error = measure_error
        self.progress = progress or (lambda n: None)
        self.resolve = resolve
        self.timers = timers or Timers()
        self.stats = RunStats()
        self._unchecked: _TaskState | None = None  # the task whose finite flags are not read yet
        self._handlers = {Copy: self._copy, Const: self._const, Amax: self._amax, Hold: self._hold, Share: self._share,
                          Quantize: self._quantize, PackGroup: self._pack_group, PackExperts: self._pack_experts}

    def run_task(self, task: Task, steps: list[Step]) -> None:
        """Run `steps` (the schedule of `task`); raise NumericsError if any scale of the task before
        it came out NaN/Inf (:meth:`finish` checks the last task).

        The check is one task behind so that the host never waits for the device between tasks:
        reading its flag syncs, and the next task's reads and kernels are queued first. A refusal
        discards the work folder (bad data is not resumable), so the earlier task's journal line
        cannot outlive it."""
        state = _TaskState()
        scheme = task.scheme or self.plan.scheme
        for step in steps:
            self._handlers[type(step)](step, task, scheme, state)
        earlier, self._unchecked = self._unchecked, state
        if earlier is not None:
            self._check_finite(earlier)

    def finish(self) -> None:
        """The last task's NaN/Inf check (see :meth:`run_task`)."""
        earlier, self._unchecked = self._unchecked, None
        if earlier is not None:
            self._check_finite(earlier)

    # -- steps -------------------------------------------------------------------------------
    def _copy(self, step: Copy, task, scheme, state) -> None:
        req, info = step.read, step.read.info
        data = self.fetch(req)
        refuse_non_finite_copy(info, data)
        if req.raw:
            self.write(info.name, data, req.start)
            self._consumed(req.count)
        else:  # a whole transposed expert view
            self.write(info.name, data, 0)
            self._consumed(info.nbytes)
        self.release(req)

    def _const(self, step, task: Task, scheme, state) -> None:
        values = self.plan.act_scales.kv_tensors()  # type: ignore[union-attr]
        for name in task.outputs:
            self.write(name, values[name], 0)

    def _amax(self, step: Amax, task, scheme, state) -> None:
        self._fold_amax(state, step.slot, scheme, self.fetch(step.read))
        self.release(step.read)

    def _hold(self, step: Hold, task, scheme, state) -> None:
        data = self.fetch(step.read)
        state.held[step.slot] = data
        self._fold_amax(state, step.slot, scheme, data)

    @staticmethod
    def _fold_amax(state: _TaskState, slot: int, scheme, w: torch.Tensor) -> None:
        a = scheme.global_amax(w)
        prev = state.amax.get(slot)
        state.amax[slot] = a if prev is None else torch.maximum(prev, a)

    def _share(self, step: Share, task: Task, scheme, state) -> None:
        members = [task.members[k] for k in step.slots]
        amaxes = [state.amax.pop(k) for k in step.slots]
        for m, a in zip(members, amaxes):
            if not torch.isfinite(a).item():
                raise_non_finite(m.source, resolve=self.resolve)
        gamax = torch.stack([a.reshape(()) for a in amaxes]).amax()
        if len(members) > 1:
            self._warn_drowned(members, amaxes, gamax, scheme)
        state.shared = gamax

    def _quantize(self, step: Quantize, task, scheme, state) -> None:
        m, req = step.member, step.read
        w = state.held.pop(step.slot) if step.held else self.fetch(req)
        with self.timers.time("compute"):
            gamax = state.shared if step.shared else None
            # --rounding gptq / --smooth: the tensors the calibration forward chose (calibration/weights_file.py)
            pre = self.plan.weights.rows(m.module, req.start, req.count, m.source.shape[0]) if self.plan.weights is not None else None
            if pre is not None:
                q = {k: t.to(self.device) for k, t in pre.items()}
            else:
                cw = self.plan.search_weights.of(m.module) if self.plan.search_weights is not None else None  # E[x_j^2]
                q = self.quantize_fn(scheme, w, gamax) if cw is None else self.quantize_fn(scheme, w, gamax, channel_weights=cw)
            out = self._calibrated(m.module, q)
            if req.start == 0:  # shape-only outputs (compressed-tensors' weight_shape): once per tensor, at offset 0
                out.update(scheme.shape_outputs((m.source.shape[0], w.shape[1])))
            if step.collect:  # whole members: refuse NaN at once (the packing would carry it)
                check_finite(m.source, out, self.resolve)
            else:
                state.finite.append((m.source, finite_flag(out)))
        if step.collect:
            state.collected.append((m, out))
        else:
            self._write_rows(m, req, out)
        if self.measure_error:
            self.stats.errors.setdefault(m.module, ErrorStats()).add(w.float(), scheme.dequantize(out), searched_baseline(scheme, w, out))
        self._consumed(req.nbytes)
        self.release(req)

    def _write_rows(self, m: Member, req: Read, out: dict) -> None:
        for suffix, t in out.items():
            name = f"{m.module}.{suffix}"
            if t.dim() == 0:
                if req.start == 0:
                    self.write(name, t, 0)
                continue
            # Row-indexed outputs hold a fixed number of bytes per source row (chunks start at row_align multiples).
            self.write(name, t, req.start * self.plan.outputs[name].nbytes // m.source.shape[0])

    def _pack_group(self, step, task, scheme, state) -> None:
        plain = {m.module: out for m, out in state.collected}
        state.collected = []
        for module, tensors in self.plan.packing.pack_group(plain).items():  # type: ignore[union-attr]
            for suffix, t in tensors.items():
                self.write(f"{module}.{suffix}", t, 0)

    def _pack_experts(self, step: PackExperts, task: Task, scheme, state) -> None:
        collected, state.collected = state.collected, []
        assert len(collected) == 3 * step.count, (task.group, len(collected))  # gate, up, down per expert
        for m, q in collected:
            for suffix, t in q.items():
                if suffix != "weight" and t is not None:
                    self.write(f"{m.module}.{suffix}", t, 0)
        experts = [{"gate": collected[i][1], "up": collected[i + 1][1], "down": collected[i + 2][1]} for i in range(0, len(collected), 3)]
        held = sum(t.numel() * t.element_size() for x in experts for q in x.values() for t in q.values() if t is not None)
        self.stats.peak_held = max(self.stats.peak_held, held)
        n = len(task.members) // 3
        for name, t in self.plan.packing.pack_layer(task.group, experts).items():  # type: ignore[union-attr]
            assert t.shape[0] == step.count, (name, tuple(t.shape))  # stacked on dim 0, one row per expert
            self.write(name, t, step.first * (self.plan.outputs[name].nbytes // n))

    # -- helpers -----------------------------------------------------------------------------
    def _calibrated(self, module: str, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The plan's calibrated static activation tensors for `module` in place of the scheme's
        constants (the scheme says which tensors and how: ModelOpt and compressed-tensors differ)."""
        scales = self.plan.act_scales
        static = out.get("input_scale") is not None or out.get("input_global_scale") is not None
        if scales is not None and static and module in scales.input_amax:
            out.update(self.plan.scheme_of(module).calibrated_inputs(scales.input_amax[module], out))
        return out

    def _check_finite(self, state: _TaskState) -> None:
        """One device sync per task: were all of its scales finite? (NaN/Inf propagate into them.)"""
        if state.finite:
            ok = torch.stack([flag for _, flag in state.finite]).all().item()
            if not ok:
                for info, _ in state.finite:
                    raise_non_finite(info, must_find=False, resolve=self.resolve)

    def _warn_drowned(self, members, amaxes, gamax, scheme) -> None:
        """A member whose largest value is under DROWNED x the group's shared amax keeps (almost)
        nothing after quantization (its values fall under the format's smallest step): say so, as
        ``verify --source`` would reject it."""
        top = float(gamax)
        for m, a in zip(members, amaxes):
            amax = float(a)
            if top > 0 and 0 < amax < DROWNED * top:
                self.stats.warnings.append(
                    f"{m.source.name}: its largest value {amax:.3g} is {top / amax:.3g}x below the scale it shares with its fused group "
                    f"(amax {top:.3g}); after {scheme.algo} it is (almost) all zero. Check the source weights; verify --source will fail it"
                )

    def _consumed(self, n: int) -> None:
        self.stats.bytes_read += n
        self.progress(n)


__all__ = ["ComputeStage", "RunStats", "ErrorStats", "DROWNED"]
