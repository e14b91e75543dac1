"""The one place where the daemon turns what it knows about a job into allocator input.

A job's curve for :class:`allocator.Job.scaling`, in order of preference:

1. user-given points (the job file's ``scaling``), calibrated and completed by
   what was measured (:class:`profiler.scalability.Scalability`);
2. measured points only (profiled by the JPA, or refined while it ran);
3. nothing known: **linear** from a guessed 1-node rate, ``guess * n``. The
   guess is the median 1-node rate of the jobs measured so far (1.0 if none),
   so a new job competes fairly until its own steps are measured; a job with
   ``profile = true`` is profiled by :mod:`profiler.jpa` before it runs.
"""

from __future__ import annotations

import statistics
from typing import Iterable, Mapping

from malletrain.jobspec import JobSpec
from profiler.scalability import Scalability, Source


def scalability_of(spec: JobSpec, measured: Mapping[int, float]) -> Scalability | None:
    pts = {n: r for n, r in measured.items() if r > 0}
    if spec.scaling:
        return Scalability(prior=spec.scaling, measured=pts, source=Source.REFINED if pts else Source.USER)
    if pts:
        return Scalability.profiled(pts)
    return None


def allocator_scaling(spec: JobSpec, measured: Mapping[int, float], guess_rate: float) -> dict[int, float]:
    """Samples/s at every count in ``[min_nodes, max_nodes]`` for the allocator."""
    sc = scalability_of(spec, measured)
    if sc is None:
        return {n: guess_rate * n for n in range(spec.min_nodes, spec.max_nodes + 1)}
    return {n: max(0.0, r) for n, r in sc.scaling_for(spec.min_nodes, spec.max_nodes).items()}


def guess_one_node_rate(curves: Iterable[Mapping[int, float]]) -> float:
    """Median 1-node rate over known curves (1.0 if none)."""
    ones = []
    for c in curves:
        if not c:
            continue
        n = min(c)
        if c[n] > 0:
            ones.append(c[n] / n)
    return statistics.median(ones) if ones else 1.0
