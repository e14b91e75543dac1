"""What every cluster backend (local, Slurm, PBS) shares: the :class:`SchedulerBackend` protocol,
one :class:`PilotState` enum with one :data:`TRANSITIONS` table, pilot events, and
:func:`run_command`, whose failures are typed :class:`BackendError` subclasses."""

from __future__ import annotations

import enum
import os
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Mapping, NewType, Protocol, Sequence, Union


class NodeState(enum.Enum):
    """A node as the main scheduler reports it (each backend maps its own states here)."""

    IDLE = "idle"  # free in the main scheduler: a scavenger may hold it
    BUSY = "busy"  # allocated to a main-queue job (or reserved)
    DOWN = "down"  # drained, down or offline
    UNKNOWN = "unknown"  # a state string this backend does not know; never idle


class PilotState(enum.Enum):
    """One pilot (a batch job holding nodes, or a local agent process), for every backend.

    Each backend maps its scheduler's states here in one table (``SLURM_STATES``,
    ``PBS_STATES``); allowed moves are :data:`TRANSITIONS`.
    """

    QUEUED = "queued"  # submitted, not on a node yet (local: agent spawned, not connected)
    RUNNING = "running"  # on its node(s) until its walltime (local: agent connected)
    ENDING = "ending"  # will end by a known deadline: preempted in its grace time, walltime near, completing
    SUSPENDED = "suspended"  # stopped in place (preemption by suspension): a recall; the backend cancels it
    ENDED = "ended"  # gone; the EndReason says why
    UNKNOWN = "unknown"  # a scheduler state this backend does not know; never usable, never terminal

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


def can_move(old: PilotState, new: PilotState) -> bool:
    return old is new or new in TRANSITIONS[old]


class EndReason(enum.Enum):
    """Why a pilot ended."""

    PREEMPTED = "preempted"  # the main scheduler took the node back
    TIMEOUT = "timeout"  # the pilot reached its walltime
    CANCELLED = "cancelled"  # by us or by someone else (the detail says which)
    FAILED = "failed"  # the job or its node failed
    EXITED = "exited"  # the agent left on its own (released by the daemon, or it lost the daemon)
    UNKNOWN = "unknown"  # the scheduler forgot the job before we learnt how it ended


class PilotStateError(RuntimeError):
    """An impossible pilot transition; the message names the node and both states."""


# ---- events the agent hub reports -------------------------------------------------------


@dataclass(frozen=True)
class AgentUp:
    """The node agent on ``node`` connected (pilot HELD)."""
    node: str


@dataclass(frozen=True)
class AgentGone:
    """The node agent on ``node`` left or stopped heartbeating; ``reason`` says which."""
    node: str
    reason: str


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


def run_command(argv: Sequence[str], timeout: float = 30.0, check: bool = True,
                env: Mapping[str, str] | None = None) -> CommandResult:
    """Run ``argv`` (never through a shell; ``env`` adds to this process's environment).
    :class:`CommandTimeout` past ``timeout``, :class:`CommandFailed` when it cannot start or
    (``check``) exits nonzero; both carry the :class:`CommandResult` when it ran."""
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


CommandHook = Callable[[tuple[str, ...], float, str], None]
"""Told of each command: ``hook(argv, seconds, result)``, ``result`` = ok | failed | timeout."""


def observed(runner: Runner, hook: CommandHook) -> Runner:
    """``runner`` that also tells ``hook`` of every command (``seconds``: its ``elapsed``, 0 when it
    never started); results and errors pass through unchanged."""

    def run(argv: Sequence[str], *args: object, **kwargs: object) -> CommandResult:
        try:
            res = runner(argv, *args, **kwargs)
        except BackendError as exc:
            ran = exc.result
            hook(tuple(str(a) for a in argv), ran.elapsed if ran else 0.0,
                 "timeout" if isinstance(exc, CommandTimeout) else "failed")
            raise
        hook(res.argv, res.elapsed, "ok" if res.returncode == 0 else "failed")
        return res

    return run


# ---- the protocol of every backend (local, Slurm, PBS) ------------------------------

PilotId = NewType("PilotId", str)
"""A pilot's handle: the batch job id (``123``, ``123.pbs-server``) that its agents
report in their hello (``SLURM_JOB_ID`` / ``PBS_JOBID``)."""


@dataclass(frozen=True)
class PilotRequest:
    """Ask for one pilot on ``nodes`` (empty: any nodes of the pilot partition).

    ``walltime_s`` None: the configured one. ``after``: start when that pilot has ended (a
    walltime replacement). ``waits_for_node``: queued for nodes the main scheduler holds now (a
    recalled node expected back); its time in the queue counts from when they are free.
    """

    nodes: tuple[str, ...] = ()
    walltime_s: float | None = None
    after: PilotId | None = None
    waits_for_node: bool = False


