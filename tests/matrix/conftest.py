"""Fixtures of the feature-interaction matrix: SCALES.json (made once with ``quantize calibrate``), a fake
Hub, a local Ray instance (started only when a Ray cell runs), and the reference outputs (the same
bytes by another path: cells.reference_options, and the second array's ``algo_references``), each made
once per module and shared by the cells."""

from __future__ import annotations

import pytest

from tests.hostile.helpers import invoke

from . import algo_cells
from .cells import Cell, path
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
    """Reference outputs (Cell.reference: the same bytes by another path), made once per bytes key."""

    def __init__(self, root, scales_path: str):
        self.root, self.scales, self.made = root, scales_path, {}

    def of(self, cell: Cell) -> str:
        ref = cell.reference
        assert path(ref.o) != path(cell.o), f"{cell.id}: the reference is the cell's own path {path(cell.o)}"
        key = ref.bytes_key()
        if key not in self.made:
            dst = str(self.root / f"ref-{len(self.made)}")
            r = invoke(*ref.args(dst, self.scales))
            assert r.exit_code == 0, f"reference {key}: {r.stderr or r.output}"
            self.made[key] = dst
        return self.made[key]


@pytest.fixture(scope="module")
def references(tmp_path_factory, scales):
    return References(tmp_path_factory.mktemp("refs"), scales[0])


class AlgoReferences:
    """The second array's references (algo_cells.py): one fresh ``convert --calib-data`` on one device without
    ``--eval`` per bytes key, a path no cell of that array takes."""

    def __init__(self, root):
        self.root, self.made = root, {}

    def of(self, cell: algo_cells.Cell) -> str:
        assert cell.o["path"] != algo_cells.REFERENCE_PATH, f"{cell.id}: the reference is the cell's own path"
        key = cell.bytes_key()
        if key not in self.made:
            dst = str(self.root / f"ref-{len(self.made)}")
            r = invoke(*cell.args(dst, None, path=algo_cells.REFERENCE_PATH))
            assert r.exit_code == 0, f"reference {key}: {r.stderr or r.output}"
            self.made[key] = dst
        return self.made[key]


@pytest.fixture(scope="module")
def algo_references(tmp_path_factory):
    return AlgoReferences(tmp_path_factory.mktemp("algo-refs"))
