"""Curves and costs: what the policy believes about each job.

Rules, settled once:

* **Curve.** A job's :class:`profiler.Scalability` is its accepted measured points on top of a
  prior: the user's curve if the job has one, else the configured population curve
  (``PolicyConfig.prior``), else the **pooled shape** of the jobs that finished (the median
  efficiency per count over the last :data:`policy.state.SHAPES_KEEP` jobs measured at two counts
  or more, once :data:`MIN_SHAPES` have), calibrated to the job's level by the median
  measured/prior ratio (a curve measured elsewhere is off by a factor more often than in shape:
  a job's first stable rate sets its level, the population its shape). With none of these, a job
  is believed linear at the median per-node rate of the jobs measured so far (1.0 before any),
  so a new job competes fairly until its own steps are measured. Above its largest measured
  count, a job measured at two counts or more is believed to gain no more than its measured
  trend allows (the last slope, decaying as ``b / n``; :func:`allocator_curve`).
* **Correction.** A measured point corrects the prior around it too, not only its own count: the
  prior is multiplied by the ratio measured / prior, interpolated in ``log n`` between the measured
  counts and held beyond them (:func:`corrected_prior`: with one measured count the level, with
  two or more the shape), and above each measured count the per-node rate is believed no higher
  than measured there (but for :data:`FIRST_INTER_NODE`, past which it may rise), below it no less. So a job measured below a linear
  belief at 13 nodes is not believed to reach the line at 16, and one measured at 1 and 8 nodes
  has the shape those two give, whatever the prior said.
* **Kin.** A job with no curve of its own measured at one count only borrows the other counts of
  its kin: the live job measured at two counts or more whose rate at that count is nearest its own,
  within :data:`KIN_TOLERANCE`, scaled to its level (:func:`kin_points`); the prior is corrected by
  them as by its own points, which replace them as they come. Under contention a job at one node is
  never grown to measure a second count, and the prior believes every such job alike: the nodes
  beyond one per job went to whichever was oldest, not to those that scale (a day of the whole
  machine, ``philly-done@0.2``, ``+78h``, seed 0: imagenet and deepspeech2 cost 55 of the 89 s per
  job the default lost to the true curves).
* **Claims.** Efficiency above linear is never believed, declared or measured: a job's own curve
  (``scaling`` in its job file) and its measured points are each cut to at most linear from their
  smaller counts (:func:`at_most_linear`) before anything else. A declared curve is a prior only: a
  measured point replaces it at its count and sets its level and shape around it (**Correction**).
  So a job that declares ``{1: 1, 2: 10^6}``, or under-reports at one count to look superlinear at
  the next, is believed linear at best, and takes no running job's nodes by it (the monitor's
  :mod:`malletrain.daemon.ratebound` bounds what it may claim at any count by what it showed before).
  A declared curve's level (its samples/s) is evidence of nothing either: with ``objective = "work"``
  the allocator divides it out, and with ``objective = "samples"`` a job whose own steps measured
  nothing yet is weighed at the population's per-node rate in the declared shape
  (:meth:`Beliefs.believed`), so ``{1: 10^6, 2: 2 x 10^6}`` takes no running job's nodes either
  (``learn = false``, the FreeTrain baseline, trusts the declaration as given). Nor is a *reported*
  level, between users: a sample is each job's own unit, which the daemon cannot check, so under
  ``objective = "samples"`` with jobs of two users or more live, each user's measured jobs are weighed
  relative to that user's fastest one, at the population's per-node rate (:func:`user_level_factors`):
  the level decides between one user's own jobs, as published, and a job reporting 10^6 samples/s a
  node from its first report takes no other user's nodes by it.
* **Learning (passive).** Every interval at every count a job runs counts, whatever gave it that
  count (the allocator, a recall, a lender's loan). With ``learn`` on, a count's rate is accepted
  once its estimate is stable
  (relative CI <= ``profile_rel_ci``) and replaces the believed point when it moved by more than
  ``refine_rel_change`` (5%): the daemon's rule, which keeps a 3%-noisy monitor from re-planning
  at every report. A profiling job's points enter when its profile ends.
* **Costs.** The job's own measured pauses (median per direction) when it has any, else the
  median over the other live jobs' (rescales cost about the same on one machine), else the
  configured defaults; ``rescale_costs = "configured"`` always uses the defaults.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping

from curves import throughput_at
from policy.config import CostSource, Objective, PolicyConfig
from policy.model import Curve, JobEvidence, JobView
from policy.state import PolicyState
from profiler.jpa import default_counts
from profiler.scalability import Scalability, Source


def scalability(job: JobView, measured: Mapping[int, float], prior: Curve | None,
                guess_per_node: float, pooled: Curve | None = None) -> Scalability:
    """The job's curve under the rules of the module doc (``pooled``: :func:`pooled_prior`)."""
    pts = at_most_linear({n: r for n, r in measured.items() if r > 0})
    base = at_most_linear(job.scaling) if job.scaling else prior or pooled
    if base and pts:
        base = corrected_prior(base, pts)
    if base:
        return Scalability(prior=base, measured=pts, source=Source.REFINED if pts else Source.USER)
    if pts:
        return Scalability.profiled(pts)
    return Scalability.from_user({1: guess_per_node})


