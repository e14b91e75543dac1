"""Per-job value tables: the objective contribution of every allowed node count.

Nodes are interchangeable, so the allocation problem is a multiple-choice
knapsack over node *counts*: job ``j`` takes exactly one count from
``{0} ∪ [min_j, min(max_j, capacity)]`` and earns ``job.value(count, horizon)``.
:class:`Tables` holds all jobs in one padded (jobs x choices) numpy array,
built with one ``np.interp`` per distinct scalability curve and matching
:func:`allocator.model.throughput_at` (origin below the first point, linear in
between, flat above the last) and :meth:`allocator.model.Job.rescale_cost`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from allocator.model import Job, Problem


@dataclass(frozen=True)
class ValueTable:
    """Allowed counts of one job (ascending, starting with 0) and their values."""

    job: Job
    counts: np.ndarray  # int64, ascending, counts[0] == 0
    values: np.ndarray  # float64, same length
    current_index: int  # index of the job's current count, -1 if not allowed

    def preference(self) -> np.ndarray:
        """Indices in tie-break order: the current count first, then ascending counts."""
        idx = np.arange(self.counts.size)
        cur = self.current_index
        if cur <= 0:
            return idx
        return np.concatenate([[cur], idx[:cur], idx[cur + 1 :]])


@dataclass(frozen=True)
class Tables:
    """All jobs' value tables, padded to a (jobs x choices) array.

    Row ``j`` holds ``sizes[j]`` valid choices (counts ascending, ``counts[j, 0] == 0``);
    padding has count 0 and value ``-inf`` so it is never chosen.
    """

    jobs: tuple[Job, ...]
    counts: np.ndarray  # int64 (J, K)
    values: np.ndarray  # float64 (J, K)
    sizes: np.ndarray  # int64 (J,)
    current_index: np.ndarray  # int64 (J,), -1 where the current count is not allowed
    envelopes: tuple[Envelope, ...]  # each row's upper concave envelope for multipliers >= 0 (:func:`envelope`)

    def __len__(self) -> int:
        return len(self.jobs)

    def table(self, j: int) -> ValueTable:
        k = int(self.sizes[j])
        return ValueTable(self.jobs[j], self.counts[j, :k], self.values[j, :k], int(self.current_index[j]))

    def all(self) -> list[ValueTable]:
        return [self.table(j) for j in range(len(self.jobs))]

    def preferred_best(self, values: np.ndarray | None = None) -> np.ndarray:
        """Each row's best index; ties go to the current count, then the smallest count."""
        vals = self.values if values is None else values
        first: np.ndarray = vals.argmax(axis=1)
        if not len(self.jobs):
            return first
        rows = np.arange(len(self.jobs))
        cur = self.current_index
        safe = np.where(cur >= 0, cur, 0)
        at_top = (cur >= 0) & (vals[rows, safe] == vals[rows, first])
        return np.where(at_top, safe, first)


def curve_throughputs(scaling: Mapping[int, float], counts: np.ndarray) -> np.ndarray:
    """Samples/s at each count (any shape), vectorised ``throughput_at``."""
    xs = sorted(scaling)
    px = np.array([0.0] + [float(x) for x in xs])
    py = np.array([0.0] + [float(scaling[x]) for x in xs])
    out: np.ndarray = np.interp(counts.astype(np.float64), px, py)
    out[counts <= 0] = 0.0
    return out


def throughputs(job: Job, counts: np.ndarray) -> np.ndarray:
    return curve_throughputs(dict(job.scaling), counts)


def build_tables(problem: Problem, memo: RowMemo | None = None) -> Tables:
    """Every job's value row, padded to one array, with each row's envelope (``memo``: rows of jobs
    valued before, see :class:`RowMemo`)."""
    jobs = problem.jobs
    cap = problem.total_nodes
    # a job's row runs to its max; the pool may hold fewer nodes: 0, then min..min(max, cap)
    sizes = [1 + max(0, min(job.max_nodes, cap) - job.min_nodes + 1) for job in jobs]
    width = max(sizes, default=1)
    counts = np.zeros((len(jobs), width), np.int64)
    values = np.full((len(jobs), width), -np.inf)
    current_index = np.full(len(jobs), -1, np.int64)
    envelopes = []
    for j, (job, k) in enumerate(zip(jobs, sizes)):
        row, envelope_k = memo.row(job, problem.horizon_s, k) if memo is not None else \
            _row_and_envelope(job, problem.horizon_s, k)
        counts[j, :k] = row.counts[:k]
        values[j, :k] = row.values[:k]
        if row.current_index < k:
            current_index[j] = row.current_index
        envelopes.append(envelope_k)
    return Tables(jobs, counts, values, np.array(sizes, np.int64), current_index, tuple(envelopes))


@dataclass(frozen=True)
class Envelope:
    """The segments of a row's upper concave envelope with a positive slope, from count 0 on: with
    multiplier ``lam``, the row's best choice (``max value - lam * count``, ties to the smaller count)
    is its count 0 plus the ``steps`` of every segment whose ``slope`` exceeds ``lam``."""

    slopes: tuple[float, ...]  # descending, > 0
    steps: tuple[int, ...]  # > 0


