"""The job profiling advisor (JPA): where a new job's profiling nodes come from, and the profile itself.

Rules (pinned by ``tests/test_profiler_jpa.py``):

* **Counts.** A job profiles ``request.counts`` or, by default, :func:`default_counts`: ``min_nodes``, the powers of two
  between, and ``max_nodes``. Only the counts that can be sourced now are profiled.
* **Sources.** Free nodes first. If they do not reach the largest count, nodes are borrowed from **one** running job
  (never two): the lender that lets the profile reach the highest count, and among those the **least recently
  interrupted** (smallest ``last_interrupted``, then job id). A lender keeps at least ``max(min_nodes, 1)`` nodes, so it
  never drops below its own minimum and never to zero. Jobs that are profiling themselves never lend. Only what is
  missing is borrowed.
* **Waiting.** If fewer than two counts (or fewer than all, when only one is asked for) can be sourced, the job waits in
  the queue: :class:`Wait`.
* **Inverse order.** The job starts once at the largest count (its one scale-up) and then steps **down** through the
  others (MalleTrain Fig. 3.4): nodes are only ever released, never acquired, during the profile.
* **Holding.** Each count is held until the throughput estimate is stable (relative CI <= ``rel_ci``, default 5%) or
  ``time_cap_s`` has passed since the step was ordered (the rescale pause counts towards the cap).
* **Done.** The borrowed nodes go back to the lender and the allocator re-plans with the profiled
  :class:`~profiler.scalability.Scalability`.

Several jobs may profile at once: the caller updates ``free_nodes`` and the running list between calls (marking
profiling jobs, and setting a lender's ``last_interrupted`` to the time it lent, which sends it to the back of the LRU
order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, Mapping, Protocol, Sequence

from profiler.estimators import Estimate
from profiler.scalability import Scalability, Source


class ProfilingError(ValueError):
    """A profiling request or running-job entry that makes no sense; the message names the job."""


def default_counts(min_nodes: int, max_nodes: int) -> tuple[int, ...]:
    """``min_nodes``, every power of two strictly between, and ``max_nodes`` (ascending)."""
    if min_nodes < 1 or max_nodes < min_nodes:
        raise ProfilingError(f"bad node range [{min_nodes}, {max_nodes}]")
    counts = {min_nodes, max_nodes}
    p = 1
    while p < max_nodes:
        if p > min_nodes:
            counts.add(p)
        p *= 2
    return tuple(sorted(counts))


@dataclass(frozen=True)
class ProfilingRequest:
    """A new job that asks to be profiled between ``min_nodes`` and ``max_nodes``."""

    job_id: str
    min_nodes: int
    max_nodes: int
    counts: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.job_id:
            raise ProfilingError("profiling request with an empty job id")
        if self.min_nodes < 1 or self.max_nodes < self.min_nodes:
            raise ProfilingError(f"job {self.job_id}: bad node range [{self.min_nodes}, {self.max_nodes}]")
        if self.counts is not None:
            if not self.counts:
                raise ProfilingError(f"job {self.job_id}: counts is empty")
            for c in self.counts:
                if not isinstance(c, int) or not self.min_nodes <= c <= self.max_nodes:
                    raise ProfilingError(f"job {self.job_id}: count {c!r} outside [{self.min_nodes}, {self.max_nodes}]")

    def targets(self) -> tuple[int, ...]:
        """The counts to profile, ascending, each once."""
        if self.counts is None:
            return default_counts(self.min_nodes, self.max_nodes)
        return tuple(sorted(set(self.counts)))


@dataclass(frozen=True)
class RunningJob:
    """A running job as a possible lender: ``nodes`` held now, its ``min_nodes``, when it was last rescaled."""

    job_id: str
    nodes: int
    min_nodes: int
    last_interrupted: float
    profiling: bool = False

    def __post_init__(self) -> None:
        if self.nodes < 0 or self.min_nodes < 0:
            raise ProfilingError(f"running job {self.job_id}: negative nodes {self.nodes} "
                                 f"or min_nodes {self.min_nodes}")

    @property
    def lendable(self) -> int:
        """Nodes it can lend and keep at least ``max(min_nodes, 1)``."""
        if self.profiling:
            return 0
        return max(0, self.nodes - max(self.min_nodes, 1))


class StepKind(Enum):
    UP = "up"
    """Acquire nodes (the profile's single start at its largest count)."""
    DOWN = "down"
    """Release nodes and keep running on fewer."""


@dataclass(frozen=True)
class Step:
    kind: StepKind
    from_nodes: int
    to_nodes: int


@dataclass(frozen=True)
class ProfilePlan:
    """What to profile and where the nodes come from: ``from_free`` + ``borrowed`` from ``lender``."""

    job_id: str
    counts_desc: tuple[int, ...]
    from_free: int
    lender: str | None
    borrowed: int

    @property
    def top(self) -> int:
        return self.counts_desc[0]

    def steps(self) -> tuple[Step, ...]:
        """One scale-up from 0 to the largest count, then one scale-down per further count."""
        out = [Step(StepKind.UP, 0, self.counts_desc[0])]
        out += [Step(StepKind.DOWN, a, b) for a, b in zip(self.counts_desc, self.counts_desc[1:])]
        return tuple(out)


@dataclass(frozen=True)
class Wait:
    """Not enough nodes to profile now: the job stays queued. ``reachable`` = counts that could be sourced."""

    job_id: str
    reason: str
    reachable: tuple[int, ...]


def _highest(targets: Sequence[int], available: int) -> int | None:
    fitting = [c for c in targets if c <= available]
    return fitting[-1] if fitting else None


def choose_sources(request: ProfilingRequest, free_nodes: int, running: Sequence[RunningJob]) -> ProfilePlan | Wait:
    """Apply the source rules of the module doc; pure."""
    if free_nodes < 0:
        raise ProfilingError(f"job {request.job_id}: free_nodes is negative ({free_nodes})")
    ids = [r.job_id for r in running]
    if request.job_id in ids:
        raise ProfilingError(f"job {request.job_id} asks to be profiled but is listed as running")
    if len(set(ids)) != len(ids):
        raise ProfilingError(f"job {request.job_id}: a running job is listed twice in {ids}")
    targets = request.targets()
    top = _highest(targets, free_nodes)
    lender: RunningJob | None = None
    if top != targets[-1]:
        ranked = sorted(
            (r for r in running if r.lendable > 0),
            key=lambda r: (-(_highest(targets, free_nodes + r.lendable) or 0), r.last_interrupted, r.job_id),
        )
        if ranked and (_highest(targets, free_nodes + ranked[0].lendable) or 0) > (top or 0):
            lender = ranked[0]
            top = _highest(targets, free_nodes + lender.lendable)
    reachable = tuple(c for c in targets if top is not None and c <= top)
    needed = min(2, len(targets))
    if len(reachable) < needed:
        return Wait(
            request.job_id, f"job {request.job_id}: {len(reachable)} of the counts {targets} can be sourced "
            f"({free_nodes} free, best single lender adds {max((r.lendable for r in running), default=0)}); "
            f"profiling needs {needed}", reachable,
        )
    assert top is not None
    if lender is None:
        return ProfilePlan(request.job_id, tuple(reversed(reachable)), top, None, 0)
    return ProfilePlan(request.job_id, tuple(reversed(reachable)), free_nodes, lender.job_id, top - free_nodes)


class EstimateSource(Protocol):
    """What the session reads: a job's throughput estimator (``ThroughputEstimator`` is one;
    the simulator may pass its own)."""

    def estimate(self, world_size: int) -> Estimate | None: ...

    def stable(self, world_size: int, rel_ci: float = 0.05) -> bool: ...


@dataclass(frozen=True)
class Hold:
    """Keep running at ``count``; the step ends by ``deadline`` at the latest (the time cap)."""

    count: int
    deadline: float


@dataclass(frozen=True)
class StepDown:
    """Shrink from ``from_nodes`` to ``count`` nodes (``released`` nodes freed; they stay with the profile
    until :class:`Done` when they were borrowed)."""

    from_nodes: int
    count: int

    @property
    def released(self) -> int:
        return self.from_nodes - self.count


@dataclass(frozen=True)
class Done:
    """Profile over. Give ``borrowed`` nodes back to ``return_nodes_to`` (None: nothing borrowed) and re-plan with
    ``scalability`` (``None`` if no count yielded a single step and there is no prior). ``capped`` lists the counts that
    hit the time cap (their point is kept if any step was measured); ``missing`` the counts with no measurement at
    all."""

    job_id: str
    scalability: Scalability | None
    return_nodes_to: str | None
    borrowed: int
    final_count: int
    capped: tuple[int, ...]
    missing: tuple[int, ...]


Action = Hold | StepDown | Done


class ProfileSession:
    """Drives one :class:`ProfilePlan`. The caller starts the job at ``plan.top`` at ``started_at``,
    then calls :meth:`next_action` whenever it likes (after new records, at a ``Hold.deadline``);
    after :class:`Done` it keeps answering the same ``Done``."""

    def __init__(
        self, plan: ProfilePlan, started_at: float, rel_ci: float = 0.05, time_cap_s: float = 300.0,
        prior: Mapping[int, float] | None = None,
    ) -> None:
        if not (rel_ci > 0):
            raise ProfilingError(f"job {plan.job_id}: rel_ci must be > 0, got {rel_ci}")
        if not (time_cap_s > 0) or not math.isfinite(time_cap_s):
            raise ProfilingError(f"job {plan.job_id}: time_cap_s must be finite and > 0, got {time_cap_s}")
        self.plan = plan
        self.rel_ci = rel_ci
        self.time_cap_s = time_cap_s
        self.prior = dict(prior or {})
        self._index = 0
        self._step_started = started_at
        self._measured: dict[int, float] = {}
        self._capped: list[int] = []
        self._missing: list[int] = []
        self._done: Done | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-safe) that :meth:`from_dict` turns back into an equal session."""
        plan = self.plan
        return {
            "job_id": plan.job_id, "counts_desc": list(plan.counts_desc), "from_free": plan.from_free,
            "lender": plan.lender, "borrowed": plan.borrowed, "rel_ci": self.rel_ci,
            "time_cap_s": self.time_cap_s, "prior": {str(k): v for k, v in self.prior.items()},
            "index": self._index, "step_started": self._step_started,
            "measured": {str(k): v for k, v in self._measured.items()},
            "capped": list(self._capped), "missing": list(self._missing), "done": self._done is not None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProfileSession":
        """The session :meth:`to_dict` saved; a malformed dict raises :class:`ProfilingError`."""
        try:
            plan = ProfilePlan(str(data["job_id"]), tuple(int(c) for c in data["counts_desc"]),
                               int(data["from_free"]), data["lender"], int(data["borrowed"]))
            session = cls(plan, float(data["step_started"]), float(data["rel_ci"]), float(data["time_cap_s"]),
                          {int(k): float(v) for k, v in data["prior"].items()})
            index = int(data["index"])
            if not 0 <= index < len(plan.counts_desc):
                raise ProfilingError(f"job {plan.job_id}: profile step {index} out of range")
            session._index = index
            session._measured = {int(k): float(v) for k, v in data["measured"].items()}
            session._capped = [int(c) for c in data["capped"]]
            session._missing = [int(c) for c in data["missing"]]
            if data.get("done"):
                session._done = Done(plan.job_id, session._scalability(), plan.lender, plan.borrowed,
                                     session.count, tuple(session._capped), tuple(session._missing))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProfilingError(f"saved profile session is malformed: {exc}") from None
        return session

    @property
    def step_deadline(self) -> float:
        """When the current step ends at the latest (its time cap)."""
        return self._step_started + self.time_cap_s

    @property
    def done(self) -> bool:
        return self._done is not None

    @property
    def count(self) -> int:
        """The node count the job should be running at now."""
        return self.plan.counts_desc[self._index]

    @property
    def measured(self) -> dict[int, float]:
        return dict(self._measured)

    def next_action(self, now: float, estimator: EstimateSource) -> Action:
        if self._done is not None:
            return self._done
        count = self.count
        deadline = self._step_started + self.time_cap_s
        if estimator.stable(count, self.rel_ci):
            self._measured[count] = estimator.estimate(count).rate  # type: ignore[union-attr]
        elif now >= deadline:
            est = estimator.estimate(count)
            if est is None:
                self._missing.append(count)
            else:
                self._measured[count] = est.rate
                self._capped.append(count)
        else:
            return Hold(count, deadline)
        return self._advance(now)

    def _advance(self, now: float) -> Action:
        if self._index + 1 < len(self.plan.counts_desc):
            prev = self.count
            self._index += 1
            self._step_started = now
            return StepDown(prev, self.count)
        self._done = Done(
            self.plan.job_id, self._scalability(), self.plan.lender, self.plan.borrowed, self.count,
            tuple(self._capped), tuple(self._missing),
        )
        return self._done

    def _scalability(self) -> Scalability | None:
        if self._measured:
            return Scalability(prior=self.prior, measured=self._measured, source=Source.PROFILED)
        if self.prior:
            return Scalability.from_user(self.prior)
        return None


@dataclass(frozen=True)
class ProfileCost:
    """Rescales and wall time of one profile; ``node_seconds`` = nodes reserved (the largest count)
    times ``seconds`` (both orders must hold the largest count's nodes for the whole profile,
    or interrupt a lender again for every scale-up)."""

    order: str
    scale_ups: int
    scale_downs: int
    seconds: float
    node_seconds: float


def profile_cost(
    order: Literal["inverse", "ascending"], counts: Sequence[int], up_cost_s: float, down_cost_s: float, hold_s: float,
) -> ProfileCost:
    """Scale-ups (the start from 0 counts as one), scale-downs and seconds of profiling ``counts``
    in ``inverse`` (largest first, then down) or ``ascending`` order, each held ``hold_s``."""
    if order not in ("inverse", "ascending"):
        raise ProfilingError(f"order must be 'inverse' or 'ascending', got {order!r}")
    if not counts or min(counts) < 1:
        raise ProfilingError(f"counts must be non-empty positive node counts, got {counts!r}")
    if min(up_cost_s, down_cost_s, hold_s) < 0:
        raise ProfilingError("costs and hold time must be >= 0")
    seq = sorted(set(counts), reverse=(order == "inverse"))
    ups = downs = 0
    prev = 0
    for c in seq:
        if c > prev:
            ups += 1
        else:
            downs += 1
        prev = c
    seconds = len(seq) * hold_s + ups * up_cost_s + downs * down_cost_s
    return ProfileCost(order, ups, downs, seconds, max(seq) * seconds)
