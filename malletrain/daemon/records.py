"""The daemon's records and constants: a job as the daemon runs it (:class:`JobRun`), a trainer,
how a worker's exit and a rescale are read, and the names of its files and store keys."""

from __future__ import annotations

import enum
from dataclasses import InitVar, dataclass, field

from contract.exits import EXIT_STORE_LOST, STOP_SIGNALS, signal_exit
from malletrain.daemon.config import TrainerConfig
from malletrain.daemon.jobspec import JOB_TRANSITIONS, JobSpec, JobState
from policy import Decision, Ledger, Loss, Policy
from profiler.estimators import RescaleEvent

STATE_FILE = "daemon.json"
STORE_FILE = "store.db"
LEAVE_GRACE_S = 5.0  # a dropped worker leaves at its next commit; killed after this
START_RETRY_S = 3.0
JOIN_BATCH_S = 0.5
"""A worker ready to join a running world waits at most this long for the job's other joining workers,
so that nodes back together join in one rescale; past it, the ready ones join now and the others in a
later one. (A job's first world waits for all its workers, as before.)"""


def stopped_from_outside(code: int) -> bool:
    """Whether a worker's exit ``code`` says it was stopped (a recall, a cancel, a kill, the daemon's store
    gone), not that the job's own code failed: only failures count toward ``max_failures``."""
    return code == EXIT_STORE_LOST or any(code in (-sig, signal_exit(sig)) for sig in STOP_SIGNALS)


def stopped_by_us(code: int, agent_stopped: bool, inherited: bool) -> bool:
    """Whether a worker's exit is a stop we caused, known by us rather than from its code: its agent stopped
    it and the code says so, or it exited :data:`EXIT_STORE_LOST` after an earlier daemon started it. A
    job's own exit 143, 137, 130, 129 or 75 counts toward ``max_failures``."""
    if agent_stopped:
        return stopped_from_outside(code)
    return inherited and code == EXIT_STORE_LOST


REPLAN_S = 10.0  # decide at least this often (estimates drift), besides every event
POLICY_STATE_KEY = "policy_state"
NODE_SECONDS_KEY = "node_seconds"  # store meta: {job: node-seconds its workers held} for live jobs
CHECKPOINT_DIR = "checkpoints"  # STATE_DIR/checkpoints/<job>.ckpt: suspended jobs' state (torch runtime)
STOPPED = "daemon stopped"  # the reason a clean stop gives the jobs it suspends
STOP_WAIT_S = 15.0  # a clean stop waits at most this long for the workers it stopped to exit


def rescale_kind(ev: RescaleEvent, emptied_at: float | None) -> str:
    """``up`` or ``down``; ``resume`` when the job had no worker during the gap (it waited for nodes:
    no pause of running workers)."""
    if emptied_at is not None and ev.timestamp <= emptied_at <= ev.timestamp + ev.gap_s:
        return "resume"
    return "up" if ev.is_up else "down"


class DaemonError(RuntimeError):
    """The daemon cannot start (state dir locked, runtime missing); the message says why."""


class JobPhase(enum.Enum):
    """Where a job the daemon runs is: a :class:`JobState` (what the store keeps) or one of two phases only a
    running daemon knows (stored as the state before them); changed only by :meth:`JobRun.move`."""

    PENDING = "pending"
    PROFILING = "profiling"
    RUNNING = "running"
    RESCALING = "rescaling"
    SUSPENDED = "suspended"
    ADOPTED = "adopted"
    """The last daemon ran it: its workers may come back while the adoption window is open."""
    ENDING = "ending"
    """An end observed (a worker's exit, its target, a cancel, the policy's stop): act carries it out."""
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def stored(self) -> JobState | None:
        """The state the store keeps for this phase (None: a daemon's own, stored as the phase before)."""
        return None if self in (JobPhase.ADOPTED, JobPhase.ENDING) else JobState(self.value)

    @property
    def live(self) -> bool:
        """Neither ended nor ending: it holds nodes, or waits for them."""
        return self is not JobPhase.ENDING and bool(JOB_PHASES[self])