@dataclass(frozen=True)
class NodeInfo:
    """A node as the main scheduler reports it; ``raw`` is its state string as printed."""

    name: str
    state: NodeState
    planned: bool = False
    raw: str = ""
    gpus: int | None = None
    """GPUs the scheduler says the node has (Slurm ``Gres=gpu:N``, PBS ``ngpus``); None: it says nothing."""

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
    """One look at the machine: every node of the pilot partition, known future claims, and
    ``idle``: nodes a pilot may hold now (idle, not planned, no live pilot of ours)."""
    nodes: tuple[NodeInfo, ...]
    claims: tuple[Claim, ...]
    idle: frozenset[str]
    at: float


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
    """A backend whose pilots are batch jobs (Slurm, PBS) or agent processes (local).

    Every method runs a few scheduler commands, each with a timeout; one that fails, hangs or
    answers garbage raises a :class:`BackendError`, pilot states stay as last known, and callers
    skip that round's decision. ``queues_for_busy_nodes``: a pilot may be queued for a node a
    main-queue job holds (:attr:`PilotRequest.waits_for_node`). The members with a body are the
    plain versions a subclass inherits (the batch backends give faster ones).
    """

    name: str
    queues_for_busy_nodes: bool = False

    @property
    def version(self) -> int | None:
        """Moves whenever :meth:`pilots` changed (a caller skips work derived from them while it
        stays the same); None: not counted, every caller computes again each time."""
        return None

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

    def resume(self, saved: Sequence["SavedPilot"]) -> list[PilotId]:
        """Track again the pilots an earlier daemon left in the scheduler (a restart): each is
        polled like any other (queued, running or ended) and counts towards the cap at once, so
        nothing is submitted twice. Returns the ids taken back (none: a backend that cannot, whose
        pilots come back only through their agents' hellos, :meth:`adopt`); idempotent."""
        return []

    def close(self) -> None:
        """Cancel every pilot; idempotent."""

    def cancel_all(self, pilots: Sequence[PilotId]) -> None:
        """Cancel each of ``pilots`` (a batch backend does it in one command); the first
        :class:`BackendError` stops it."""
        for pilot in pilots:
            self.cancel(pilot)

    def pilots_on(self, node: str) -> list["PilotView"]:
        """The views of the live pilots on ``node`` (asked for it or running there)."""
        return [v for v in self.pilots().values() if node in v.nodes]

    def held_nodes(self) -> Mapping[str, PilotId]:
        """Node -> the RUNNING pilot on it (of two, the last one :meth:`pilots` lists)."""
        out: dict[str, PilotId] = {}
        for pid, view in self.pilots().items():
            if view.state is PilotState.RUNNING:
                for node in view.nodes:
                    out[node] = pid
        return out

    def adopt(self, node: str, batch_job: str, pid: int) -> PilotId | None:
        """The agent of a pilot an earlier daemon left says hello from ``node`` (``batch_job``: the
        id its hello carried, ``pid`` its process): take that pilot over and return its id; None:
        this backend cannot."""
        return None


class AgentRoster(Protocol):
    """What the scavenging side needs of the agent hub (``scavenger.hub.AgentHub``): the nodes
    whose agent is connected, and the batch job each agent said it runs in (the members with a
    body are the plain versions a subclass inherits)."""

    @property
    def version(self) -> int | None:
        """Moves when an agent comes or goes or its batch job changes; None: not counted
        (callers compute again each time)."""
        return None

    def alive(self) -> set[str]:
        """The nodes whose agent is connected."""

    def batch_job(self, node: str) -> str | None:
        """The batch job id ``node``'s agent said it runs in; None if none or unknown."""
        return None

    def batch_jobs(self) -> Mapping[str, str | None] | None:
        """Every connected agent's node -> its :meth:`batch_job`, at once; None: not kept (callers
        ask :meth:`batch_job` node by node)."""
        return None


@dataclass(frozen=True)
class PilotView:
    """A read-only look at one pilot; ``cancelling``: our cancel of it went through, it is
    on its way out; ``waits_for_node``: see :class:`PilotRequest`."""
    id: PilotId
    state: PilotState
    nodes: tuple[str, ...]
    expires_at: float | None
    replaces: PilotId | None = None
    cancelling: bool = False
    waits_for_node: bool = False


@dataclass(frozen=True)
class SavedPilot:
    """What a daemon keeps of one live pilot across a restart (:meth:`SchedulerBackend.resume`):
    its id, the nodes it holds or asked for, the pilot it replaces at walltime, and whether it
    was queued for nodes the main scheduler held (:attr:`PilotRequest.waits_for_node`)."""
    id: PilotId
    nodes: tuple[str, ...] = ()
    replaces: PilotId | None = None
    waits_for_node: bool = False
