"""What every cluster backend shares: the protocols, node/pilot states, events, commands.

Two protocols live here. :class:`Backend` is the synchronous, node-keyed one the
daemon uses today with the local backend (``idle_nodes`` / ``hold`` / ``release``
/ ``poll``). :class:`SchedulerBackend` is the one for real schedulers, whose
pilots are batch jobs: ``discover`` (idle nodes and known future claims),
``submit(PilotRequest) -> PilotId``, ``cancel``, and ``poll`` for pilot events
(queued / started / ending / ended with an :class:`EndReason`). Both share one
:class:`PilotState` enum and one :data:`TRANSITIONS` table; the Slurm and PBS
backends (``scavenger.slurm``, ``scavenger.pbs``) run on the shared machinery of
``scavenger.pilots``. Scheduler commands go through :func:`run_command`, whose
failures are typed :class:`BackendError` subclasses carrying the
:class:`CommandResult`.
"""

from __future__ import annotations

import enum
import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, NewType, Protocol, Sequence, Union


class NodeState(enum.Enum):
    """A node as the main scheduler reports it (each backend maps its own states here)."""

    IDLE = "idle"
    """Free in the main scheduler: a scavenger may hold it."""
    BUSY = "busy"
    """Allocated to a main-queue job (or reserved): not ours."""
    DOWN = "down"
    """Drained, down or offline: nobody can use it."""
    UNKNOWN = "unknown"
    """A state string this backend does not know; treated as not idle."""


class PilotState(enum.Enum):
    """One pilot (a batch job holding nodes, or a local agent process), for every backend.

    Each backend translates its scheduler's states here in one table
    (``scavenger.slurm.SLURM_STATES``, ``scavenger.pbs.PBS_STATES``); a state it
    does not know becomes :attr:`UNKNOWN`. Allowed moves are :data:`TRANSITIONS`.
    """

    QUEUED = "queued"
    """Submitted, not on a node yet. Slurm PENDING, CONFIGURING, REQUEUED, REQUEUE_HOLD,
    REQUEUE_FED, RESV_DEL_HOLD; PBS Q, H, W, T. Local: agent spawned, not connected."""
    RUNNING = "running"
    """On its node(s) until its walltime. Slurm RUNNING, RESIZING, SIGNALING; PBS R, B.
    Local: agent connected."""
    ENDING = "ending"
    """Will end by a known deadline: preempted within its grace time (Slurm end time cut
    short), walltime near, completing. Slurm COMPLETING, STAGE_OUT; PBS E."""
    SUSPENDED = "suspended"
    """Stopped in place by the scheduler (preemption by suspension): its node works for
    someone else, so it counts as a recall and the backend cancels it. Slurm SUSPENDED,
    STOPPED; PBS S, U."""
    ENDED = "ended"
    """Gone; the :class:`EndReason` says why. Slurm COMPLETED, CANCELLED, PREEMPTED,
    TIMEOUT, DEADLINE, FAILED, NODE_FAIL, BOOT_FAIL, OUT_OF_MEMORY, SPECIAL_EXIT, REVOKED;
    PBS F, X, M."""
    UNKNOWN = "unknown"
    """A scheduler state this backend does not know; never usable, never terminal."""

    # The local backend's names (scavenger/local.py), aliases of the members above until
    # it speaks :class:`SchedulerBackend`.
    HOLDING = "queued"
    HELD = "running"
    RECALLED = "ended"
    RELEASED = "ended"

    @property
    def terminal(self) -> bool:
        return self is PilotState.ENDED