_ENDS = frozenset({JobPhase.COMPLETED, JobPhase.FAILED, JobPhase.CANCELLED})
JOB_PHASES: dict[JobPhase, frozenset[JobPhase]] = {
    # the store's moves (:data:`JOB_TRANSITIONS`), and from each live state an end observed
    **{JobPhase(s.value): frozenset({JobPhase(t.value) for t in to} | ({JobPhase.ENDING} if to else set()))
       for s, to in JOB_TRANSITIONS.items()},
    # the last daemon's job: placed again as stored, suspended (its workers did not come back), or ended
    JobPhase.ADOPTED: _ENDS | {JobPhase.PROFILING, JobPhase.RUNNING, JobPhase.RESCALING, JobPhase.SUSPENDED,
                               JobPhase.ENDING},
    JobPhase.ENDING: _ENDS,  # act ends it (as asked, or as the store already has it)
}
"""The one table of a daemon job's phases: :meth:`JobRun.move` enforces it."""


class PhaseError(RuntimeError):
    """A move of a job's phase that :data:`JOB_PHASES` does not allow; the message names it."""


@dataclass
class Trainer:
    """One trainer (``[[trainers]]``): its own nodes, its own policy and state, its own decisions."""

    config: TrainerConfig
    policy: Policy
    last_decision: Decision | None = None
    profiling: frozenset[str] = frozenset()  # its jobs the last decision profiles
    ledger: Ledger = field(default_factory=Ledger)  # its usable nodes, its live jobs' node sets: builds its View

    @property
    def name(self) -> str:
        return self.config.name


