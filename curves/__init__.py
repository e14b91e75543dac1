"""Throughput curves: samples/s at a node count, from measured points (the bottom layer).

Everything that reads a curve (allocator, profiler, policy, simulator) reads it through
:func:`throughput_at`. Imports nothing of this project, so every layer may import it.
"""

from __future__ import annotations

import bisect
from typing import Mapping

Curve = Mapping[int, float]

__all__ = ("Curve", "throughput_at")


def throughput_at(scaling: Curve, n: int) -> float:
    """Samples/s at ``n`` nodes, piecewise-linear between measured points: 0 at ``n <= 0``, linear
    from the origin below the smallest, flat above the largest (no evidence more nodes help)."""
    if n <= 0 or not scaling:
        return 0.0
    if n in scaling:
        return float(scaling[n])
    xs = sorted(scaling)
    if n > xs[-1]:
        return float(scaling[xs[-1]])
    i = bisect.bisect_left(xs, n)
    x1, y1 = xs[i], float(scaling[xs[i]])
    if i == 0:
        x0, y0 = 0, 0.0
    else:
        x0, y0 = xs[i - 1], float(scaling[xs[i - 1]])
    return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
