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

EXAMPLE_VERSION = 3  # 2: the examples ship a tokenizer (example_tokenizer.py); 3: tiny-deepseek runs (n_group)

# The generators are in example.EXAMPLES, under these names (example.py checks that they agree).
NAMES = ("tiny-llama", "tiny-qwen3-moe", "tiny-qwen3-moe-fused", "tiny-deepseek")


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "quantize", "examples")


def check_name(name: str) -> None:
    """Refuse an example name that does not exist (nothing generated, nothing imported)."""
    if name not in NAMES:
        raise SourceError(f"example:{name}: no such example; available: {', '.join('example:' + n for n in NAMES)}")


def example_path(name: str) -> str:
    """The folder of example `name`, generated on first use (atomically, so races are harmless)."""
    check_name(name)
    final = os.path.join(_cache_dir(), f"{name}-v{EXAMPLE_VERSION}")
    if os.path.isdir(final):
        return final
    from .example_weights import EXAMPLES  # torch: only to generate the weights, once
    os.makedirs(_cache_dir(), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=_cache_dir())
    try:
        EXAMPLES[name](tmp)
        os.rename(tmp, final)
    except OSError:
        if not os.path.isdir(final):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
