"""Curves and costs: what the policy believes about each job.

Rules, settled once:

* **Curve.** A job's :class:`profiler.Scalability` is its accepted measured points on top of a
  prior: the user's curve if the job has one, else the configured population curve
  (``PolicyConfig.prior``), calibrated to the job's level by the median measured/prior ratio
  (a curve measured elsewhere is off by a factor more often than in shape). With neither, a job
  is believed linear at the median per-node rate of the jobs measured so far (1.0 before any),
  so a new job competes fairly until its own steps are measured.
* **Learning.** With ``learn`` on, a count's rate is accepted once its estimate is stable
  (relative CI <= ``profile_rel_ci``) and replaces the believed point when it moved by more than
  ``refine_rel_change`` (5%): the daemon's rule, which keeps a 3%-noisy monitor from re-planning
  at every report. A profiling job's points enter when its profile ends.
* **Costs.** The job's own measured pauses (median per direction) when it has any, else the
  median over the other live jobs' (rescales cost about the same on one machine), else the
  configured defaults; ``rescale_costs = "configured"`` always uses the defaults.
"""

from __future__ import annotations

import statistics
from typing import Iterable, Mapping

from policy.config import CostSource, PolicyConfig
from policy.model import Curve, JobEvidence, JobView
from profiler.jpa import default_counts
from profiler.scalability import Scalability, Source


def scalability(job: JobView, measured: Mapping[int, float], prior: Curve | None,
                guess_per_node: float) -> Scalability:
    """The job's curve under the rules of the module doc."""
    pts = {n: r for n, r in measured.items() if r > 0}
    base = job.scaling or prior
    if base:
        return Scalability(prior=base, measured=pts, source=Source.REFINED if pts else Source.USER)
    if pts:
        return Scalability.profiled(pts)
    return Scalability.from_user({1: guess_per_node})


def allocator_curve(job: JobView, scal: Scalability) -> dict[int, float]:
    """The allocator's curve: the default profiling counts and every measured or prior count in range
    (the allocator interpolates linearly between; a 64-point table costs ~10x more to solve)."""
    lo, hi = job.min_nodes, job.max_nodes
    wanted = set(default_counts(lo, hi)) | {n for n in scal.points if lo <= n <= hi}
    return {n: max(0.0, r) for n, r in scal.scaling_for(lo, hi, counts=wanted).items()}


def guess_per_node(curves: Iterable[Mapping[int, float]], population: Iterable[float]) -> float:
    """Median per-node rate at the smallest measured count over ``curves`` and ``population``; 1.0 if none."""
    rates = [r for r in population if r > 0]
    for c in curves:
        if c:
            n = min(c)
            if c[n] > 0:
                rates.append(c[n] / n)
    return statistics.median(rates) if rates else 1.0


def accept(evidence: JobEvidence, known: Mapping[int, float], job: JobView, cfg: PolicyConfig) -> dict[int, float]:
    """The points of ``evidence`` that enter the job's curve now (empty: nothing new)."""
    new: dict[int, float] = {}
    for n, est in evidence.rates.items():
        if not job.min_nodes <= n <= job.max_nodes or est.rel_ci > cfg.profile_rel_ci or not est.rate > 0:
            continue
        old = known.get(n)
        if old is None or abs(est.rate - old) > cfg.refine_rel_change * old:
            new[n] = est.rate
    return new


def rescale_costs(own: JobEvidence | None, others: Iterable[JobEvidence], cfg: PolicyConfig) -> tuple[float, float]:
    """(up, down) pause in seconds for the allocator."""
    if cfg.rescale_costs is CostSource.CONFIGURED:
        return cfg.default_up_cost_s, cfg.default_down_cost_s
    up = own.costs.up_s if own is not None and own.costs is not None else None
    down = own.costs.down_s if own is not None and own.costs is not None else None
    if up is None or down is None:
        ups = [e.costs.up_s for e in others if e.costs is not None and e.costs.up_s is not None]
        downs = [e.costs.down_s for e in others if e.costs is not None and e.costs.down_s is not None]
        if up is None:
            up = statistics.median(ups) if ups else cfg.default_up_cost_s
        if down is None:
            down = statistics.median(downs) if downs else cfg.default_down_cost_s
    return float(up), float(down)
