"""How a conversion runs (never what it writes): ``--executor``, ``--device``, ``--kernels``.

Checked in two steps around the output's preflight: :func:`check_run_options` needs no torch (the
names, Ray installed), so a refusal of DST or of a flag comes in the first second;
:func:`resolve_run` then resolves the device through torch. A dry run keeps the device a name where
nothing reads what torch would resolve it to (devices.without_torch).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class RunChecked:
    """device: the local torch device (the Ray driver's ``cpu``), or a name until resolved (and in a dry
    run that needs none); ray_device: the Ray tasks' device, or None; kernels: --kernels, normalised."""

    device: object
    ray_device: str | None
    kernels: str

    @property
    def first_device(self):
        """The device calibration runs on: the first of several (``--device cuda:0,cuda:1``)."""
        return self.device[0] if isinstance(self.device, tuple) else self.device


def check_run_options(opts, fmt) -> RunChecked:
    """Usage errors of the run options of `opts` (ConvertOptions) for output format `fmt`; no torch."""
    from ..devices import check_device_name
    from .kernel_choice import check_kernels

    if opts.executor != "local":  # Ray tasks ask for their own GPU: the driver itself needs none
        from . import ray_executor  # Ray itself is imported only there

        device, ray_device = "cpu", ray_executor.check_options(opts.executor, opts.device)
    else:
        device, ray_device = check_device_name(opts.device), None
    kernels = check_kernels(opts.kernels, ray_device or device, fmt.reference_math_only)  # "auto": checked again resolved
    return RunChecked(device, ray_device, kernels)


def resolve_run(how: RunChecked, opts, fmt) -> RunChecked:
    """The device resolved through torch (CUDA present, the index valid), and --kernels against it."""
    from ..devices import resolve_devices, without_torch
    from .kernel_choice import check_kernels

    calibrating = any(v is not None for v in (opts.calib_data, opts.act_scales, opts.calib_samples, opts.calib_seq_len))
    if how.ray_device is not None and not calibrating:  # the Ray driver computes nothing: no torch in it (seconds)
        return replace(how, kernels=check_kernels(how.kernels, how.ray_device, fmt.reference_math_only))
    # A dry run reads no tensor: there the device stays a name (no torch) unless calibration runs on
    # it, or something reads what "auto" resolves to (--report records it, --kernels triton checks it)
    auto_is_read = bool(opts.report) or how.kernels == "triton"
    kept = without_torch(how.device, auto_is_read) if opts.dry_run and not calibrating else None
    dev = kept or resolve_devices(how.device)
    for d in dev if isinstance(dev, tuple) else (dev,):
        kernels = check_kernels(how.kernels, how.ray_device or d, fmt.reference_math_only)
    return replace(how, device=dev, kernels=kernels)


__all__ = ["RunChecked", "check_run_options", "resolve_run"]