def at_most_linear(curve: Mapping[int, float]) -> dict[int, float]:
    """``curve`` with no count above linear from a smaller one: the rate at ``n`` is at most ``n`` times
    the best per-node rate at a smaller count (the module doc's **Claims**). A curve that is linear or
    worse comes back unchanged."""
    out: dict[int, float] = {}
    best = 0.0
    for n in sorted(curve):
        r = curve[n]
        out[n] = min(r, best * n) if best > 0 else r
        if n > 0 and out[n] > 0:
            best = max(best, out[n] / n)
    return out


MIN_SHAPES = 3  # finished jobs with a shape before the pooled shape is used

FIRST_INTER_NODE = 2
"""The first count whose steps pay an inter-node allreduce: the Pollux models lose 20-70% of a node's rate
from one node to two and then scale on (bert 0.29 of its 1-node rate per node at 2 nodes, 0.42 at 4;
cifar10 0.39, 0.55), so a rate measured here bounds nothing above it (:func:`corrected_prior`), and an
upward probe from one node never stops here (:func:`policy.profiling.probe_counts`)."""


def corrected_prior(prior: Mapping[int, float], measured: Mapping[int, float]) -> dict[int, float]:
    """``prior`` corrected by what is ``measured`` (the module doc's rule): at the prior's counts, the
    powers of two up to its largest and the measured counts, the prior times the ratio measured /
    prior interpolated in ``log n`` between the measured counts (held beyond the outermost), the
    measured rates at their own counts, and above each measured count no more per node than there."""
    pts = sorted((n, r) for n, r in measured.items() if r > 0 and throughput_at(prior, n) > 0)
    if not pts:
        return dict(prior)
    top = max(max(prior), pts[-1][0])
    counts = sorted(set(prior) | {n for n, _ in pts} | {1 << k for k in range(top.bit_length()) if 1 << k <= top})
    ratios = [(math.log(n), r / throughput_at(prior, n)) for n, r in pts]
    out = {n: throughput_at(prior, n) * _interpolated(ratios, math.log(n)) for n in counts}
    out.update(dict(pts))
    for m, r in pts:  # efficiency does not rise with nodes: above m, no more per node than measured at m ...
        if m == FIRST_INTER_NODE:
            continue  # ... but past the first inter-node allreduce it may (see FIRST_INTER_NODE)
        for n in counts:
            if n > m and n not in measured:
                out[n] = min(out[n], r * n / m)
    for m, r in pts:  # ... and below m, no less per node than measured at m
        for n in counts:
            if n < m and n not in measured:
                out[n] = max(out[n], r * n / m)
    return out