def envelope(points: list[tuple[int, float]]) -> Envelope:
    """The :class:`Envelope` of a row whose values are linear between consecutive ``points`` ((count,
    value), counts ascending, the first the row's count 0 and the last its end): its hull is theirs."""
    hull: list[tuple[int, float]] = []
    for x, y in points:
        while len(hull) >= 2:
            (x0, y0), (x1, y1) = hull[-2], hull[-1]
            if (x1 - x0) * (y - y0) - (y1 - y0) * (x - x0) >= 0:  # the last point is not above the chord
                hull.pop()
            else:
                break
        hull.append((x, y))
    slopes: list[float] = []
    steps: list[int] = []
    for (x0, y0), (x1, y1) in zip(hull, hull[1:]):
        slope = (y1 - y0) / (x1 - x0)
        if not slope > 0:
            break  # concave: every later segment falls too
        slopes.append(slope)
        steps.append(x1 - x0)
    return Envelope(tuple(slopes), tuple(steps))


@dataclass(frozen=True)
class ValueRow:
    """A job's counts (0, then min..max), the value of each over the horizon, and the index of its
    current count (-1 where that count is not allowed)."""

    counts: np.ndarray  # int64, ascending
    values: np.ndarray  # float64, same length
    current_index: int


def gains(job: Job, horizon_s: float) -> tuple[np.ndarray, np.ndarray]:
    """``job``'s counts (0, then min..max) and what each earns over the horizon before any rescale
    pause: the horizon times the rate, with one ``np.interp``."""
    counts = np.concatenate([np.zeros(1, np.int64), np.arange(job.min_nodes, job.max_nodes + 1, dtype=np.int64)])
    return counts, horizon_s * curve_throughputs(job.scaling, counts)


def value_row(job: Job, horizon_s: float, earned: tuple[np.ndarray, np.ndarray] | None = None) -> ValueRow:
    """``job.value(count, horizon_s)`` at every count 0, min..max: :func:`gains` (``earned``, when the
    caller has them) less the rescale pause (counts ascend, so the counts above the current one are a
    suffix, those below it a prefix)."""
    counts, earns = earned if earned is not None else gains(job, horizon_s)
    values = earns.copy()
    cur, lo = job.current, job.min_nodes
    index = 0 if cur == 0 else (cur - lo + 1 if lo <= cur <= job.max_nodes else -1)
    if cur:
        rate = job.throughput(cur)
        below, above = (index, index + 1) if index >= 0 else ((1, 1) if cur < lo else (counts.size, counts.size))
        values[above:] -= rate * job.up_cost_s
        values[:below] -= rate * job.down_cost_s
    return ValueRow(counts, values, index)


def row_envelope(job: Job, values: np.ndarray) -> Envelope:
    """The envelope of a row's first ``values.size`` choices. The values are linear between the
    curve's points, the min, the current count and its neighbours, and the row's last count."""
    lo, top = job.min_nodes, job.min_nodes + values.size - 2  # the last count (below lo: count 0 only)
    vals = values.tolist()
    if top < lo:
        return envelope([(0, vals[0])])
    at = {lo, top}
    at.update(n for n in job.scaling if lo < n < top)
    cur = job.current
    if cur:
        at.update(n for n in (cur - 1, cur, cur + 1) if lo < n < top)
    return envelope([(0, vals[0])] + [(n, vals[n - lo + 1]) for n in sorted(at)])  # the row's values there


def _row_and_envelope(job: Job, horizon_s: float, size: int) -> tuple[ValueRow, Envelope]:
    row = value_row(job, horizon_s)
    return row, row_envelope(job, row.values[:size])


class RowMemo:
    """Value rows and envelopes of the jobs valued before, keyed by everything they are made of (the
    curve's points, the range, the current count, the rescale costs, the horizon and the row's
    size), and each curve's :func:`gains` over its range and the horizon (a job's row changes with
    its count and its pauses far more often than its curve does). A caller that solves a stream of
    similar problems (the policy: most jobs are the same from one decision to the next) keeps one and
    passes it to :func:`allocator.solve`; the plans are the same with it or without it."""

    def __init__(self, keep: int = 4096) -> None:
        self.keep = keep
        self._rows: dict[tuple[object, ...], tuple[ValueRow, Envelope]] = {}
        self._gains: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]] = {}

    def row(self, job: Job, horizon_s: float, size: int) -> tuple[ValueRow, Envelope]:
        curve = tuple(job.scaling.items())
        key = (curve, job.min_nodes, job.max_nodes, job.current, job.up_cost_s, job.down_cost_s, horizon_s, size)
        hit = self._rows.get(key)
        if hit is None:
            gain_key = (curve, job.min_nodes, job.max_nodes, horizon_s)
            earned = self._gains.get(gain_key)
            if earned is None:
                if len(self._gains) >= self.keep:
                    self._gains.clear()
                earned = self._gains[gain_key] = gains(job, horizon_s)
            if len(self._rows) >= self.keep:
                self._rows.clear()
            row = value_row(job, horizon_s, earned)
            hit = self._rows[key] = (row, row_envelope(job, row.values[:size]))
        return hit


def plan_objective(problem: Problem, counts: dict[str, int]) -> float:
    """The objective of a count vector, recomputed with the model's own functions."""
    return float(sum(job.value(counts.get(job.id, 0), problem.horizon_s) for job in problem.jobs))
