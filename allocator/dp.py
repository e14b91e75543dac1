"""Exact multiple-choice knapsack by (max,+) dynamic programming, vectorised.

``best_j[c]`` is the best value of the first ``j`` items using at most ``c``
units; ``best_j = max over choices (w, v) of shift(best_{j-1}, w) + v``. Each
choice is one ``np.maximum`` over a slice, so Python loops run over choices,
never over capacity. Every row is kept so the backtrack can find, for each item,
the first choice in its preference order that reproduces the row exactly (the
same float operations give bit-identical sums, so ties are broken
deterministically by the caller's preference order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Item:
    """One item of the knapsack: its choices' weights, values and tie-break order (plain lists)."""

    weights: list[int]  # >= 0
    values: list[float]
    preference: list[int]  # indices into weights, most preferred first

    def __post_init__(self) -> None:
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
    best = np.zeros(width)
    rows = [best]
    tmp = np.empty(width)
    reach = 0
    for pos, item in enumerate(items):
        new = np.empty(width)
        new.fill(-np.inf)
        reach = min(capacity, reach + max(item.weights, default=0))
        top = reach + 1
        for w, v in zip(item.weights, item.values):
            if w >= top:
                continue
            n = top - w
            np.add(best[:n], v, out=tmp[:n])
            np.maximum(new[w:top], tmp[:n], out=new[w:top])
        if top < width:
            new[top:] = new[reach]
        if new[capacity] == -np.inf:
            raise InfeasibleError(f"item {pos}: no choice fits capacity {capacity}")
        rows.append(new)
        best = new
    return rows


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
