"""``quantize verify``: check a converted checkpoint as a loader would, by its format's rules.

The format of the folder is detected from its documents (``formats.detect_output``) and its own
rules run (``Format.verify``: formats/modelopt_verify.py, formats/ct_verify.py), on top of the
shared checks of formats/readback.py (index, NaN/Inf, SQNR against the source). The rules and
their floors are listed in docs/verify.md.
"""

from __future__ import annotations

import os

from .formats import detect_output
from .formats.readback import VerifyResult
from .problems import ERROR


def verify_checkpoint(path: str, source: str | None = None, method: dict | None = None) -> VerifyResult:
    """Run every check on the checkpoint folder at `path` (see the module docstring); `method`: how its
    weights were made (``--rounding`` / ``--smooth``) when the caller knows it, else read from the output."""
    res = VerifyResult(path, None)
    if not os.path.isdir(path):
        res.add(ERROR, "missing-file", path, f"{path}: no such checkpoint folder")
        return res
    fmt, config = detect_output(path)
    if config is not None and "quantization_config" not in config and not os.path.lexists(os.path.join(path, "hf_quant_config.json")):
        res.add(ERROR, "not-quantized", path, f"{path}: not quantized (config.json has no quantization_config, no "
                "hf_quant_config.json); verify checks a converted checkpoint: run `quantize convert` on it first")
        return res
    fmt.verify(path, config, res, source, method)
    return res


__all__ = ["verify_checkpoint", "VerifyResult"]