def _interpolated(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear through ``points`` (sorted by x), constant beyond the ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (xa, ya), (xb, yb) in zip(points, points[1:]):
        if x <= xb:
            return ya + (yb - ya) * (x - xa) / (xb - xa) if xb > xa else yb
    return points[-1][1]


def shape_of(points: Mapping[int, float]) -> dict[int, float] | None:
    """A finished job's curve shape: efficiency ``rate(n) / (n * rate(n0) / n0)`` at each measured
    count, ``n0`` the smallest (None with fewer than two counts)."""
    pts = {n: r for n, r in points.items() if r > 0}
    if len(pts) < 2:
        return None
    n0 = min(pts)
    per_node = pts[n0] / n0
    return {n: r / (n * per_node) for n, r in sorted(pts.items())}


def efficiency_at(shape: Mapping[int, float], n: int) -> float | None:
    """Linear interpolation of ``shape`` at ``n`` inside its range (None outside)."""
    counts = sorted(shape)
    if not counts[0] <= n <= counts[-1]:
        return None
    for a, b in zip(counts, counts[1:]):
        if a <= n <= b:
            return shape[a] + (shape[b] - shape[a]) * (n - a) / (b - a)
    return shape[counts[0]]


def pooled_prior(shapes: Iterable[Mapping[int, float]], per_node: float) -> dict[int, float] | None:
    """The population prior: median efficiency per count over ``shapes`` (each used inside the range
    it was measured on), as a curve at ``per_node`` samples/s per node; beyond the pooled range the
    last efficiency is kept. None with fewer than :data:`MIN_SHAPES` shapes."""
    shapes = [s for s in shapes if s]
    if len(shapes) < MIN_SHAPES:
        return None
    top = max(max(s) for s in shapes)
    counts = sorted({1 << k for k in range(top.bit_length())} | {top} | {n for s in shapes for n in s})
    out: dict[int, float] = {}
    for n in counts:
        effs = [e for s in shapes if (e := efficiency_at(s, n)) is not None]
        if effs:
            out[n] = n * per_node * min(1.0, statistics.median(effs)) if n > 1 else per_node
    # efficiency never rises with the count in the prior (a median over different ranges could)
    best = math.inf
    for n in sorted(out):
        eff = out[n] / (n * per_node)
        best = min(best, eff)
        out[n] = n * per_node * best
    return out


def allocator_curve(job: JobView, scal: Scalability) -> dict[int, float]:
    """The allocator's curve: the default profiling counts and every measured or prior count in range
    (the allocator interpolates linearly between; a 64-point table costs ~10x more to solve)."""
    lo, hi = job.min_nodes, job.max_nodes
    wanted = set(default_counts(lo, hi)) | {n for n in scal.points if lo <= n <= hi}
    curve = {n: max(0.0, r) for n, r in scal.scaling_for(lo, hi, counts=wanted).items()}
    return _no_better_than_measured_trend(curve, scal.measured)


def _no_better_than_measured_trend(curve: dict[int, float], measured: Mapping[int, float]) -> dict[int, float]:
    """Above its largest measured count ``b``, a job gains per node no more than the slope ``g`` it
    showed between its two largest measured counts above one node (a curve is concave past its first
    inter-node allreduce, not across it: the Pollux models lose 20-70% of a node's rate from one node
    to two, then scale on), decaying as ``b / n`` (a concave curve's slope
    falls as it goes): at most ``r(b) + g * b * ln(n / b)``. Without this, a prior shape calibrated
    on a job that scales worse than the population promises gains it will not give, and a job
    past its peak is grown further. (A day of the stress workload, seed 0: regret vs milp-true 2.9%
    uncapped, 2.1% with a straight-line cap, 1.75% with this one.)"""
    pts = sorted((n, r) for n, r in measured.items() if r > 0 and n > 1)
    if len(pts) < 2:  # the step from one node to two is the first inter-node allreduce: no trend across it
        return curve
    (a, ra), (b, rb) = pts[-2], pts[-1]
    slope = (rb - ra) / (b - a)
    return {n: (min(r, max(0.0, rb + slope * b * math.log(n / b))) if n > b else r) for n, r in curve.items()}


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
    lo, hi, max_ci, change = job.min_nodes, job.max_nodes, cfg.profile_rel_ci, cfg.refine_rel_change
    new: dict[int, float] = {}
    for n, est in evidence.rates.items():
        rate = est.rate
        if not lo <= n <= hi or est.rel_ci > max_ci or not rate > 0:
            continue
        old = known.get(n)
        if old is None or abs(rate - old) > change * old:
            new[n] = rate
    return new


def rescale_costs(own: JobEvidence | None, others: Iterable[JobEvidence], cfg: PolicyConfig,
                  pooled: tuple[float, float] | None = None) -> tuple[float, float]:
    """(up, down) pause in seconds for the allocator: the job's own medians, else the other jobs'
    (``pooled``: :func:`pooled_rescale_costs` of ``others``, when the caller has it already)."""
    if cfg.rescale_costs is CostSource.CONFIGURED:
        return cfg.default_up_cost_s, cfg.default_down_cost_s
    up = own.costs.up_s if own is not None and own.costs is not None else None
    down = own.costs.down_s if own is not None and own.costs is not None else None
    if up is None or down is None:
        pool_up, pool_down = pooled if pooled is not None else pooled_rescale_costs(others, cfg)
        if up is None:
            up = pool_up
        if down is None:
            down = pool_down
    return float(up), float(down)


def pooled_rescale_costs(others: Iterable[JobEvidence], cfg: PolicyConfig) -> tuple[float, float]:
    """(up, down): the medians of the pauses measured over ``others``, else the configured defaults."""
    others = list(others)
    ups = [e.costs.up_s for e in others if e.costs is not None and e.costs.up_s is not None]
    downs = [e.costs.down_s for e in others if e.costs is not None and e.costs.down_s is not None]
    return (float(statistics.median(ups)) if ups else cfg.default_up_cost_s,
            float(statistics.median(downs)) if downs else cfg.default_down_cost_s)


def absorbs(job: JobView, curve: Mapping[int, float], knee: float) -> int:
    """The nodes ``job`` can put to use: its max, or the count past which its believed ``curve`` gains
    less than ``knee`` of its per-node rate at its min for each further node (a job past its knee
    wastes nodes another job would use better). The curve is the corrected one (:func:`corrected_prior`):
    admission weighs what was measured around each count, not the prior alone."""
    counts = sorted(n for n in curve if job.min_nodes <= n <= job.max_nodes)
    if knee > 0 and len(counts) >= 2 and curve[counts[0]] > 0:
        floor = knee * curve[counts[0]] / counts[0]
        for a, b in zip(counts, counts[1:]):
            if (curve[b] - curve[a]) / (b - a) < floor:
                return a
    return job.max_nodes


def efficiency_spread(shapes: Iterable[Mapping[int, float]], n: int) -> float | None:
    """The relative spread (p90 - p10 over the median) of the efficiencies of ``shapes`` at ``n``
    (None where fewer than :data:`MIN_SHAPES` of them cover ``n``)."""
    effs = sorted(e for sh in shapes if (e := efficiency_at(sh, n)) is not None)
    if len(effs) < MIN_SHAPES:
        return None
    mid = effs[len(effs) // 2]
    return (effs[int(0.9 * (len(effs) - 1))] - effs[int(0.1 * (len(effs) - 1))]) / mid if mid > 0 else 0.0


KIN_TOLERANCE = 0.025
"""How near two jobs' rates at one count must be (relative) for one to borrow the other's shape
(:func:`kin_points`): the Pollux models' 1-node rates are 5% apart or more (bert and yolov3, the
nearest, also scale alike), and a stable estimate is within 2% of its job's rate."""


class KinIndex:
    """The live jobs measured at two counts or more, by their rate at each count they were measured at
    (sorted), made from a copy of their points (:meth:`Beliefs.population` keeps one while the points
    are unchanged); the index is built from that copy the first time a job asks for its kin."""

    def __init__(self, measured: Mapping[str, Mapping[int, float]]) -> None:
        self._copy = [(job_id, dict(pts)) for job_id, pts in measured.items()]
        self.points: dict[str, dict[int, float]] = {}  # filled with the index, by :meth:`nearest`
        self.rates: dict[int, list[tuple[float, str]]] | None = None
        self._given: dict[str, tuple[dict[int, float], dict[int, float]]] = {}  # job: (its points, kin_points)

    def points_for(self, job_id: str, measured: Mapping[int, float]) -> dict[int, float]:
        """:func:`kin_points` of ``job_id`` with its ``measured`` points, worked out again only when they
        differ from the last ones it was asked with (the index is fixed: a job's kin does not move)."""
        hit = self._given.get(job_id)
        if hit is not None and hit[0] == measured:
            return hit[1]
        out = kin_points(job_id, measured, self)
        self._given[job_id] = (dict(measured), out)
        return out

    def _index(self) -> dict[int, list[tuple[float, str]]]:
        by_count: dict[int, list[tuple[float, str]]] = {}
        for job_id, pts in self._copy:
            good = {n: r for n, r in pts.items() if r > 0}
            if len(good) < 2:
                continue
            self.points[job_id] = good
            for n, r in good.items():
                by_count.setdefault(n, []).append((r, job_id))
        self.rates = {n: sorted(v) for n, v in by_count.items()}
        return self.rates

    def nearest(self, job_id: str, n: int, rate: float) -> str | None:
        """The job (not ``job_id``) whose rate at ``n`` is nearest ``rate``, within :data:`KIN_TOLERANCE`."""
        rows = (self.rates if self.rates is not None else self._index()).get(n)
        if not rows:
            return None
        k = bisect.bisect_left(rows, (rate, ""))
        best: tuple[float, str] | None = None
        for r, other in rows[max(0, k - 2): k + 2]:
            off = abs(r - rate) / rate
            if other != job_id and off <= KIN_TOLERANCE and (best is None or off < best[0]):
                best = (off, other)
        return best[1] if best is not None else None


def kin_points(job_id: str, measured: Mapping[int, float], kin: KinIndex | None) -> dict[int, float]:
    """``measured`` (a job's own points), and where it was measured at one count only, the points of
    its **kin** at the other counts: the live job measured at two counts or more whose rate at that
    count is nearest its own, within :data:`KIN_TOLERANCE`, scaled to its level (rate there over the
    kin's). Jobs that train the same model at the same batch on the same nodes run at the same rate:
    a rate alike is the best sign of a shape alike the policy has, and a job at one count has nothing
    else (under contention it is never grown to measure one). Its own points replace borrowed ones as
    they come; a wrong kin is corrected the same way."""
    own = {n: r for n, r in measured.items() if r > 0}
    if kin is None or len(own) != 1:
        return dict(measured)
    ((n, rate),) = own.items()
    other = kin.nearest(job_id, n, rate)
    if other is None:
        return dict(measured)
    theirs = kin.points[other]
    scale = rate / theirs[n]
    out = {m: r * scale for m, r in theirs.items() if m != n}
    out.update(measured)
    return out


class PriorSpread:
    """How unsure the population prior is at each count (:func:`efficiency_spread` of the shapes of the
    jobs that finished), and the pooled prior those shapes give (:func:`pooled_prior`), made from a copy
    of the shapes (compared by value, once per decision: :meth:`Beliefs.spread` makes a new one when
    they change); a count's figure and the prior at a guess are worked out the first time they are
    asked for and held here, so each is computed once per set of shapes, not once per job and decision."""

    def __init__(self, shapes: Iterable[Mapping[int, float]]) -> None:
        self.shapes = [dict(sh) for sh in shapes]
        self._at: dict[int, float | None] = {}
        self._pooled: tuple[float, dict[int, float] | None] | None = None  # the last guess and its prior

    def at(self, n: int) -> float | None:
        """:func:`efficiency_spread` of the shapes at ``n``."""
        if n not in self._at:
            self._at[n] = efficiency_spread(self.shapes, n)
        return self._at[n]

    def pooled(self, guess: float) -> dict[int, float] | None:
        """:func:`pooled_prior` of the shapes at ``guess`` (made again when the guess moved)."""
        if self._pooled is None or self._pooled[0] != guess:
            self._pooled = (guess, pooled_prior(self.shapes, guess))
        return self._pooled[1]


def user_level_factors(jobs: Iterable[JobView], measured: Mapping[str, Mapping[int, float]],
                       guess: float) -> dict[str, float]:
    """What each measured job's reported level is multiplied by under ``objective = "samples"`` when
    jobs of two users or more are live (the module doc's **Claims**): ``guess / R``, ``R`` the best
    per-node rate at the smallest measured count over the job's user's measured jobs, so each user's
    fastest job is weighed at the population's per-node rate ``guess`` and the others in proportion.
    Empty with one user (the level decides as reported) or no guess."""
    live = list(jobs)
    if len({j.user for j in live}) < 2 or not guess > 0:
        return {}
    level: dict[str, float] = {}
    for j in live:
        pts = {n: r for n, r in measured.get(j.id, {}).items() if n > 0 and r > 0}
        if pts:
            n0 = min(pts)
            level[j.id] = pts[n0] / n0
    best: dict[str, float] = {}
    for j in live:
        if j.id in level:
            best[j.user] = max(best.get(j.user, 0.0), level[j.id])
    return {j.id: guess / best[j.user] for j in live if j.id in level}


@dataclass(frozen=True)
class Population:
    """What the jobs measured so far say about a job with no curve of its own: the median per-node
    rate (:func:`guess_per_node`), the pooled prior at it (:func:`pooled_prior`; None with too
    few shapes) and the spread of the shapes per count (:class:`PriorSpread`; None: not asked for)."""

    guess: float
    pooled: dict[int, float] | None
    spread: PriorSpread | None = None
    kin: KinIndex | None = None  # the live jobs' shapes by rate (:func:`kin_points`; None: learning off)


@dataclass(frozen=True)
class Believed:
    """One job's believed curve (``raw``, samples/s), the allocator's curve made from it (``scaled``)
    and the nodes the job absorbs on it, with what they were made of: the job's own curve and range,
    its measured points, and the population's guess and pooled prior when it uses them (copies:
    compared by value)."""

    scaling: dict[int, float] | None
    min_nodes: int
    max_nodes: int
    measured: dict[int, float]
    population: tuple[float, dict[int, float] | None] | None
    raw: dict[int, float]
    scaled: dict[int, float]
    absorbs: int
    level_factor: float | None = None
    """Its :func:`user_level_factors` entry when it applied (None: none)."""

    def made_of(self, job: JobView, measured: Mapping[int, float],
                population: tuple[float, dict[int, float] | None] | None, level_factor: float | None = None) -> bool:
        """Whether these curves were made of exactly what ``job`` has now (all by value)."""
        return (self.min_nodes == job.min_nodes and self.max_nodes == job.max_nodes
                and self.measured == measured and self.population == population
                and self.scaling == (job.scaling or None) and self.level_factor == level_factor)


@dataclass(frozen=True)
class Guess:
    """The population's per-node rate, with the state it was computed from (copies: compared by value)."""

    measured: dict[str, dict[int, float]]
    population: list[float]
    guess: float
    kin: KinIndex  # the live jobs' shapes by rate, from ``measured`` (indexed when first asked)


class Beliefs:
    """The curves the policy believes, from its config and state, under this module's rules.

    Curves are remembered per job (:class:`Believed`) with everything they are made of, compared by
    value: a curve is made again exactly when one of those changed, and a state changed by hand (a
    test, a restart) is read as it is now. The population's guess and pooled prior are remembered the
    same way (the pooled prior with the spread, by :class:`PriorSpread`).
    """

    def __init__(self, config: PolicyConfig, state: PolicyState) -> None:
        self.config = config
        self.state = state
        self._curves: dict[str, Believed] = {}
        self._guess: Guess | None = None
        self._spread: PriorSpread | None = None  # the finished jobs' shapes, their spread and pooled prior
        self._levels: dict[str, float] = {}  # this decision's user_level_factors (weigh_levels)

    def guess(self) -> float:
        """The population's per-node rate (:func:`guess_per_node`) as the state stands."""
        st, memo = self.state, self._guess
        if memo is None or memo.measured != st.measured:
            measured = {k: dict(v) for k, v in st.measured.items()}
            memo = self._guess = Guess(measured, list(st.population), guess_per_node(measured.values(), st.population),
                                       KinIndex(measured))
        elif memo.population != st.population:  # the kin read the measured points only: kept
            memo = self._guess = Guess(memo.measured, list(st.population),
                                       guess_per_node(memo.measured.values(), st.population), memo.kin)
        return memo.guess

    def pooled_prior(self, guess: float) -> dict[int, float] | None:
        """The population prior pooled from the shapes of the jobs that finished, at ``guess``."""
        return self.spread().pooled(guess)

    def spread(self) -> PriorSpread:
        """The spread of the finished jobs' shapes per count (:class:`PriorSpread`), made again only
        when the shapes changed."""
        memo = self._spread
        if memo is None or memo.shapes != self.state.shapes:
            memo = self._spread = PriorSpread(self.state.shapes)
        return memo

    def population(self) -> Population:
        """The :class:`Population` as the state stands (a decision takes it once its points are settled)."""
        guess, spread = self.guess(), self.spread()  # the shapes compared once
        assert self._guess is not None  # made by guess()
        kin = self._guess.kin if self.config.learn else None  # kept while the measured points are unchanged
        return Population(guess, spread.pooled(guess) if self.config.prior is None else None, spread, kin)

    def weigh_levels(self, live: Iterable[JobView]) -> None:
        """Under ``objective = "samples"`` with learning on, this decision's :func:`user_level_factors` of
        the ``live`` jobs, used by :meth:`believed` (the module doc's **Claims**); none otherwise."""
        on = self.config.objective is Objective.SAMPLES and self.config.learn
        self._levels = user_level_factors(live, self.state.measured, self.guess()) if on else {}

    def _uses_pool(self, job: JobView) -> bool:
        return not job.scaling and self.config.prior is None

    def scalability(self, job: JobView, population: Population | None = None) -> Scalability:
        """What the policy believes about ``job`` now."""
        pop = population if population is not None else self.population()
        pooled = pop.pooled if self._uses_pool(job) else None
        measured = self._with_kin(job, self.state.measured.get(job.id, {}), pop)
        return scalability(job, measured, self.config.prior_curve, pop.guess, pooled)

    def curves(self, job: JobView, population: Population | None = None) -> tuple[dict[int, float], dict[int, float]]:
        """``job``'s believed curve (samples/s) and the allocator's curve made from it (in 1-node
        equivalents with ``objective = "work"``); ``population``: :meth:`population`, when the caller
        has it."""
        b = self.believed(job, population)
        return b.raw, b.scaled

    def absorbs(self, job: JobView, population: Population | None = None) -> int:
        """The nodes ``job`` can put to use (:func:`absorbs` on its believed curve)."""
        return self.believed(job, population).absorbs

    def believed(self, job: JobView, population: Population | None = None) -> Believed:
        """What the policy believes about ``job`` (:class:`Believed`), made again only when what it is
        made of changed."""
        own = self.state.measured.get(job.id, {})
        uses_pool = self._uses_pool(job)
        unproven = self._declared_level_unproven(job, own)
        pop = population if population is not None or not (uses_pool or unproven) else self.population()
        measured = self._with_kin(job, own, pop)
        pop_part = ((pop.guess, pop.pooled or None) if uses_pool and pop
                    else (pop.guess, None) if unproven and pop else None)
        factor = self._levels.get(job.id)
        hit = self._curves.get(job.id)
        if hit is not None and hit.made_of(job, measured, pop_part, factor):
            return hit
        pooled = pop.pooled if uses_pool and pop is not None else None
        raw = allocator_curve(job, scalability(job, measured, self.config.prior_curve,
                                               pop.guess if uses_pool and pop is not None else 1.0, pooled))
        scaled = raw
        one = throughput_at(raw, 1)
        if self.config.objective in (Objective.WORK, Objective.COMPLETION):  # 1-node equivalents: rate(n) / rate(1)
            scaled = {n: v / one for n, v in raw.items()} if one > 0 else raw
        elif unproven and pop is not None and one > 0:  # samples: the declared shape at the population's level
            scaled = {n: v / one * pop.guess for n, v in raw.items()}
        elif factor is not None:  # samples, two users: the level relative to its user's fastest job
            scaled = {n: v * factor for n, v in raw.items()}
        made = self._curves[job.id] = Believed(
            dict(job.scaling) if job.scaling else None, job.min_nodes, job.max_nodes, dict(measured),
            pop_part, raw, scaled, absorbs(job, raw, self.config.admission_knee), factor)
        return made

    def _with_kin(self, job: JobView, own: Mapping[int, float], pop: Population | None) -> dict[int, float]:
        """``job``'s points for its curve: its own, and its kin's (:func:`kin_points`) when it has no
        curve of its own (a declared curve says more about its shape than a rate alike)."""
        if pop is None or pop.kin is None or job.scaling:
            return dict(own)
        return pop.kin.points_for(job.id, own)

    def _declared_level_unproven(self, job: JobView, measured: Mapping[int, float]) -> bool:
        """Whether the allocator weighs ``job`` at the population's level rather than its declared one:
        under ``objective = "samples"`` with learning on, a job with a curve of its own whose steps
        measured nothing yet (the module doc's **Claims**)."""
        return (self.config.objective is Objective.SAMPLES and self.config.learn and bool(job.scaling)
                and not any(r > 0 for r in measured.values()))

    def forget(self, live: Iterable[str]) -> None:
        """Drop the curves of jobs not in ``live``."""
        keep = set(live)
        for job_id in [k for k in self._curves if k not in keep]:
            del self._curves[job_id]
