"""What goes into the policy and what comes out: plain, immutable data."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping

from profiler.estimators import Estimate, RescaleCosts

Curve = Mapping[int, float]

_INF = math.inf


class PolicyInputError(ValueError):
    """A view or evidence the policy cannot decide on; the message names the job or node."""


def check_amount(job_id: str, name: str, value: object) -> None:
    """Raise :class:`PolicyInputError` unless ``value`` (a job's ``name``) is None or a finite number >= 0."""
    if value is None or type(value) is float and 0.0 <= value < _INF:  # the common case, in one test (NaN fails it)
        return
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise PolicyInputError(f"job {job_id}: {name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class JobView:
    """A live job (admitted or queued) as the driver sees it now: ``nodes`` from the driver's ledger (none below its
    min), ``order`` its submission order, ``last_interrupted`` when its node set last changed (None: never),
    ``scaling`` the user's curve. Optional (None: unknown): ``work_left`` samples still to train, the node-hour
    budget and use, ``deadline`` on the view's clock; ``user`` for fair share, ``group`` its sweep or array."""

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
        # a view is made for each running job at each decision: the common case, every value well typed, is
        # passed by one expression (in the order of the full checks, which anything else goes through to be named)
        w, b, u, d = self.work_left, self.budget_node_hours, self.used_node_hours, self.deadline
        if (self.id and type(self.user) is str and type(self.group) is str
                and (w is None or type(w) is float and 0.0 <= w < _INF)
                and (b is None or type(b) is float and 0.0 <= b < _INF)
                and type(u) is float and 0.0 <= u < _INF
                and (d is None or type(d) is float and -_INF < d < _INF)
                and 1 <= self.min_nodes <= self.max_nodes and len(self.nodes) <= self.max_nodes):
            return
        self._check()

    def _check(self) -> None:
        """Every field's check, raising :class:`PolicyInputError` naming the first bad one."""
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
    """The state to decide on at ``now``: ``free_nodes`` held and idle (a driver may cut the list and give the real
    count in ``n_free``), ``jobs`` every live job. Node valuation (empty: unknown): when each node became idle, a
    known recall time, and the lengths (s) of the idle fragments that ended since the previous decision."""

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
    """A job the policy ends: the ``reason``, and ``reached`` the value (node-hours used, or the decision's time) that
    met ``limit`` (its budget, or deadline). Drivers word their message with :meth:`describe`."""

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
    """The policy's answer: ``assignment`` maps every admitted job to its nodes (jobs not in it run on nothing; none
    both gains and loses); ``admitted`` in admission order; ``waiting`` each queued job's reason; ``profiling`` the
    count each profiling job runs at; decide again by ``wake_at`` or once ``watch``'s evidence changes."""

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
