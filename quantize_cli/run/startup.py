"""What a conversion starts ahead, while the driver is still planning.

``convert`` calls :func:`begin` as soon as the options are checked and :func:`end` on its way out:

- the local executor: the CUDA context and the Triton kernels of each device, on daemon threads
  (:func:`~.context.warm_device`), when the device is resolved before planning (calibration, a Hub
  source); otherwise :func:`warm` runs once the plan's refusals are said (no torch before them);
- ``--executor ray``: joining or starting Ray and creating the workers, which import torch, create
  their CUDA contexts and load the kernels meanwhile (:func:`~.ray_start.start_early`). Nothing
  for a dry run, nor for a ``--resume`` of a finished DST (no byte to write).

The executor adopts what was started; :func:`end` stops what nobody adopted (a plan that was
refused), so that a library caller is never left with a Ray instance or workers it did not ask for.
"""

from __future__ import annotations

import sys

from .context import warm_device


def begin(how, opts, finished: bool) -> None:
    """Start ahead what the run of `opts` will need (`how`: run/options.RunChecked)."""
    if how.ray_device is not None:
        if not (opts.dry_run or finished):
            from . import ray_start

            ray_start.start_early(opts.ray_address, how.ray_device)
        return
    warm(how)


def warm(how) -> None:
    """The CUDA context and the kernels of each local device on daemon threads (nothing for the
    CPU, Ray's driver, or a device still a name: resolved only after the plan's refusals)."""
    for dev in how.device if isinstance(how.device, tuple) else (how.device,):
        warm_device(dev)


def end() -> None:
    """Stop what :func:`begin` started and no executor adopted."""
    ray_start = sys.modules.get(f"{__package__}.ray_start")
    if ray_start is not None:
        ray_start.abandon_early()


__all__ = ["begin", "end", "warm"]
