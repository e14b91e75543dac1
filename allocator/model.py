"""Plain data for the allocation problem: jobs, the node pool, and the plan.

Pure: no I/O, no clock, no scheduler types. The daemon and the simulator both
build a :class:`Problem` and call :func:`allocator.solve` on it.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from curves import throughput_at


class ProblemError(ValueError):
    """A job or problem that cannot be solved as given; the message names it."""


_COUNT_TYPES = (int, np.integer)
_RATE_TYPES = (int, float, np.integer, np.floating)


def _is_count(n: object) -> bool:
    return isinstance(n, _COUNT_TYPES) and not isinstance(n, bool)


def _is_rate(v: object) -> bool:
    """A finite real number >= 0."""
    return isinstance(v, _RATE_TYPES) and not isinstance(v, bool) and bool(0.0 <= v < math.inf)


@dataclass(frozen=True)
class Job:
    """An elastic data-parallel job as the allocator sees it.

    ``scaling`` maps node counts to measured samples/s; ``nodes`` are the nodes
    the job holds now (empty if it is not running). A job that grows keeps its
    nodes; a job that shrinks keeps a subset of them; it never does both.
    Every field is checked when the job is made; the error names the job and the field.
    """

    id: str
    min_nodes: int
    max_nodes: int
    scaling: Mapping[int, float]
    nodes: tuple[str, ...] = ()
    up_cost_s: float = 0.0
    down_cost_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ProblemError(f"job id must be a non-empty string, got {self.id!r}")
        for name in ("min_nodes", "max_nodes"):
            if not _is_count(getattr(self, name)):
                raise ProblemError(f"job {self.id}: {name} must be an int, got {getattr(self, name)!r}")
        if self.min_nodes < 1:
            raise ProblemError(f"job {self.id}: min_nodes must be >= 1, got {self.min_nodes}")
        if self.max_nodes < self.min_nodes:
            raise ProblemError(f"job {self.id}: max_nodes {self.max_nodes} < min_nodes {self.min_nodes}")
        if not self.scaling:
            raise ProblemError(f"job {self.id}: scaling has no measured points")
        for n, v in self.scaling.items():
            if type(n) is int and n >= 1 and type(v) is float and 0.0 <= v < math.inf:
                continue  # the common case, checked at once (the checks below say what is wrong)
            if not _is_count(n) or n < 1:
                raise ProblemError(f"job {self.id}: scaling node count {n!r} is not a positive int")
            if not _is_rate(v):
                raise ProblemError(f"job {self.id}: scaling[{n}] = {v!r} is not a finite rate >= 0")
        for name in ("up_cost_s", "down_cost_s"):
            if not _is_rate(getattr(self, name)):
                raise ProblemError(f"job {self.id}: {name} must be a finite number >= 0, got {getattr(self, name)!r}")
        if not isinstance(self.nodes, tuple):
            raise ProblemError(f"job {self.id}: nodes must be a tuple, got {type(self.nodes).__name__}")
        if len(set(self.nodes)) != len(self.nodes):
            raise ProblemError(f"job {self.id}: holds a node twice: {self.nodes}")

    @property
    def current(self) -> int:
        """Nodes held now."""
        return len(self.nodes)

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

    Checked when made: a job id or a node listed twice, and a horizon that is not finite and > 0,
    raise :class:`ProblemError` naming it.
    """

    jobs: tuple[Job, ...]
    free_nodes: tuple[str, ...]
    horizon_s: float

    def __post_init__(self) -> None:
        if not isinstance(self.jobs, tuple) or not isinstance(self.free_nodes, tuple):
            raise ProblemError("a problem's jobs and free_nodes must be tuples")
        if not (isinstance(self.horizon_s, numbers.Real) and 0.0 < self.horizon_s < math.inf):
            raise ProblemError(f"horizon_s must be finite and > 0, got {self.horizon_s!r}")
        self._check_each_once()

    def _check_each_once(self) -> None:
        nodes = set(self.free_nodes)
        listed = len(self.free_nodes)
        for job in self.jobs:
            nodes.update(job.nodes)
            listed += len(job.nodes)
        if len({job.id for job in self.jobs}) == len(self.jobs) and len(nodes) == listed:
            return  # every id and node once (one set each); else the walk below names the first repeat
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
        """Every node of the problem: the free ones and the jobs'."""
        return len(self.free_nodes) + sum(len(job.nodes) for job in self.jobs)


@dataclass(frozen=True)
class Plan:
    """The allocator's answer: which nodes each job runs on next.

    Every job of the problem has an entry (an empty tuple = not running).
    """

    assignment: dict[str, tuple[str, ...]]
    objective: float
    method: str = ""
    counts: dict[str, int] = field(default_factory=dict)

    def nodes_of(self, job_id: str) -> tuple[str, ...]:
        return self.assignment.get(job_id, ())