TRANSITIONS: dict[PilotState, frozenset[PilotState]] = {
    PilotState.QUEUED: frozenset(
        {PilotState.RUNNING, PilotState.ENDING, PilotState.SUSPENDED, PilotState.ENDED, PilotState.UNKNOWN}
    ),
    # RUNNING -> QUEUED: requeued by the scheduler (pilots ask for --no-requeue; an admin may still).
    PilotState.RUNNING: frozenset(
        {PilotState.QUEUED, PilotState.ENDING, PilotState.SUSPENDED, PilotState.ENDED, PilotState.UNKNOWN}
    ),
    PilotState.ENDING: frozenset({PilotState.ENDED, PilotState.UNKNOWN}),
    PilotState.SUSPENDED: frozenset({PilotState.RUNNING, PilotState.ENDING, PilotState.ENDED, PilotState.UNKNOWN}),
    PilotState.UNKNOWN: frozenset(
        {PilotState.QUEUED, PilotState.RUNNING, PilotState.ENDING, PilotState.SUSPENDED, PilotState.ENDED}
    ),
    PilotState.ENDED: frozenset(),
}
"""The only pilot moves (same-state moves are no-ops): shared by every backend."""
_TRANSITIONS = TRANSITIONS


def can_move(old: PilotState, new: PilotState) -> bool:
    return old is new or new in TRANSITIONS[old]


class EndReason(enum.Enum):
    """Why a pilot ended."""

    PREEMPTED = "preempted"
    """The main scheduler took the node back (Slurm PreemptTime set or PREEMPTED; PBS S, or
    deleted by preemption)."""
    TIMEOUT = "timeout"
    """The pilot reached its walltime (Slurm TIMEOUT, DEADLINE; PBS walltime exceeded)."""
    CANCELLED = "cancelled"
    """Cancelled: by us (``cancel``) or by someone else (the detail says which)."""
    FAILED = "failed"
    """The job or its node failed (Slurm FAILED, NODE_FAIL, BOOT_FAIL, OUT_OF_MEMORY; PBS
    nonzero exit)."""
    EXITED = "exited"
    """The agent left on its own (released by the daemon, or it lost the daemon)."""
    UNKNOWN = "unknown"
    """The scheduler forgot the job before we learnt how it ended."""


class PilotStateError(RuntimeError):
    """An impossible pilot transition; the message names the node and both states."""


@dataclass
class Pilot:
    """A held node: its backend handle (process id, batch job id) and state."""

    node: str
    state: PilotState = PilotState.HOLDING
    handle: str = ""
    since: float = field(default_factory=time.time)


class PilotTable:
    """All pilots of one backend, with the only allowed transitions.

    IDLE (no pilot) -> HOLDING -> HELD (agent up) -> RECALLED | RELEASED.
    Terminal pilots are dropped, so a node can be held again later.
    """

    def __init__(self) -> None:
        self._pilots: dict[str, Pilot] = {}

    def __contains__(self, node: object) -> bool:
        return node in self._pilots

    def get(self, node: str) -> Pilot | None:
        return self._pilots.get(node)

    def nodes(self, *states: PilotState) -> set[str]:
        return {n for n, p in self._pilots.items() if not states or p.state in states}

    def hold(self, node: str, handle: str = "") -> Pilot:
        if node in self._pilots:
            return self._pilots[node]  # idempotent
        pilot = Pilot(node, PilotState.HOLDING, handle)
        self._pilots[node] = pilot
        return pilot

    def move(self, node: str, new: PilotState) -> Pilot | None:
        """Move ``node``'s pilot to ``new``; same-state moves are no-ops; unknown nodes give None."""
        pilot = self._pilots.get(node)
        if pilot is None:
            return None
        if pilot.state == new:
            return pilot
        if new not in _TRANSITIONS[pilot.state]:
            raise PilotStateError(f"node {node}: pilot cannot go from {pilot.state.value} to {new.value}")
        pilot.state = new
        pilot.since = time.time()
        if new.terminal:
            del self._pilots[node]
        return pilot


# ---- events a backend reports -------------------------------------------------------


@dataclass(frozen=True)
class NodeIdle:
    """The main scheduler left ``node`` idle: it may be held."""

    node: str


@dataclass(frozen=True)
class NodeRecalled:
    """The main scheduler took ``node`` back, without notice. ``held``: we had a pilot there."""

    node: str
    held: bool


@dataclass(frozen=True)
class AgentUp:
    """The node agent on ``node`` connected (pilot HELD)."""

    node: str


@dataclass(frozen=True)
class AgentGone:
    """The node agent on ``node`` left or stopped heartbeating; ``reason`` says which."""

    node: str
    reason: str


