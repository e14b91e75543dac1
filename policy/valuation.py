"""Node valuation: how long the nodes on offer are expected to stay. Pure.

``learned`` weighs a rescale over ``E[L - a | L > a]`` (``L`` the lengths of idle fragments that ended, ``a`` how
long the node has been idle), cut at a known recall time, the median over the nodes, clipped to ``[horizon_min_s,
horizon_max_s]`` and rounded to a geometric grid (so a decision with nothing new is still recognised as one).
"""

from __future__ import annotations

import bisect
import math
import statistics
from typing import Iterable, Mapping, Sequence

MIN_FRAGMENTS = 20  # fragments seen before the learned distribution is trusted
_GRID = 1.25  # horizons are rounded to powers of this


class FragmentModel:
    """The empirical fragment-length distribution, with the conditional mean remaining life."""

    def __init__(self, lengths: Iterable[float]) -> None:
        self.lengths = sorted(x for x in lengths if x >= 0 and math.isfinite(x))
        # suffix sums: tail[i] = sum(lengths[i:])
        self._tail = [0.0] * (len(self.lengths) + 1)
        for i in range(len(self.lengths) - 1, -1, -1):
            self._tail[i] = self._tail[i + 1] + self.lengths[i]

    def __len__(self) -> int:
        return len(self.lengths)

    def expected_remaining(self, age: float) -> float | None:
        """``E[L - age | L > age]``; None when no fragment outlived ``age``."""
        i = bisect.bisect_right(self.lengths, age)
        k = len(self.lengths) - i
        if k == 0:
            return None
        return self._tail[i] / k - age


def node_horizon(model: FragmentModel, age: float, recall_in: float | None, cap: float) -> float:
    """A node's expected remaining idle time (``cap`` when no fragment outlived its age)."""
    rem = model.expected_remaining(age)
    value = cap if rem is None else rem
    if recall_in is not None:
        value = min(value, max(0.0, recall_in))
    return value


def learned_horizon(nodes: Sequence[str], now: float, idle_since: Mapping[str, float], recall_at: Mapping[str, float],
                    model: FragmentModel, lo: float, hi: float, fallback: float) -> float:
    """The horizon for a decision offering ``nodes`` (the module doc's rule)."""
    known_recall = [n for n in nodes if n in recall_at]
    if len(model) < MIN_FRAGMENTS and not known_recall:
        return fallback
    values = []
    for n in nodes:
        recall_in = recall_at[n] - now if n in recall_at else None
        if len(model) < MIN_FRAGMENTS:
            values.append(min(fallback, max(0.0, recall_in)) if recall_in is not None else fallback)
        else:
            values.append(node_horizon(model, max(0.0, now - idle_since.get(n, now)), recall_in, hi))
    if not values:
        return fallback
    h = min(hi, max(lo, statistics.median(values)))
    return round_to_grid(h, lo, hi)


def round_to_grid(h: float, lo: float, hi: float) -> float:
    k = round(math.log(h) / math.log(_GRID))
    return min(hi, max(lo, _GRID ** k))