@dataclass
class JobRun:
    """The daemon's in-memory view of a non-terminal job."""

    id: str
    spec: JobSpec
    state: JobState  # as the store keeps it (while ADOPTED or ENDING: as it was before); moves with the phase
    adopted: InitVar[bool] = False  # the last daemon ran it: its phase starts ADOPTED
    base_samples: int = 0  # progress stored before this daemon started
    members: list[str] = field(default_factory=list)  # nodes of the published member list
    published: tuple[str, ...] = ()  # worker ids of the published member list, in rank order
    workers: dict[str, str] = field(default_factory=dict)  # node -> worker id (members + joining)
    started: set[str] = field(default_factory=set)  # worker ids the agent confirmed
    inherited: set[str] = field(default_factory=set)  # worker ids an earlier daemon started (adopted)
    start_sent: dict[str, float] = field(default_factory=dict)  # worker id -> last start request
    ready_at: dict[str, float] = field(default_factory=dict)  # joining worker id -> when first seen ready
    leaving: dict[str, tuple[str, float]] = field(default_factory=dict)  # worker -> (node, kill time)
    emptied_at: float | None = None  # when the job last lost all its workers (suspended or stopped)
    failures: int = 0  # failures since its last progress (policy.health.failed_for_good)
    early_failures: int = 0  # of those, the last ones in a row that came before a first step
    last_progress: int = 0
    progress_at: float | None = None  # when its progress last grew (this daemon's clock)
    workers_since: float | None = None  # when act started its workers from none (None: it runs none)
    stalled: str = ""  # observed: how long it has been silent, once past its stall bound ("": not stalled)
    stalled_s: float = 0.0  # the same in seconds (0: not stalled)
    stall_restarts: int = 0  # restarts for a stall since its last progress
    restart: str = ""  # observed: its workers are to be stopped and started again (act does it), and why
    rescales: list[RescaleEvent] = field(default_factory=list)  # measured pauses (resumes left out)
    waiting: str = ""  # why the policy keeps it queued
    left_on: tuple[str, ...] | None = None  # the last daemon's job, until its adoption is over: the nodes it
    #                                         ran it on (its stored members)
    saved_samples: int = 0  # progress last written to the store
    ending: tuple[JobState, str] | None = None  # the end asked (phase ENDING: act makes it so), and why
    suspended_by: Loss | None = None  # its ledger's Loss that left it below its min: act suspends it, saying why
    owner: tuple[int | None, int | None] = (None, None)  # (uid, gid) of the submitter
    umask: int | None = None  # the submitter's, recorded at submit: its workers run with it
    phase: JobPhase = field(init=False)  # where it is (:data:`JOB_PHASES`): changed by :meth:`move` alone

    # Each field has one writer (``tests/test_daemon_writers.py`` holds it): act writes what it
    # publishes, observe what its workers reported, decide what the policy and the ledger say, adoption
    # the last daemon's nodes; the transitions below, of its phase, its worker table, its progress, its
    # health and an end asked for, are the record's own, called by the parts.

    def __post_init__(self, adopted: bool) -> None:
        self.phase = JobPhase.ADOPTED if adopted else JobPhase(self.state.value)

    def move(self, to: JobPhase) -> bool:
        """The one way its phase changes, by a move :data:`JOB_PHASES` allows (its state with it, when
        the store keeps ``to``); another raises :class:`PhaseError`. Staying put is no move (False)."""
        if to is self.phase:
            return False
        if to not in JOB_PHASES[self.phase]:
            raise PhaseError(f"job {self.id}: no move from {self.phase.value} to {to.value}")
        self.phase, self.state = to, to.stored or self.state
        return True

    def end(self, state: JobState, reason: str) -> bool:
        """Observe's (and decide's, and a sweep's) way to end a job: recorded now, carried out by act
        (the first reason wins). Returns whether that changed anything (a job to decide again for)."""
        if not self.phase.live:  # ended, or ending already
            return False
        self.ending = (state, reason)
        return self.move(JobPhase.ENDING)

    def end_failed_instead(self, reason: str) -> None:
        """The end asked for is FAILED, for ``reason`` (a trial that completed without its value)."""
        self.ending = (JobState.FAILED, reason)

    def new_worker(self, node: str, worker: str) -> None:
        """``worker`` runs the job on ``node`` (act started it, or an agent reported it after a restart)."""
        self.workers[node] = worker

    def worker_leaves(self, node: str, kill_at: float) -> str:
        """The job's worker on ``node`` is told to leave; killed at ``kill_at`` if still there. Returns its id."""
        worker = self.workers.pop(node)
        self.leaving[worker] = (node, kill_at)
        return worker

    def all_workers_leave(self, kill_at: float) -> list[tuple[str, str]]:
        """Every worker of the job is told to leave (killed at ``kill_at``); returns them as (node, worker)."""
        gone = list(self.workers.items())
        for node, worker in gone:
            self.leaving[worker] = (node, kill_at)
        self.workers.clear()
        return gone

    def kill_again_at(self, worker: str, node: str, at: float) -> None:
        self.leaving[worker] = (node, at)

    def worker_gone(self, node: str) -> str | None:
        """The job's worker on ``node`` is gone (exited, or lost with its node). Returns its id, if any."""
        worker = self.workers.pop(node, None)
        if worker:
            self.leaving.pop(worker, None)
        return worker

    def worker_left(self, worker: str) -> bool:
        """A worker told to leave has exited. Returns whether it was one."""
        return self.leaving.pop(worker, None) is not None

    def progressed(self, progress: int, now: float) -> bool:
        """Progress read from the job's reports: if it grew, its failures and stall restarts count
        from zero again. Returns whether it grew."""
        if progress <= self.last_progress:
            return False
        self.last_progress = progress
        self.progress_at = now
        self.failures = self.early_failures = self.stall_restarts = 0
        return True

    def samples_saved(self, progress: int) -> None:
        self.saved_samples = progress

    def counted_from_zero(self, reported: int) -> int:
        """Its new world trains from step 0: the samples counted so far are gone; ``reported``: what
        its reports added so far (counted from here on). Returns the samples lost."""
        lost = self.last_progress
        self.base_samples = -reported
        self.last_progress = self.saved_samples = 0
        return lost

    def worker_failed(self, before_first_step: bool) -> None:
        """A worker of the job's own code failed (toward ``max_failures``)."""
        self.failures += 1
        self.early_failures = self.early_failures + 1 if before_first_step else 0

    def note_stall(self, text: str, silent_s: float) -> None:
        """How long it has been silent past its stall bound (``""``, 0: not stalled)."""
        self.stalled, self.stalled_s = text, silent_s

    def ask_restart(self, reason: str) -> None:
        """Its workers are to be stopped and started again (act does it), and why."""
        self.restart = reason

    def restarted(self) -> None:
        """Act stopped its workers for the restart asked: counted, no longer stalled."""
        self.stall_restarts += 1
        self.restart = self.stalled = ""
        self.stalled_s = 0.0


@dataclass(frozen=True)
class NodeLost:
    """A node this daemon no longer has, whichever way it was learnt: its pilot ended, its agent
    went, or a worker exited on it while its pilot was ending (a recall). One event, handled once."""

    node: str
    reason: str


def submission_order(job_id: str) -> int:
    """Submission order from the store's id (``j000042`` -> 42)."""
    digits = "".join(c for c in job_id if c.isdigit())
    return int(digits) if digits else 0


def job_of(worker_id: str) -> str:
    return worker_id.split(".", 1)[0]
