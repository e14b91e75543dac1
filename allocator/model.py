"""Plain data for the allocation problem: jobs, the node pool, and the plan.

Pure: no I/O, no clock, no scheduler types. The daemon and the simulator both
build a :class:`Problem` and call :func:`allocator.solve` on it.
"""

from __future__ import annotations

import bisect
import math
import numbers
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Callable, Mapping


class ProblemError(ValueError):
    """A job or problem that cannot be solved as given; the message names it."""


def throughput_at(scaling: Mapping[int, float], n: int) -> float:
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


def _plain_curve(scaling: Mapping[int, float]) -> bool:
    """Every count a plain int >= 1 and every rate a finite number >= 0."""
    for n, v in scaling.items():
        if type(n) is not int or n < 1 or not 0.0 <= v < math.inf:
            return False
    return True


def _distinct(nodes: tuple[str, ...]) -> bool:
    return len(set(nodes)) == len(nodes)


_PASSED_KEEP = 4096
_passed: dict[tuple[int, int], object] = {}  # (id of a check, id of an object) -> the object that passed it


def _passes(check: Callable[[Any], bool], obj: object) -> bool:
    """``check(obj)``, remembered for this very object: a job's curve and node tuple are immutable (see
    :class:`Job`), and a policy builds a job again from the same ones when only its costs changed. The
    object is held while remembered, so its id is not reused."""
    key = (id(check), id(obj))
    if _passed.get(key) is obj:
        return True
    if not check(obj):
        return False
    if type(obj) is tuple or type(obj) is dict:  # (a list of nodes may change: checked each time)
        if len(_passed) >= _PASSED_KEEP:
            _passed.clear()
        _passed[key] = obj
    return True


@dataclass(frozen=True)
class Job:
    """An elastic data-parallel job as the allocator sees it.

    ``scaling`` maps node counts to measured samples/s; ``nodes`` are the nodes
    the job holds now (empty if it is not running). A job that grows keeps its
    nodes; a job that shrinks keeps a subset of them; it never does both.
    A job is immutable, ``scaling`` included (do not change the mapping after
    building the job): the allocator keeps the job's value row on it, so a job
    passed again unchanged is not valued again.
    """

    id: str
    min_nodes: int
    max_nodes: int
    scaling: Mapping[int, float]
    nodes: tuple[str, ...] = ()
    up_cost_s: float = 0.0
    down_cost_s: float = 0.0
    current: int = field(init=False, repr=False, compare=False)  # nodes held now: len(nodes), set once

    def __post_init__(self) -> None:
        object.__setattr__(self, "current", len(self.nodes))
        if (type(self.id) is str and self.id and type(self.min_nodes) is int and type(self.max_nodes) is int
                and 1 <= self.min_nodes <= self.max_nodes and self.scaling and _passes(_plain_curve, self.scaling)
                and self.up_cost_s >= 0 and self.down_cost_s >= 0 and _passes(_distinct, self.nodes)):
            return  # the common case, checked in one pass
        if not isinstance(self.id, str) or not self.id:
            raise ProblemError(f"job id must be a non-empty string, got {self.id!r}")
        if self.min_nodes < 1:
            raise ProblemError(f"job {self.id}: min_nodes must be >= 1, got {self.min_nodes}")
        if self.max_nodes < self.min_nodes:
            raise ProblemError(
                f"job {self.id}: max_nodes {self.max_nodes} < min_nodes {self.min_nodes}"
            )
        if not self.scaling:
            raise ProblemError(f"job {self.id}: scaling has no measured points")
        if any(not isinstance(n, int) for n in self.scaling):
            bad = [n for n in self.scaling if not isinstance(n, numbers.Integral) or isinstance(n, bool)]
            if bad:
                raise ProblemError(f"job {self.id}: scaling node count {bad[0]!r} is not an integer")
            object.__setattr__(self, "scaling", {int(n): float(v) for n, v in self.scaling.items()})
        for n, v in self.scaling.items():
            if n < 1:
                raise ProblemError(f"job {self.id}: scaling node count {n!r} is not a positive int")
            if not (v >= 0.0) or v != v or v == float("inf"):
                raise ProblemError(f"job {self.id}: scaling[{n}] = {v!r} is not a finite rate >= 0")
        if self.up_cost_s < 0 or self.down_cost_s < 0:
            raise ProblemError(f"job {self.id}: rescale costs must be >= 0")
        if len(set(self.nodes)) != len(self.nodes):
            raise ProblemError(f"job {self.id}: holds a node twice: {self.nodes}")

    def throughput(self, n: int) -> float:
        return throughput_at(self.scaling, n)

    def rescale_cost(self, n: int) -> float:
        """Samples lost by moving from the current node count to ``n``."""
        cur = self.current
        if n == cur or cur == 0:
            return 0.0
        rate = self.throughput(cur)
        return rate * (self.up_cost_s if n > cur else self.down_cost_s)

    def value(self, n: int, horizon_s: float) -> float:
        """Objective contribution of running at ``n`` nodes over the horizon."""
        return horizon_s * self.throughput(n) - self.rescale_cost(n)


