"""What a conversion starts ahead, while the driver is still planning.

``convert`` calls :func:`begin` as soon as the options are checked and :func:`end` on its way out:

- the local executor: the CUDA context and the Triton kernels of each device, on daemon threads
  (:func:`~.context.warm_device`), when the device is resolved before planning (calibration, a Hub
  source); otherwise :func:`warm` runs once the plan's refusals are said (no torch before them);
- ``--executor ray``: joining or starting Ray and creating the workers, which import torch, create
  their CUDA contexts and load the kernels meanwhile (:func:`~.ray_start.start_early`). Nothing
  for a dry run, nor for a ``--resume`` of a finished DST (no byte to write).

- the local executor of a real run: :func:`resolve_ahead` resolves the device (importing torch)
  and warms it on a thread, while ``convert`` takes the work folder and copies the verbatim
  tensors meanwhile (:mod:`.copy_ahead`); its errors are raised when the run asks for the result.

The executor adopts what was started; :func:`end` stops what nobody adopted (a plan that was
refused), so that a library caller is never left with a Ray instance or workers it did not ask for.
"""

from __future__ import annotations

import os
import sys
import threading

from .context import triton_version_key, warm_device


def begin(how, opts, finished: bool) -> None:
    """Start ahead what the run of `opts` will need (`how`: run/options.RunChecked)."""
    if how.ray_device is not None:
        if not (opts.dry_run or finished):
            from . import ray_start

            ray_start.start_early(opts.ray_address, how.ray_device)
        return
    warm(how)


def warm(how, wait: bool = False) -> None:
    """The CUDA context and the kernels of each local device on daemon threads (`wait`: one after
    the other on this thread; nothing for the CPU, Ray's driver, or a device still a name: resolved
    only after the plan's refusals)."""
    for dev in how.device if isinstance(how.device, tuple) else (how.device,):
        warm_device(dev, wait)


class Resolution:
    """``resolve()`` (the run options with the device resolved) computed on a thread."""

    def __init__(self, resolve):
        self._result = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(resolve,), daemon=True, name="quantize-resolve")
        self._thread.start()

    def _run(self, resolve) -> None:
        try:
            self._result = resolve()
        except BaseException as exc:  # noqa: BLE001 - raised by result(), on the caller's thread
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result


def resolve_ahead(how, opts, fmt) -> Resolution:
    """The device of `how` resolved through torch and warmed (:func:`warm`), on a thread: done
    when the first kernel can launch at once. Where a GPU may be used, Triton's version key (a
    hash of its library, seconds: context.triton_version_key) is computed beside torch's import."""
    from .options import resolve_run

    def resolve():
        if _may_use_a_gpu(how.device):
            threading.Thread(target=triton_version_key, daemon=True, name="quantize-triton-key").start()
        resolved = resolve_run(how, opts, fmt)
        warm(resolved, wait=True)
        return resolved

    return Resolution(resolve)


def _may_use_a_gpu(device) -> bool:
    """`device` (still a name) may resolve to an NVIDIA GPU here (torch-free: the driver's node)."""
    names = device if isinstance(device, tuple) else (device,)
    return any(not str(d).startswith("cpu") for d in names) and os.path.exists("/dev/nvidiactl")


def end() -> None:
    """Stop what :func:`begin` started and no executor adopted."""
    ray_start = sys.modules.get(f"{__package__}.ray_start")
    if ray_start is not None:
        ray_start.abandon_early()


__all__ = ["begin", "end", "warm", "resolve_ahead", "Resolution"]