BackendEvent = Union[NodeIdle, NodeRecalled, AgentUp, AgentGone]


class Backend(Protocol):
    """One cluster backend (``local``; Slurm and PBS later)."""

    name: str

    def idle_nodes(self) -> set[str]:
        """Nodes the main scheduler leaves idle now that we do not hold."""

    def held_nodes(self) -> set[str]:
        """Nodes we hold a pilot on (HOLDING or HELD)."""

    def hold(self, node: str) -> Pilot:
        """Start a pilot on ``node`` (its agent connects to the daemon); idempotent."""

    def agent_up(self, node: str, pid: int = 0) -> None:
        """The daemon heard ``node``'s agent: its pilot is HELD (adopted if this backend lost track)."""

    def release(self, node: str) -> None:
        """Give ``node`` back to the main scheduler; idempotent."""

    def poll(self) -> list[BackendEvent]:
        """What changed since the last poll (never blocks long)."""

    def close(self) -> None:
        """Release every pilot; idempotent."""


# ---- commands (Slurm/PBS backends: render argv -> run -> parse) -------------------


@dataclass(frozen=True)
class CommandResult:
    """One scheduler command as it ran."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    elapsed: float


class BackendError(RuntimeError):
    """A scheduler command that failed; carries its :class:`CommandResult` (if it ran)."""

    def __init__(self, message: str, result: CommandResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class CommandFailed(BackendError):
    """The command could not run or exited nonzero; the message names it and its stderr."""


class CommandTimeout(BackendError):
    """The command hung past its timeout (and was killed)."""


class BadReply(BackendError):
    """The command ran but its output is not what the parser expects; the message names the
    command and the offending line or field."""


class Throttled(BackendError):
    """A submission refused now (rate limit, backoff after failures, or the cap on pilots in
    flight); retry at ``retry_at`` (backend clock) or when a pilot ends (``retry_at`` None)."""

    def __init__(self, message: str, retry_at: float | None) -> None:
        super().__init__(message, None)
        self.retry_at = retry_at


def run_command(
    argv: Sequence[str], timeout: float = 30.0, check: bool = True, env: Mapping[str, str] | None = None
) -> CommandResult:
    """Run ``argv`` (never through a shell) and capture it.

    ``env`` adds to this process's environment. Raises :class:`CommandTimeout` when it
    hangs past ``timeout`` and :class:`CommandFailed` when it cannot start or (with
    ``check``) exits nonzero; both carry the :class:`CommandResult` when it ran.
    """
    args = tuple(str(a) for a in argv)
    if not args:
        raise CommandFailed("empty command")
    full_env = {**os.environ, **env} if env else None
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, check=False, env=full_env,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise CommandFailed(f"command not found: {args[0]}") from None
    except PermissionError as exc:
        raise CommandFailed(f"cannot run {args[0]}: {exc}") from None
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        res = CommandResult(args, -1, out, err, time.monotonic() - t0)
        raise CommandTimeout(f"{' '.join(args)}: timed out after {timeout:g} s", res) from None
    res = CommandResult(args, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)
    if check and proc.returncode != 0:
        raise CommandFailed(f"{' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()[:200]}", res)
    return res


Runner = Callable[..., CommandResult]
"""How a backend runs a command: ``runner(argv, timeout=..., check=..., env=...)``
(:func:`run_command`, or a fake in tests)."""


# ---- the protocol for real schedulers (Slurm, PBS; local later) -------------------

PilotId = NewType("PilotId", str)
"""A pilot's handle: the batch job id (``123``, ``123.pbs-server``) that its agents
report in their hello (``SLURM_JOB_ID`` / ``PBS_JOBID``)."""


@dataclass(frozen=True)
class PilotRequest:
    """Ask for one pilot on ``nodes`` (empty: any nodes of the pilot partition).

    ``walltime_s`` None uses the backend's configured walltime. ``after``: start only
    when that pilot has ended (a walltime replacement on the same nodes).
    """

    nodes: tuple[str, ...] = ()
    walltime_s: float | None = None
    after: PilotId | None = None


@dataclass(frozen=True)
class NodeInfo:
    """A node as the main scheduler reports it; ``raw`` is its state string as printed."""

    name: str
    state: NodeState
    planned: bool = False
    raw: str = ""

    @property
    def holdable(self) -> bool:
        """Idle and not planned for a pending main-queue job."""
        return self.state is NodeState.IDLE and not self.planned


@dataclass(frozen=True)
class Claim:
    """A pending main-queue job the scheduler plans to start on ``nodes`` at ``start``."""

    job: str
    nodes: tuple[str, ...]
    start: float | None
    partition: str = ""


@dataclass(frozen=True)
class Discovery:
    """One look at the machine: every node of the pilot partition, and known future claims.

    ``idle``: nodes a pilot may hold now (idle, not planned, no live pilot of ours).
    """

    nodes: tuple[NodeInfo, ...]
    claims: tuple[Claim, ...]
    idle: frozenset[str]
    at: float

    def recall_time(self, node: str) -> float | None:
        """The earliest known start of a main-queue job on ``node`` (None: none known)."""
        starts = [c.start for c in self.claims if node in c.nodes and c.start is not None]
        return min(starts) if starts else None


@dataclass(frozen=True)
class PilotQueued:
    """``pilot`` was submitted (``replaces``: the pilot it takes over from at walltime) or,
    with ``requeued``, sent back to the queue by the scheduler (its nodes are lost)."""

    pilot: PilotId
    nodes: tuple[str, ...] = ()
    replaces: PilotId | None = None
    requeued: bool = False


@dataclass(frozen=True)
class PilotStarted:
    """``pilot`` runs on ``nodes`` until ``expires_at`` (its walltime; None: no limit)."""

    pilot: PilotId
    nodes: tuple[str, ...]
    expires_at: float | None


@dataclass(frozen=True)
class PilotEnding:
    """``pilot`` will be gone by ``deadline``: preempted (grace time), suspended, walltime
    near (a replacement is queued when renewal is on), or completing."""

    pilot: PilotId
    nodes: tuple[str, ...]
    deadline: float | None
    reason: EndReason


@dataclass(frozen=True)
class PilotEnded:
    """``pilot`` is gone and its ``nodes`` with it; ``detail`` is the scheduler's wording."""

    pilot: PilotId
    nodes: tuple[str, ...]
    reason: EndReason
    detail: str = ""


