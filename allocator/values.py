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
        first = np.argmax(vals, axis=1)
        if not len(self.jobs):
            return first
        rows = np.arange(len(self.jobs))
        cur = self.current_index
        safe = np.where(cur >= 0, cur, 0)
        at_top = (cur >= 0) & (vals[rows, safe] == vals[rows, first])
        return np.where(at_top, safe, first)


def curve_throughputs(scaling: dict[int, float], counts: np.ndarray) -> np.ndarray:
    """Samples/s at each count (any shape), vectorised ``throughput_at``."""
    xs = sorted(scaling)
    px = np.array([0.0] + [float(x) for x in xs])
    py = np.array([0.0] + [float(scaling[x]) for x in xs])
    out = np.interp(counts.astype(np.float64), px, py)
    out[counts <= 0] = 0.0
    return out


def throughputs(job: Job, counts: np.ndarray) -> np.ndarray:
    return curve_throughputs(dict(job.scaling), counts)


def build_tables(problem: Problem) -> Tables:
    jobs = problem.jobs
    cap = problem.total_nodes
    lo = np.array([j.min_nodes for j in jobs], np.int64)
    hi = np.minimum(np.array([j.max_nodes for j in jobs], np.int64), cap)
    sizes = 1 + np.maximum(0, hi - lo + 1)
    width = int(sizes.max(initial=1))
    col = np.arange(width, dtype=np.int64)[None, :]
    valid = col < sizes[:, None]
    counts = np.where(valid & (col > 0), lo[:, None] + col - 1, 0)
    thr = np.zeros(counts.shape)
    for key, rows in _group_by_curve(jobs).items():
        thr[rows] = curve_throughputs(dict(key), counts[rows])
    cur = np.array([j.current for j in jobs], np.int64)
    rate = np.array([j.throughput(j.current) if j.current else 0.0 for j in jobs])
    up = rate * np.array([j.up_cost_s for j in jobs], np.float64)
    down = rate * np.array([j.down_cost_s for j in jobs], np.float64)
    values = problem.horizon_s * thr
    values = values - np.where(counts > cur[:, None], up[:, None], 0.0)
    values = values - np.where(counts < cur[:, None], down[:, None], 0.0)
    values[~valid] = -np.inf
    inside = (cur == 0) | ((cur >= lo) & (cur <= hi))
    current_index = np.where(cur == 0, 0, np.where(inside, cur - lo + 1, -1))
    return Tables(jobs, counts, values, sizes, current_index)


def _group_by_curve(jobs: tuple[Job, ...]) -> dict[tuple[tuple[int, float], ...], list[int]]:
    groups: dict[tuple[tuple[int, float], ...], list[int]] = {}
    for j, job in enumerate(jobs):
        groups.setdefault(tuple(sorted(job.scaling.items())), []).append(j)
    return groups


def plan_objective(problem: Problem, counts: dict[str, int]) -> float:
    """The objective of a count vector, recomputed with the model's own functions."""
    return float(sum(job.value(counts.get(job.id, 0), problem.horizon_s) for job in problem.jobs))
