"""Fused 3-D MoE expert tensors, split into the per-expert 2-D weights ModelOpt writes.

Checkpoints store experts either per expert (``...experts.{e}.gate_proj.weight``) or fused in 3-D
tensors whose layout differs by architecture; the recipe declares it (design §5) and an
undeclared one is refused, never guessed. Supported layouts of ``gate_up`` tensors:

    gate_up              [E, 2I, H]  gate rows first, then up      (Qwen3-MoE, Mixtral in transformers 5)
    gate_up_t            [E, H, 2I]  gate columns first, then up   (Llama-4)
    gate_up_interleaved  [E, H, 2I]  gate and up columns alternate (gpt-oss)

and of ``down`` tensors: ``down`` ``[E, H, I]`` (already [out, in]) or ``down_t`` ``[E, I, H]``.
Every split part becomes a virtual tensor named as the per-expert checkpoint would name it
(``...experts.{e}.gate_proj.weight``). Row layouts map to contiguous byte ranges of the source
(a plain :class:`TensorInfo` with a shifted offset); transposed layouts are a
:class:`ViewedTensor` that reads the expert's slab and takes a column slice, transposed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..checkpoint.safetensors_header import FLOAT_SOURCE_DTYPES, TensorInfo, nbytes_of
from ..problems import EXPERT_LAYOUT, Problem

if TYPE_CHECKING:  # tensors are read only by the executor; planning needs no torch
    import torch

GATE_UP_LAYOUTS = ("gate_up", "gate_up_t", "gate_up_interleaved")
DOWN_LAYOUTS = ("down", "down_t")


@dataclass(frozen=True)
class ViewedTensor(TensorInfo):
    """A virtual ``[count, slab_rows]`` tensor: columns ``start::step`` of a slab, transposed.

    ``offset``/``path`` locate the slab (a contiguous ``slab_shape`` block); ``shape`` and
    ``nbytes`` describe the weight the view produces (``slab[:, cols].T``).
    """

    slab_shape: tuple[int, int] = (0, 0)
    start: int = 0
    step: int = 1

    @property
    def slab(self) -> TensorInfo:
        return TensorInfo(self.name, self.dtype, self.slab_shape, self.path, self.offset, nbytes_of(self.dtype, self.slab_shape))

    def apply(self, slab: torch.Tensor) -> torch.Tensor:
        """``[d1, d2]`` slab -> the ``[count, d1]`` weight."""
        count = self.shape[0]
        return slab[:, self.start : self.start + self.step * count : self.step].t().contiguous()


def is_fused_expert_tensor(info: TensorInfo) -> bool:
    """A 3-D floating tensor under an ``experts`` module (or named like one)."""
    return len(info.shape) == 3 and info.dtype in FLOAT_SOURCE_DTYPES and ".experts." in f".{info.name}."


def _slab(info: TensorInfo, e: int) -> TensorInfo:
    """Expert `e`'s contiguous ``[d1, d2]`` slab of a ``[E, d1, d2]`` tensor."""
    _, d1, d2 = info.shape
    size = nbytes_of(info.dtype, (d1, d2))
    return TensorInfo(f"{info.name}[{e}]", info.dtype, (d1, d2), info.path, info.offset + e * size, size)


def _rows(slab: TensorInfo, name: str, start: int, count: int) -> TensorInfo:
    """Rows ``[start, start+count)`` of a 2-D slab as their own contiguous tensor."""
    row = nbytes_of(slab.dtype, (1, slab.shape[1]))
    return TensorInfo(name, slab.dtype, (count, slab.shape[1]), slab.path, slab.offset + start * row, count * row)


def _cols_t(slab: TensorInfo, name: str, start: int, step: int, count: int) -> ViewedTensor:
    shape = (count, slab.shape[0])
    return ViewedTensor(name, slab.dtype, shape, slab.path, slab.offset, nbytes_of(slab.dtype, shape), slab.shape, start, step)