PilotEvent = Union[PilotQueued, PilotStarted, PilotEnding, PilotEnded]


class SchedulerBackend(Protocol):
    """A backend whose pilots are batch jobs (Slurm, PBS; the local backend can speak it too).

    Every method runs at most a few scheduler commands, each with a timeout. A command
    that fails, hangs or answers garbage raises a :class:`BackendError` subclass
    (carrying the :class:`CommandResult`); the backend then keeps its last known pilot
    states unchanged and returns no stale data: callers skip that round's decision.
    """

    name: str

    def discover(self) -> Discovery:
        """Idle nodes a pilot may hold now, and known future claims (one node and one queue
        query). Raises :class:`BackendError`."""

    def submit(self, request: PilotRequest) -> PilotId:
        """Submit one pilot; :class:`Throttled` when the rate limit, backoff or cap stops it,
        :class:`BackendError` when the scheduler refuses it."""

    def cancel(self, pilot: PilotId) -> None:
        """Cancel ``pilot`` and its queued replacement; idempotent (ended pilots are fine)."""

    def poll(self) -> list[PilotEvent]:
        """What happened to our pilots since the last poll: one queue query for all of them
        (plus one lookup per pilot that just ended, to tell why). Raises :class:`BackendError`."""

    def pilots(self) -> Mapping[PilotId, "PilotView"]:
        """Every pilot not yet reported ended, with its state and nodes."""

    def close(self) -> None:
        """Cancel every pilot; idempotent."""


@dataclass(frozen=True)
class PilotView:
    """A read-only look at one pilot."""

    id: PilotId
    state: PilotState
    nodes: tuple[str, ...]
    expires_at: float | None
    replaces: PilotId | None = None
