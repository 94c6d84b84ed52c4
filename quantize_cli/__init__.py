"""quantize: a streaming bf16 -> NVIDIA ModelOpt (FP8 / NVFP4 / INT8) checkpoint converter.

``import quantize_cli`` is cheap: no Triton, no CUDA initialisation. The library entry points
(:func:`convert`, :func:`check`, :func:`verify`) are imported lazily from :mod:`quantize_cli.api`.
"""

__version__ = "0.1.0"


def __getattr__(name):
    if name in ("convert", "check", "verify", "unpack", "push"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'quantize_cli' has no attribute {name!r}")


__all__ = ["__version__", "convert", "check", "verify", "unpack", "push"]
