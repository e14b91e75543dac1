"""Throughput curves: samples/s at a node count, from measured points (the bottom layer).

A curve maps node counts to measured samples/s. Everything that reads one (the allocator's
objective, the profiler's plans, the policy's beliefs, the simulator's true rates) reads it the
same way, through :func:`throughput_at`. Pure and dependency-free: it imports nothing of this
project, so every layer may import it.

    from curves import throughput_at
"""

from __future__ import annotations

import bisect
from typing import Mapping

Curve = Mapping[int, float]

__all__ = ("Curve", "throughput_at")


def throughput_at(scaling: Curve, n: int) -> float:
    """Samples/s at ``n`` nodes from measured points, piecewise-linear.

    * ``n <= 0`` gives 0.
    * Between two measured counts: linear interpolation.
    * Below the smallest measured count: linear from the origin (0 nodes, 0 samples/s).
    * Above the largest measured count: flat (no evidence that more nodes help).
    """
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
