"""Exact multiple-choice knapsack by (max,+) dynamic programming, vectorised.

``best_j[c]`` is the best value of the first ``j`` items using at most ``c``
units; ``best_j[c] = max over choices (w, v) of best_{j-1}[c - w] + v``. Each
item is one gather of a (cells x choices) array and one ``max`` over it, so
Python loops run over items, never over choices or capacity. Only the cells the
answer can reach are filled: row ``j`` needs no cell below the capacity less
what the later items can take at most (the backtrack, which starts at the
capacity, never goes lower), nor above what the first ``j`` items can take
(the row is flat from there). Every row is kept so the backtrack can find, for
each item, the first choice in its preference order that reproduces the row
exactly (the same float operations give bit-identical sums, so ties are broken
deterministically by the caller's preference order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided


@dataclass(frozen=True)
class Item:
    """One item of the knapsack: its choices' weights, values and tie-break order (plain lists)."""

    weights: list[int]  # >= 0
    values: list[float]
    preference: list[int]  # indices into weights, most preferred first

    def __post_init__(self) -> None:
        if type(self.weights) is list and type(self.values) is list and type(self.preference) is list:
            return  # the common case at once (the walk below names what is not a list)
        for name in ("weights", "values", "preference"):
            if not isinstance(getattr(self, name), list):
                raise TypeError(f"Item.{name} must be a list, got {type(getattr(self, name)).__name__}")


class InfeasibleError(ValueError):
    """No choice of some item fits the capacity."""


def solve_items(items: list[Item], capacity: int) -> tuple[list[int], float]:
    """Pick one choice per item, total weight <= capacity, maximum total value.

    Returns the chosen index of every item and the optimum.
    """
    if capacity < 0:
        raise InfeasibleError(f"capacity {capacity} < 0")
    if len(items) == 1:  # most reduced problems: no table to fill
        return _solve_one(items[0], capacity)
    rows = _forward(items, capacity)
    return _backtrack(items, rows, capacity), float(rows[-1][capacity])


def _solve_one(item: Item, capacity: int) -> tuple[list[int], float]:
    """:func:`solve_items` of one item, as the table would give it: the best value that fits (each
    summed onto the empty row's 0.0), the first choice reaching it in preference order."""
    weights, values = item.weights, item.values
    fits = [0.0 + v for w, v in zip(weights, values) if w <= capacity]
    if not fits:
        raise InfeasibleError(f"item 0: no choice fits capacity {capacity}")
    best = max(fits)
    for idx in item.preference:
        if weights[idx] <= capacity and 0.0 + values[idx] == best:
            return [idx], best
    raise AssertionError("unreachable: the best value is some choice's")  # pragma: no cover


def _forward(items: list[Item], capacity: int) -> list[np.ndarray]:
    width = capacity + 1
    tops = [max(item.weights, default=0) for item in items]
    # each row sits behind a margin of -inf as wide as the heaviest choice: a choice heavier than a
    # cell reads the margin, so every cell is one gather and no choice needs a bound of its own
    margin = max(tops, default=0)
    weights = np.array([w for item in items for w in item.weights], np.int64)  # every item's, one after another
    values = np.array([v for item in items for v in item.values])
    ends = np.cumsum([len(item.weights) for item in items]).tolist()
    table = np.full((len(items) + 1, margin + width), -np.inf)
    table[0, margin:] = 0.0
    cell = np.arange(margin + width)[:, None]
    # back[j, c, w] is row j's cell c - w (c counted from the margin's end): an item whose weights are
    # 0, 1, ..., top (most: a row's surviving counts are consecutive) reads its cells as one slice of
    # it, with no index array and no gather; the sums and maxima are the same floats
    row0 = table[:, margin:]
    back = as_strided(row0, (len(items) + 1, width, margin + 1), (row0.strides[0], row0.strides[1], -row0.strides[1]),
                      writeable=False)
    plain = [item.weights == list(range(len(item.weights))) for item in items]  # weights 0, 1, ..., top
    reach, later = 0, sum(tops)
    start = 0
    for pos, (top, end) in enumerate(zip(tops, ends)):
        reach, later = min(capacity, reach + top), later - top
        lo, hi = margin + min(reach, max(0, capacity - later)), margin + reach + 1  # the cells the answer reads
        new = table[pos + 1]
        if plain[pos]:
            cells = back[pos, lo - margin:hi - margin, :top + 1] + values[start:end]
        else:
            cells = table[pos][cell[lo:hi] - weights[start:end]]
            cells += values[start:end]
        start = end
        cells.max(axis=1, out=new[lo:hi], initial=-np.inf)
        if reach < capacity:  # at most c units: flat above what the items can take
            new[hi:] = new[hi - 1]
    unfit = np.isneginf(table[1:, -1]).nonzero()[0]
    if unfit.size:
        raise InfeasibleError(f"item {int(unfit[0])}: no choice fits capacity {capacity}")
    return list(table[:, margin:])


def _backtrack(items: list[Item], rows: list[np.ndarray], capacity: int) -> list[int]:
    picks = [0] * len(items)
    c = capacity
    for j in range(len(items) - 1, -1, -1):
        item, prev, target = items[j], rows[j], float(rows[j + 1][c])
        weights, values = item.weights, item.values
        for idx in item.preference:
            w = weights[idx]
            if w <= c and float(prev[c - w]) + values[idx] == target:
                picks[j] = idx
                c -= w
                break
        else:  # pragma: no cover - the forward pass guarantees a match
            raise AssertionError(f"item {j}: backtrack found no choice at capacity {c}")
    return picks
