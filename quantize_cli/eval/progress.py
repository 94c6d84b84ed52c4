"""The progress bar over layers (tqdm on stderr; silent when quiet or not a terminal)."""

from __future__ import annotations

import sys
from contextlib import contextmanager


@contextmanager
def layer_bar(quiet: bool = False):
    """Yields ``update(done, total)`` for :func:`~quantize_cli.eval.run_eval`'s `progress`."""
    from tqdm import tqdm

    bar = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, unit="layer", desc="eval", disable=quiet or not sys.stderr.isatty())
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()