def split(info: TensorInfo, layout: str, names: dict[str, str]) -> list[TensorInfo]:
    """Per-expert virtual tensors of fused tensor `info`, named ``<container>.<e>.<proj>.weight``.

    Args:
        layout: one of :data:`GATE_UP_LAYOUTS` or :data:`DOWN_LAYOUTS`.
        names: per-expert module names, e.g. ``{"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}``.

    Example: ``mlp.experts.gate_up_proj`` BF16[4, 2*I, H] with layout ``gate_up`` gives 8 tensors
    ``mlp.experts.{0..3}.{gate,up}_proj.weight`` of shape ``[I, H]``.
    """
    container = info.name.rpartition(".")[0]
    experts, d1, d2 = info.shape
    out: list[TensorInfo] = []
    for e in range(experts):
        slab = _slab(info, e)
        base = f"{container}.{e}"
        gate, up, down = (f"{base}.{names[k]}.weight" for k in ("gate", "up", "down"))
        if layout == "gate_up":
            out += [_rows(slab, gate, 0, d1 // 2), _rows(slab, up, d1 // 2, d1 // 2)]
        elif layout == "gate_up_t":
            out += [_cols_t(slab, gate, 0, 1, d2 // 2), _cols_t(slab, up, d2 // 2, 1, d2 // 2)]
        elif layout == "gate_up_interleaved":
            out += [_cols_t(slab, gate, 0, 2, d2 // 2), _cols_t(slab, up, 1, 2, d2 // 2)]
        elif layout == "down":
            out.append(_rows(slab, down, 0, d1))
        elif layout == "down_t":
            out.append(_cols_t(slab, down, 0, 1, d2))
        else:
            raise ValueError(f"unknown expert layout {layout!r}")
    return out


def check_split_shapes(info: TensorInfo, layout: str) -> str | None:
    """Why `info` cannot be split with `layout`, or None."""
    if layout not in GATE_UP_LAYOUTS + DOWN_LAYOUTS:
        return f"{info.name}: unknown expert layout {layout!r}; use one of {', '.join(GATE_UP_LAYOUTS + DOWN_LAYOUTS)}"
    if layout in GATE_UP_LAYOUTS:
        dim = info.shape[1] if layout == "gate_up" else info.shape[2]
        if dim % 2:
            return f"{info.name} {list(info.shape)}: gate_up dimension {dim} is odd; check the recipe's layout"
    return None


DEFAULT_NAMES = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


def expert_names(recipe) -> dict[str, str]:
    """The per-expert gate/up/down module names of `recipe` (Mixtral: w1/w3/w2)."""
    return {**DEFAULT_NAMES, **((recipe.experts or {}).get("names") or {})}


def expand(tensors: dict[str, TensorInfo], recipe, kept) -> tuple[dict[str, TensorInfo], list[Problem]]:
    """Replace every declared fused 3-D expert tensor by its per-expert virtual tensors.

    Args:
        kept: predicate on a container module name: True when the user excluded it (an
            undeclared fused tensor of a kept container is then copied unchanged).

    Returns the new name -> tensor mapping (source order kept) and the problems found (rule
    ``expert-layout``, subject: the fused tensor's name).
    """
    layouts = (recipe.experts or {}).get("fused_tensors") or {}
    names = expert_names(recipe)
    out: dict[str, TensorInfo] = {}
    problems: list[Problem] = []
    for name, info in tensors.items():
        if not is_fused_expert_tensor(info):
            out[name] = info
            continue
        layout = layouts.get(info.leaf)
        why = None if layout is None else check_split_shapes(info, layout)
        if layout is None and not kept(info.module):
            why = (
                f"{name} {info.dtype}{list(info.shape)}: a fused 3-D expert tensor whose layout recipe {recipe.name!r} "
                f"does not declare (layouts differ by architecture and are never guessed); add "
                f"experts.fused_tensors.{info.leaf} to a recipe (docs/recipes.md) or --exclude {info.module!r}"
            )
        if layout is None or why:
            if why:
                problems.append(Problem(EXPERT_LAYOUT, name, why))
            out[name] = info
            continue
        for part in split(info, layout, names):
            out[part.name] = part
    return out, problems


def read_virtual(info: TensorInfo) -> torch.Tensor:
    """Read a (possibly virtual) tensor whole: a plain one, or a transposed view of an expert slab."""
    from ..checkpoint.safetensors_io import read_tensor

    return info.apply(read_tensor(info.slab)) if isinstance(info, ViewedTensor) else read_tensor(info)


def read_rows(info: TensorInfo, start: int, count: int, pin: bool = False) -> torch.Tensor:
    """Rows ``[start, start+count)`` of a source tensor into a new (pinned) CPU tensor.

    A :class:`ViewedTensor` (a transposed expert slice) reads its whole slab and takes the view.
    """
    import torch

    from ..checkpoint.safetensors_io import byte_view, read_bytes_into, read_tensor, torch_dtype

    if isinstance(info, ViewedTensor):
        t = info.apply(read_tensor(info.slab))[start : start + count]
        return t.pin_memory() if pin else t
    if not info.shape:
        return read_tensor(info)
    row = info.nbytes // max(info.shape[0], 1)
    buf = torch.empty(count * row, dtype=torch.uint8, pin_memory=pin)
    if buf.numel():
        read_bytes_into(info, byte_view(buf), start * row, count * row)
    return buf.view(torch_dtype(info.dtype)).reshape((count,) + tuple(info.shape[1:]))