@dataclass(frozen=True)
class Problem:
    """Jobs, the held nodes no job uses (``free_nodes``), and the horizon Tfwd.

    ``nodes_checked``: the caller guarantees that no node is listed twice (it built the lists from a
    view it checked, as the policy does): the check, which costs more than a solve on a few thousand
    nodes, is skipped. Job ids are checked either way.
    """

    jobs: tuple[Job, ...]
    free_nodes: tuple[str, ...]
    horizon_s: float
    nodes_checked: bool = field(default=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "jobs", tuple(self.jobs))
        object.__setattr__(self, "free_nodes", tuple(self.free_nodes))
        if not (self.horizon_s > 0):
            raise ProblemError(f"horizon_s must be > 0, got {self.horizon_s!r}")
        ids = {job.id for job in self.jobs}
        if self.nodes_checked:
            if len(ids) != len(self.jobs):
                self._name_the_duplicate()
            object.__setattr__(self, "_total_nodes", len(self.free_nodes) + sum(len(j.nodes) for j in self.jobs))
            return
        held = list(chain.from_iterable(job.nodes for job in self.jobs))
        if len(ids) != len(self.jobs) or len(set(held).union(self.free_nodes)) != len(held) + len(self.free_nodes):
            self._name_the_duplicate()  # some job or node twice (the common case is checked at C speed)
        object.__setattr__(self, "_total_nodes", len(self.free_nodes) + len(held))

    def _name_the_duplicate(self) -> None:
        seen: dict[str, str] = {}
        ids: set[str] = set()
        for job in self.jobs:
            if job.id in ids:
                raise ProblemError(f"job id {job.id!r} appears twice")
            ids.add(job.id)
            for node in job.nodes:
                if node in seen:
                    raise ProblemError(f"node {node!r} held by both {seen[node]} and {job.id}")
                seen[node] = job.id
        for node in self.free_nodes:
            if node in seen:
                raise ProblemError(f"free node {node!r} is also held by job {seen[node]}")
        if len(set(self.free_nodes)) != len(self.free_nodes):
            raise ProblemError("free_nodes lists a node twice")

    @property
    def total_nodes(self) -> int:
        """Every node of the problem: the free ones and the jobs' (counted once, at construction)."""
        return self._total_nodes  # type: ignore[attr-defined,no-any-return]


@dataclass(frozen=True)
class Plan:
    """The allocator's answer: which nodes each job runs on next.

    Every job of the problem has an entry (an empty tuple = not running).
    """

    assignment: dict[str, tuple[str, ...]]
    objective: float
    solve_seconds: float
    method: str = ""
    counts: dict[str, int] = field(default_factory=dict)

    def nodes_of(self, job_id: str) -> tuple[str, ...]:
        return self.assignment.get(job_id, ())
