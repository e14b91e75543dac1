"""What goes into the policy and what comes out: plain, immutable data."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping

from profiler.estimators import Estimate, RescaleCosts

Curve = Mapping[int, float]


class PolicyInputError(ValueError):
    """A view or evidence the policy cannot decide on; the message names the job or node."""


def check_amount(job_id: str, name: str, value: object) -> None:
    """Raise :class:`PolicyInputError` unless ``value`` (a job's ``name``: work left, node-hours) is
    None or a finite number >= 0."""
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise PolicyInputError(f"job {job_id}: {name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class JobView:
    """A live job (admitted or queued) as the driver sees it now.

    ``nodes`` are the nodes it runs on (both drivers: from their :class:`policy.ledger.Ledger`). A job below its ``min_nodes`` cannot run
    (:func:`policy.ledger.below_min`): drivers stop it, so it shows no nodes. ``order`` is its
    submission order (FCFS); ``last_interrupted`` the last time its node set changed
    (:func:`policy.ledger.interrupts`: rescaled, recalled, stopped; None: never). ``scaling`` is the user's curve, if any;
    ``profile`` whether the user asked for a profile.

    Optional (None: unknown; the defaults keep older drivers working): ``work_left`` the samples
    still to train (gated profiling skips short jobs, deadlines need it); ``budget_node_hours`` the
    most node-hours the job may use and ``used_node_hours`` what it used so far; ``deadline`` the
    time (the view's clock) it should be done by (still training then, it is stopped). ``user`` who
    submitted it (the daemon: the submitter's login name; the simulator: the workload's); fair share
    (:mod:`policy.fairness`) shares the nodes between users. Jobs with the same user are one user's.
    ``group`` the sweep or job array it is one of (``""``: none): a stream of short jobs, admitted and
    grown as :mod:`policy.sweeps` says.
    """

    id: str
    min_nodes: int
    max_nodes: int
    nodes: tuple[str, ...] = ()
    order: int = 0
    last_interrupted: float | None = None
    scaling: Curve | None = None
    profile: bool = False
    work_left: float | None = None
    budget_node_hours: float | None = None
    used_node_hours: float = 0.0
    deadline: float | None = None
    user: str = ""
    group: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            raise PolicyInputError("a job with an empty id")
        if not isinstance(self.user, str):
            raise PolicyInputError(f"job {self.id}: user must be a string, got {self.user!r}")
        if not isinstance(self.group, str):
            raise PolicyInputError(f"job {self.id}: group must be a string, got {self.group!r}")
        check_amount(self.id, "work_left", self.work_left)
        check_amount(self.id, "budget_node_hours", self.budget_node_hours)
        check_amount(self.id, "used_node_hours", self.used_node_hours)
        if self.deadline is not None and not (isinstance(self.deadline, (int, float)) and math.isfinite(self.deadline)):
            raise PolicyInputError(f"job {self.id}: deadline must be a finite time, got {self.deadline!r}")
        if not 1 <= self.min_nodes <= self.max_nodes:
            raise PolicyInputError(f"job {self.id}: bad node range [{self.min_nodes}, {self.max_nodes}]")
        if len(self.nodes) > self.max_nodes:
            raise PolicyInputError(f"job {self.id}: runs on {len(self.nodes)} nodes, more than its max {self.max_nodes}")

    @property
    def count(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class View:
    """The state to decide on at ``now``.

    ``free_nodes`` are held, usable nodes no job runs on. A driver may cut the list to what the jobs
    could take and give the real count in ``n_free`` (the simulator does, so a 4,000-node idle pool
    costs nothing per decision). ``jobs`` are every live job, admitted or queued, any order.

    Node valuation (optional; empty: unknown): ``idle_since`` when each listed node became idle
    (held by us); ``recall_at`` a known time a node will be taken back (e.g. a Slurm pending job's
    planned start); ``ended_fragments`` the lengths (s) of the idle fragments that ended since the
    previous decision (a node recalled after being idle that long), from which the policy learns the
    fragment-length distribution.
    """

    now: float
    free_nodes: tuple[str, ...]
    jobs: tuple[JobView, ...]
    n_free: int | None = None
    idle_since: Mapping[str, float] = field(default_factory=dict)
    recall_at: Mapping[str, float] = field(default_factory=dict)
    ended_fragments: tuple[float, ...] = ()

    @property
    def free_count(self) -> int:
        return len(self.free_nodes) if self.n_free is None else max(self.n_free, len(self.free_nodes))


@dataclass(frozen=True)
class JobEvidence:
    """What the job monitor measured for one job: a throughput estimate per node count (the newest),
    and the rescale pauses seen so far (medians, up and down apart)."""

    rates: Mapping[int, Estimate] = field(default_factory=dict)
    costs: RescaleCosts | None = None

    # the profiling session reads evidence like a throughput estimator
    def estimate(self, world_size: int) -> Estimate | None:
        return self.rates.get(world_size)

    def stable(self, world_size: int, rel_ci: float = 0.05) -> bool:
        est = self.rates.get(world_size)
        return est is not None and est.rel_ci <= rel_ci


NO_EVIDENCE = JobEvidence()

Evidence = Mapping[str, JobEvidence]


class EventKind(str, Enum):
    """Things a decision did, for the driver's event log and the simulator's statistics."""

    ADMITTED = "admitted"
    PREEMPTED = "preempted"  # fell below its min: back to the front of the queue, progress kept
    PROFILE_START = "profile_start"
    PROFILE_STEP = "profile_step"
    PROFILE_DONE = "profile_done"
    PROFILE_ABORTED = "profile_aborted"
    LENT = "lent"
    RETURNED = "returned"
    REFINED = "refined"
    SUSPENDED = "suspended"  # admitted beyond Pjmax, gave way when nodes went: queue front, progress kept
    OVER_BUDGET = "over_budget"  # spent its budget_node_hours: the driver stops it (finished, over budget)
    PAST_DEADLINE = "past_deadline"  # its deadline passed before it finished: the driver stops it


@dataclass(frozen=True)
class PolicyEvent:
    kind: EventKind
    job: str
    detail: Mapping[str, object] = field(default_factory=dict)


class StopReason(str, Enum):
    """Why the policy ends a job (``Decision.stop``): a limit its user set was reached."""

    OVER_BUDGET = "over_budget"  # it has held its nodes for its budget_node_hours
    PAST_DEADLINE = "past_deadline"  # its deadline passed and it still had samples to train

    @property
    def text(self) -> str:
        """The reason in words, without figures (a stopped job's waiting reason)."""
        return "over its budget_node_hours" if self is StopReason.OVER_BUDGET else "past its deadline"


@dataclass(frozen=True)
class Stop:
    """A job the policy ends: the ``reason`` and its figures, ``reached`` the value that met ``limit``
    (``OVER_BUDGET``: the node-hours it used and its budget; ``PAST_DEADLINE``: the decision's time and
    the deadline, on the view's clock). Drivers word their message with :meth:`describe`."""

    reason: StopReason
    reached: float
    limit: float

    def describe(self) -> str:
        """What a user is told (the daemon's job message): the reason with its figures."""
        if self.reason is StopReason.OVER_BUDGET:
            return f"over budget: used {self.reached:.4g} of {self.limit:.4g} node-hours"
        return f"past its deadline: not done by it (stopped {self.reached - self.limit:.3g} s after it)"


@dataclass(frozen=True)
class Decision:
    """The policy's answer.

    ``assignment`` maps every admitted job to its nodes (``()``: admitted, no nodes now); jobs not
    in it must run on nothing. No job both gains and loses nodes. ``admitted`` lists the jobs
    holding a Pjmax slot in admission order; ``waiting`` the queued jobs with the reason each
    waits. ``profiling`` the count each profiling job must run at. ``wake_at``: decide again by
    then at the latest; ``watch``: decide again as soon as these jobs' evidence changes.
    ``stop``: jobs to end now, each with its :class:`Stop` (over budget, past its deadline; not admitted,
    never re-admitted).
    """

    now: float
    assignment: Mapping[str, tuple[str, ...]]
    admitted: tuple[str, ...]
    waiting: Mapping[str, str]
    profiling: Mapping[str, int]
    events: tuple[PolicyEvent, ...] = ()
    wake_at: float | None = None
    watch: tuple[str, ...] = ()
    objective: float = 0.0
    method: str = ""
    solved: bool = False  # False: answered without running the allocator (nothing changed)
    stop: Mapping[str, Stop] = field(default_factory=dict)  # jobs the driver must end, and why
    horizon_s: float = 0.0  # the horizon the allocator weighed rescales over

    def nodes_of(self, job_id: str) -> tuple[str, ...]:
        return tuple(self.assignment.get(job_id, ()))

    @property
    def counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.assignment.items()}
