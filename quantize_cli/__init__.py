"""quantize: a streaming bf16 -> NVIDIA ModelOpt (FP8 / NVFP4 / INT8) checkpoint converter.

``import quantize_cli`` is cheap: no Triton, no CUDA initialisation. The library entry points
(:func:`convert`, :func:`check`, :func:`verify`) are imported lazily from :mod:`quantize_cli.api`.
"""

__version__ = "0.1.0"

# The byte-deciding version: raised whenever a numeric rule changes the bytes some options write (a
# scale formula, a search's candidates, GPTQ's arithmetic), so that a --resume across the change is
# refused, never mixed (issue 35: __version__ stayed 0.1.0 while such rules changed).
# tests/test_numerics_version.py hashes an output of every algorithm and fails when one changes
# without it. 1: everything up to session 6 (recorded as plain "0.1.0"); 2: calibration and GPTQ on
# one CPU thread, GPTQ's CPU lazy update in 64-row tiles (session 7).
# 3: each block calibrated with its own mask and rotary table (sliding-window layers: Gemma 2/3), smoothing
# folded into (1 + w) norms (session 8, issue 37; the bytes of Llama-like models are unchanged).
# 4: GPTQ solves with its Hessian's off-diagonal halved (calibration/gptq.py SHRINK; session 9, issue 37).
NUMERICS_VERSION = 4
CONVERTER = f"{__version__}+numerics.{NUMERICS_VERSION}"


def __getattr__(name):
    if name in ("convert", "check", "verify", "unpack", "push"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'quantize_cli' has no attribute {name!r}")


__all__ = ["__version__", "NUMERICS_VERSION", "CONVERTER", "convert", "check", "verify", "unpack", "push"]
