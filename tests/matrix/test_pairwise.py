"""The covering-array builder (pairwise.py): every pair covered, constraints kept, deterministic, small."""

from __future__ import annotations

import itertools

import pytest

from . import pairwise

FACTORS = {"a": (0, 1, 2), "b": ("x", "y"), "c": (True, False), "d": ("p", "q", "r")}


def _refusals(row):
    return (["a2-with-x"] if row["a"] == 2 and row["b"] == "x" else []) + (["r-with-c"] if row["d"] == "r" and row["c"] else [])


def test_every_pair_is_covered_by_allowed_rows_or_by_one_refused_row_each():
    ok, refused = pairwise.build(FACTORS, lambda r: not _refusals(r), _refusals)
    assert not pairwise.uncovered(FACTORS, ok + refused)
    assert all(not _refusals(r) for r in ok) and all(len(_refusals(r)) == 1 for r in refused)
    impossible = {(("a", 2), ("b", "x")), (("c", True), ("d", "r"))}
    for pair in impossible:  # only a refused row can hold these
        assert not any(pair in pairwise.pairs_of(r, list(FACTORS)) for r in ok)
    assert len(refused) == 2


def test_far_fewer_rows_than_the_product_and_the_same_rows_every_time():
    ok, refused = pairwise.build(FACTORS, lambda r: not _refusals(r), _refusals)
    full = len(list(itertools.product(*FACTORS.values())))
    assert len(ok) <= 12 < full  # 3 x 3 values need at least 9 rows
    assert (ok, refused) == pairwise.build(FACTORS, lambda r: not _refusals(r), _refusals)


def test_seeds_come_first_and_a_refused_seed_is_an_error():
    seed = {"a": 2, "b": "y", "c": False, "d": "r"}
    ok, _ = pairwise.build(FACTORS, lambda r: not _refusals(r), _refusals, seeds=[seed])
    assert ok[0] == seed
    with pytest.raises(ValueError, match="not allowed"):
        pairwise.build(FACTORS, lambda r: not _refusals(r), _refusals, seeds=[{"a": 2, "b": "x", "c": False, "d": "p"}])


def test_weak_rows_do_not_stand_for_their_other_pairs():
    weak = lambda r: r["c"] and r["d"] == "q"  # noqa: E731 - say (c, q) stops every row early
    ok, _ = pairwise.build(FACTORS, lambda r: not _refusals(r), _refusals, weak=weak)
    strong = [r for r in ok if not weak(r)]
    only_weak = {(("c", True), ("d", "q"))}
    assert pairwise.uncovered(FACTORS, strong) - only_weak == {(("a", 2), ("b", "x")), (("c", True), ("d", "r"))}
    assert sum(map(weak, ok)) == 1  # one weak row, for the one pair only weak rows hold


def test_among_rows_that_cover_as_much_the_cheapest_is_taken():
    price = lambda r: 1 if r["c"] else 0  # noqa: E731 - rows with c=True cost more
    plain, _ = pairwise.build(FACTORS, lambda r: not _refusals(r), _refusals)
    cheap, refused = pairwise.build(FACTORS, lambda r: not _refusals(r), _refusals, cost=price)
    assert not pairwise.uncovered(FACTORS, cheap + refused)
    assert sum(map(price, cheap)) < sum(map(price, plain))
