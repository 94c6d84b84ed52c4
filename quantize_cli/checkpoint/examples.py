"""Where the embedded example checkpoints (``SRC = example:NAME``) live; torch-free.

An example is generated on first use by :mod:`.example` (which needs torch for its random weights)
into ``$XDG_CACHE_HOME/quantize/examples/`` (or ``~/.cache/...``) and reused afterwards, so
``quantize check example:tiny-llama`` and ``convert --dry-run`` on an example already generated
import no torch.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from ..errors import SourceError

EXAMPLE_VERSION = 1

# The generators are in example.EXAMPLES, under these names (example.py checks that they agree).
NAMES = ("tiny-llama", "tiny-qwen3-moe", "tiny-qwen3-moe-fused", "tiny-deepseek")


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "quantize", "examples")


def example_path(name: str, generators=None) -> str:
    """The folder of example `name`, generated on first use (atomically, so races are harmless).

    `generators`: name -> ``generate(folder)``; None when the caller has none (a folder not generated
    yet is then an error). :func:`checkpoint.source.resolve_source` passes example_weights.EXAMPLES."""
    if name not in NAMES:
        raise SourceError(f"example:{name}: no such example; available: {', '.join('example:' + n for n in NAMES)}")
    final = os.path.join(_cache_dir(), f"{name}-v{EXAMPLE_VERSION}")
    if os.path.isdir(final):
        return final
    if generators is None:
        raise SourceError(f"example:{name}: not generated yet and no generator given")
    os.makedirs(_cache_dir(), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=_cache_dir())
    try:
        generators[name](tmp)
        os.rename(tmp, final)
    except OSError:
        if not os.path.isdir(final):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
