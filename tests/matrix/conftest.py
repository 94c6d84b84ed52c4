"""Fixtures of the feature-interaction matrix: SCALES.json (made once with ``quantize calibrate``), a fake
Hub, a local Ray instance (started only when a Ray cell runs), and the reference outputs (local
executor, fresh run, same options), each made once per module and shared by the cells."""

from __future__ import annotations

import pytest

from tests.hostile.helpers import invoke

from .cells import BASE, FACTORS, Cell
from .support import fake_hub, local_ray


@pytest.fixture(scope="session")
def scales(example_scales):
    """``(path, {module: amax}, {attention: {k_amax, v_amax}})`` of example:tiny-llama (tests/conftest.py)."""
    return example_scales


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with fake_hub(str(tmp_path_factory.mktemp("hf"))) as server:
        yield server


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray instance for the module's Ray cells (started on the first one)."""
    with local_ray() as ray:
        yield ray


class References:
    """Reference outputs by bytes key (format, algo, algo_for, calibration, layout, kv, scale search)."""

    def __init__(self, root, scales_path: str):
        self.root, self.scales, self.made = root, scales_path, {}

    def get(self, key: tuple) -> str:
        if key not in self.made:
            names = ("format", "algo", "algo_for", "calibration", "layout", "kv", "scale_search")
            cell = Cell(tuple((k, {**BASE, **dict(zip(names, key))}[k]) for k in FACTORS))
            dst = str(self.root / f"ref-{len(self.made)}")
            r = invoke(*cell.args(dst, self.scales))
            assert r.exit_code == 0, f"reference {key}: {r.stderr or r.output}"
            self.made[key] = dst
        return self.made[key]


@pytest.fixture(scope="module")
def references(tmp_path_factory, scales):
    return References(tmp_path_factory.mktemp("refs"), scales[0])
