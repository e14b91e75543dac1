"""The replay's records: its settings (:class:`SimConfig`), a simulated job (:class:`SimJob`), the
events on its heap, a decision's row and the result (:class:`SimResult`)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping

from curves import throughput_at
from policy import Decision, Stop
from simulator.calibration import Calibration
from simulator.monitor import SimJobMonitor
from simulator.workload import JobSpec


class PolicyError(RuntimeError):
    """A plan that breaks the simulator's rules; the message names policy, job and node."""


class SimJobState(enum.Enum):
    """A simulated job's state (the daemon's jobs have their own, :class:`malletrain.daemon.jobspec.JobState`)."""

    QUEUED = "queued"  # waiting for a slot (FCFS)
    ADMITTED = "admitted"  # holds one of the Pjmax slots; may hold 0 nodes
    DONE = "done"  # trained all its samples
    CANCELLED = "cancelled"  # cancelled by its user (queued or admitted)
    STOPPED = "stopped"  # ended by the policy (``Decision.stop``: over budget, past its deadline), as the daemon ends it


@dataclass
class SimJob:
    id: str
    spec: JobSpec
    submitted_at: float
    order: int = 0  # submission order (FCFS)
    state: SimJobState = SimJobState.QUEUED
    progress: float = 0.0
    paused_until: float = -math.inf
    last_update: float = 0.0
    rate: float = 0.0  # true samples/s at len(nodes)
    version: int = 0  # bumped on every change; stale completion events are ignored
    finished_at: float | None = None
    admitted_at: float | None = None  # first admission
    preemptions: int = 0
    rescales: int = 0
    runs: int = 0  # starts from zero nodes (the first is a cold start, the others restarts)
    run_since: float | None = None  # its current run's checkpoint clock starts here (None: not running)
    committed: float = 0.0  # progress at its last checkpoint commit
    lost_samples: float = 0.0  # progress rolled back to the last commit at stops
    paused_node_seconds: float = 0.0
    node_seconds: float = 0.0
    user_curve: Mapping[int, float] | None = None  # what the user told the policy (ground truth's doing)
    monitor: SimJobMonitor | None = None
    last_n: int = 0  # node count at the last change (for the monitor)
    held: tuple[str, ...] = ()  # its nodes at its last change
    joining: set[str] = field(default_factory=set)  # nodes it grew onto whose workers are not ready yet
    join_at: float = -math.inf  # when they are (the last grow's time + the calibration's join_s)
    # profiling accounting: every node-second the job holds while its profile runs, the part of it lost to rescale
    # pauses, the samples those pauses cost, and its scale-ups while profiling (inverse order: exactly 1)
    profiled: bool = False
    profiling_node_seconds: float = 0.0
    profiling_paused_node_seconds: float = 0.0
    profiling_lost_samples: float = 0.0
    profiling_scale_ups: int = 0
    # (time, samples done, nodes held from then on, paused until) at every change
    history: list[tuple[float, float, int, float]] = field(default_factory=list)
    stop: Stop | None = None  # why the policy ended it (``Decision.stop``), if it did

    @cached_property
    def one_node_rate(self) -> float:
        """The job's true rate at one node (linear through the origin below its first point)."""
        return throughput_at(self.spec.scaling, 1)

    def stopped(self) -> None:
        """It runs on no node any more (the ledger has freed them): it trains nothing."""
        self.rate = 0.0
        self.version += 1

    @property
    def work_left(self) -> float:
        """Samples it still has to train."""
        left = self.spec.samples - self.progress
        return left if left > 0.0 else 0.0

    def commit(self, last: float, t: float, interval: float) -> None:
        """Set ``committed`` to its progress at its last checkpoint commit in ``(last, t]`` (commits come
        every ``interval`` s after its run started; 0: every step, nothing is ever lost). Called before
        its progress over ``[last, t)`` is added; its rate is constant over it."""
        since = self.run_since
        if since is None:
            return
        if interval <= 0:
            self.committed = min(self.spec.samples, self.progress + self.rate * max(0.0, t - max(last, self.paused_until)))
            return
        k = math.floor((t - since) / interval)
        tc = since + k * interval
        if k >= 1 and tc > last:
            self.committed = min(self.spec.samples,
                                 self.progress + self.rate * max(0.0, tc - max(last, self.paused_until)))


@dataclass(frozen=True)
class Completion:
    job_id: str
    version: int


