"""A small deterministic covering-array builder: every pair of factor values in at least one row.

The matrix tests (test_matrix.py) need a handful of rows in which every pair of option values meets,
instead of the thousands of rows of the full product. The method is the classic greedy one
(AETG-like, but with every candidate enumerated, which is cheap for a few thousand rows):

1. ``seeds`` (rows the caller insists on: known hot spots) are taken first, as given.
2. Among the *allowed* rows (``allowed(row)`` is true) that are not ``weak``, repeatedly take the one
   that covers the most pairs not yet covered per cost (new pairs / (1 + cost / COST_SCALE); with no
   ``cost``, simply the most pairs); ties go to the cheapest, then to the first row in product order,
   so the result never changes between runs or machines. A weak row is allowed but stops early (its
   first run fails before there is an output to check), so it cannot stand for its other pairs.
3. Pairs that only weak rows can hold get weak rows, chosen the same way.
4. Pairs that no allowed row can cover (the options refuse each other) are each covered by one
   *refused* row: the first row in product order that holds the pair and breaks only the rules
   ``refusals(row)`` names for it (a refusal row with one reason tests one message).

A row is a dict ``{factor: value}``; factors keep the caller's order. Pure Python, no dependencies.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable

Row = dict
COST_SCALE = 20  # a row costing this much must cover twice the new pairs of a free one to be taken first
Pair = tuple  # ((factor_a, value_a), (factor_b, value_b)) with factor_a before factor_b


def pairs_of(row: Row, order: list[str]) -> set[Pair]:
    """Every pair of (factor, value) of `row`, factors in `order`."""
    items = [(f, row[f]) for f in order]
    return set(itertools.combinations(items, 2))


def all_pairs(factors: dict[str, tuple]) -> set[Pair]:
    """Every pair of values of two different factors."""
    names = list(factors)
    out = set()
    for a, b in itertools.combinations(names, 2):
        out |= {((a, va), (b, vb)) for va in factors[a] for vb in factors[b]}
    return out


def product(factors: dict[str, tuple]) -> list[Row]:
    """The full product, in a fixed order (the first factor varies slowest)."""
    names = list(factors)
    return [dict(zip(names, values)) for values in itertools.product(*(factors[n] for n in names))]


def build(factors: dict[str, tuple], allowed: Callable[[Row], bool], refusals: Callable[[Row], list],
          seeds: Iterable[Row] = (), weak: Callable[[Row], bool] = lambda row: False,
          cost: Callable[[Row], float] = lambda row: 0) -> tuple[list[Row], list[Row]]:
    """``(rows that must run, rows that must be refused)``, together covering every pair of values.

    `allowed(row)`: the options of `row` go together (the run must write output).
    `refusals(row)`: the rules `row` breaks (empty when allowed); a refused row is picked with exactly one.
    `seeds`: full rows taken first (allowed ones only; a refused seed is an error in the caller).
    `weak(row)`: an allowed row that cannot stand for its other pairs (step 3 of the module docstring).
    `cost(row)`: what running the row costs (seconds, roughly); new pairs are weighed against it (COST_SCALE).
    """
    order = list(factors)
    rows = product(factors)
    wanted = all_pairs(factors)
    chosen: list[Row] = []
    covered: set[Pair] = set()
    for seed in seeds:
        if not allowed(seed):
            raise ValueError(f"seed row {seed} is not allowed")
        chosen.append(dict(seed))
        covered |= set() if weak(seed) else pairs_of(seed, order)
    # pairs as bits of an int: a row's pairs one mask, "covers how many still wanted" one AND and a bit count
    bit = {p: 1 << i for i, p in enumerate(sorted(wanted, key=repr))}
    mask = lambda ps: sum(bit[p] for p in ps)  # noqa: E731
    done = mask(covered)
    coverable_bits = 0
    for tier in ([r for r in rows if allowed(r) and not weak(r)], [r for r in rows if allowed(r) and weak(r)]):
        cover = [mask(pairs_of(r, order)) for r in tier]
        price = [cost(r) for r in tier]
        for m in cover:
            coverable_bits |= m
        while coverable_bits & ~done:
            need = coverable_bits & ~done
            best = max(range(len(tier)), key=lambda i: ((cover[i] & need).bit_count() / (1 + price[i] / COST_SCALE), -price[i], -i))
            chosen.append(tier[best])
            done |= cover[best]
    coverable = {p for p in wanted if bit[p] & coverable_bits}
    refused: list[Row] = []
    for pair in sorted(wanted - coverable, key=lambda p: [order.index(p[0][0]), str(p[0][1]), order.index(p[1][0]), str(p[1][1])]):
        if any(pair in pairs_of(r, order) for r in refused):
            continue
        row = next((r for r in rows if pair in pairs_of(r, order) and len(refusals(r)) == 1), None)
        if row is None:
            row = next(r for r in rows if pair in pairs_of(r, order))
        refused.append(row)
    return chosen, refused


def uncovered(factors: dict[str, tuple], rows: Iterable[Row]) -> set[Pair]:
    """The pairs of values that none of `rows` holds (empty for a covering array)."""
    order = list(factors)
    have = set()
    for r in rows:
        have |= pairs_of(r, order)
    return all_pairs(factors) - have
