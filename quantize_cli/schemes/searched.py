"""``--scale-search``: the :class:`Searched` scheme and the option's check (torch-free).

A searched scheme writes the same algorithm, configs, tensor names, dtypes and shapes as its
base; only ``quantize`` differs, and that math (the torch reference the kernels follow) is
:mod:`.search`, imported when a tensor is quantized. Planning (``check_options``, the plan,
``--dry-run``) needs only this module. Formats read a searched scheme's other fields and methods
(compressed-tensors' ``preset``, ``outputs_for`` ...) as its base's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import UsageError
from .base import Scheme
from .fp8 import Fp8Block, Fp8PerChannel
from .int4 import Int4Group
from .int8 import Int8PerChannel
from .nvfp4 import Nvfp4

METHODS = ("none", "mse")
SEARCHABLE = (Nvfp4, Int8PerChannel, Fp8PerChannel, Fp8Block, Int4Group)


def searchable(scheme: Scheme) -> bool:
    """Whether `scheme` has a search: one of :data:`SEARCHABLE`, or a format's own scheme that brings
    its own (``search_quantize(w, channel_weights)``: compressed-tensors' W4A16 / W4A16_ASYM; the
    format rooms import schemes, not the other way)."""
    return isinstance(scheme, SEARCHABLE) or callable(getattr(scheme, "search_quantize", None))


@dataclass(frozen=True)
class Searched(Scheme):
    """`base` with searched scales: same algo, configs and tensors; only ``quantize`` differs."""

    base: Scheme | None = None
    scale_search: str = "mse"
    # "activations": the plan passes each module's calibration E[x_j^2] (channel_weights) to quantize;
    # "none": the data-free search (every input channel alike). Recorded in hf_quant_config.json.
    weighting: str = "none"

    def __getattr__(self, name):
        # the base's own fields and methods (compressed-tensors' ``preset``, ``symmetric`` ...):
        # a format reads them from the plan's scheme as from the base
        if name.startswith("__") or name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    def modelopt_group(self, group_size):
        return self.base.modelopt_group(group_size)

    def shape_problem(self, shape):
        return self.base.shape_problem(shape)

    def shape_outputs(self, shape):
        return self.base.shape_outputs(shape)

    def logical_shape(self, stored):
        return self.base.logical_shape(stored)

    def outputs_for(self, info):
        return self.base.outputs_for(info)  # compressed-tensors: the scales take the source's dtype

    def global_amax(self, w):
        return self.base.global_amax(w)

    def calibrated_inputs(self, amax, out):
        return self.base.calibrated_inputs(amax, out)

    def outputs(self, shape):
        return self.base.outputs(shape)

    def dequantize(self, q):
        return self.base.dequantize(q)

    def quantize(self, w, global_amax=None, channel_weights=None):
        """`base`'s tensors with searched scales; `channel_weights` ``[K]`` (fp32 ``E[x_j^2]`` of the
        calibration inputs, :mod:`.weighted`) weights each input channel's error, None: all alike."""
        from .search import quantize_blocks, quantize_int4, quantize_nvfp4, quantize_rows

        own = getattr(self.base, "search_quantize", None)
        if own is not None:  # a format's own scheme (compressed-tensors W4A16 / W4A16_ASYM)
            return own(w, channel_weights)
        if isinstance(self.base, Int4Group):
            return quantize_int4(w, channel_weights)
        if isinstance(self.base, Nvfp4):
            return quantize_nvfp4(self.base, w, global_amax, channel_weights)
        if isinstance(self.base, Fp8Block):
            return quantize_blocks(w, channel_weights)
        return quantize_rows(self.base, w, channel_weights)



# Scheme's own attributes, which the base defines for itself: __getattr__ never reaches them (the
# class attribute is found first), so each is read from the base here: one list.
for _name in ("act_kind", "global_scale_key", "inverse_input_scale", "bits", "modelopt_single_group"):
    setattr(Searched, _name, property(lambda self, _n=_name: getattr(self.base, _n)))
del _name

def with_scale_search(scheme: Scheme, method: str | None) -> Scheme:
    """`scheme` itself for ``none``; its :class:`Searched` form for ``mse`` (a UsageError otherwise)."""
    method = (method or "none").lower()
    if method not in METHODS:
        raise UsageError(f"--scale-search {method!r}: choose none or mse")
    if method == "none":
        return scheme
    if not searchable(scheme):
        raise UsageError(f"--scale-search mse --algo {scheme.algo}: this format's scales are not searched (only NVFP4, "
                         "W4A16_NVFP4, INT8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, INT4 and INT4_ASYM have a search); drop it")
    return Searched(**{f.name: getattr(scheme, f.name) for f in fields(Scheme)}, base=scheme, scale_search=method)