@dataclass(frozen=True)
class Arrival:
    spec: JobSpec


@dataclass(frozen=True)
class Cancel:
    """The user cancels ``job_id`` (queued or admitted): it leaves with its nodes (:meth:`Simulator.cancel_at`)."""

    job_id: str


@dataclass(frozen=True)
class PilotUp:
    """The pilots of ``nodes``, submitted when those nodes went idle at ``since``, run now."""

    nodes: tuple[str, ...]
    since: float


@dataclass(frozen=True)
class Joined:
    """The workers on the nodes ``job_id`` grew onto may be ready (if no later grow moved its ``join_at``)."""

    job_id: str


@dataclass(frozen=True)
class Decide:
    """A deferred decision (``min_interval_s`` > 0)."""


@dataclass(frozen=True)
class End:
    pass


@dataclass(frozen=True)
class Wake:
    """A time a policy asked to decide again at (``Policy.wakeups``), e.g. a profiling step's end."""


USERS = ("workload", "job")  # SimConfig.users


@dataclass(frozen=True)
class SimConfig:
    """The replay's own settings (the policy's knobs are in :class:`policy.PolicyConfig`)."""

    start: float | None = None  # replay window (defaults: the trace's span)
    end: float | None = None
    charge_start: bool = False  # a start from zero nodes is free, as in the allocator's cost model, unless True
    # Ask the policy at most once per this many seconds (0: at every timestamp with a change). Node changes still apply
    # at their exact time: a recalled node leaves its job at once; new idle nodes wait in the pool for the next one.
    min_interval_s: float = 0.0
    record_noise: float = 0.03  # step times of the simulated monitor's records vary by this fraction (uniform)
    # cap every job's max_nodes (None: the workload's own, 64 for the streams); the evaluation replays at 16 and 64
    max_nodes: int | None = None
    # what starts, restarts, pilots, rollbacks and rescales cost (simulator.calibration): None is the free ablation
    # here; simulate() and the CLI pass the shipped calibration
    calibration: Calibration | None = None
    # a recall of one of our nodes is known this long before it comes, as a scheduler's planned start is (the daemon
    # feeds such times to its ledger as recall_expected); 0: none is known in advance
    recall_notice_s: float = 0.0
    # whose each job is, for fair share (policy.fairness): "workload" (each job's spec says; the generated streams are
    # one user each) or "job" (each job its own user: the most users fair share can see)
    users: str = "workload"

    def __post_init__(self) -> None:
        if self.users not in USERS:
            raise ValueError(f"users {self.users!r}: choose {' or '.join(USERS)}")
        if not (self.recall_notice_s >= 0) or math.isinf(self.recall_notice_s):
            raise ValueError(f"recall_notice_s must be a finite number >= 0 s, got {self.recall_notice_s}")
        if self.max_nodes is not None and self.max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {self.max_nodes}")
        if not (self.min_interval_s >= 0) or math.isinf(self.min_interval_s):
            raise ValueError(f"min_interval_s must be a finite number >= 0 s, got {self.min_interval_s}")
        if not 0.0 <= self.record_noise < 1.0:
            raise ValueError(f"record_noise must be in [0, 1), got {self.record_noise}")


@dataclass(frozen=True)
class DecisionRow:
    """One line of events.csv: the state right after a decision."""

    time: float
    idle_nodes: int
    used_nodes: int
    running_jobs: int
    queued_jobs: int
    rescales: int
    decision_ms: float
    # the idle pool is at most what the admitted jobs can absorb at their max nodes
    constrained: bool = True


@dataclass
class SimResult:
    summary: dict
    rows: list[DecisionRow]
    jobs: list[SimJob]
    start: float
    end: float
    decisions: list[Decision] = field(default_factory=list)  # kept only with ``keep_decisions``


def check_counts(name: str, job: SimJob, new: tuple[str, ...]) -> None:
    """Policy ``name`` gives ``job`` the nodes ``new``: each once, within the job's min..max (or none)."""
    n = len(new)
    if len(set(new)) != n:
        raise PolicyError(f"policy {name}: job {job.id} is given a node twice")
    if n and not (job.spec.min_nodes <= n <= job.spec.max_nodes):
        raise PolicyError(f"policy {name}: job {job.id} given {n} nodes, outside "
                          f"{job.spec.min_nodes}..{job.spec.max_nodes}")
