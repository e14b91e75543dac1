"""What every cluster backend shares: the protocol, node/pilot states, events, commands.

The daemon talks to a backend only through :class:`Backend`: which nodes the
main scheduler leaves idle, hold one (start a pilot whose node agent connects
back to the daemon), release it, and :meth:`Backend.poll` for what changed
(nodes idle, nodes recalled, pilots gone). The pilot state machine lives in
:class:`PilotTable` so that every backend (local, Slurm, PBS) shares it.
"""

from __future__ import annotations

import enum
import subprocess
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence, Union


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
    """One held node, from the scavenger's side."""

    HOLDING = "holding"
    """Pilot requested (job submitted / process spawned); agent not connected yet."""
    HELD = "held"
    """Agent connected and heartbeating: workers can run here."""
    RECALLED = "recalled"
    """The main scheduler took the node back (no notice); terminal."""
    RELEASED = "released"
    """We gave the node back; terminal."""

    @property
    def terminal(self) -> bool:
        return self in (PilotState.RECALLED, PilotState.RELEASED)


_TRANSITIONS: dict[PilotState, frozenset[PilotState]] = {
    PilotState.HOLDING: frozenset({PilotState.HELD, PilotState.RECALLED, PilotState.RELEASED}),
    PilotState.HELD: frozenset({PilotState.RECALLED, PilotState.RELEASED}),
    PilotState.RECALLED: frozenset(),
    PilotState.RELEASED: frozenset(),
}


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


def run_command(argv: Sequence[str], timeout: float = 30.0, check: bool = True) -> CommandResult:
    """Run ``argv`` (never through a shell) and capture it; raise :class:`BackendError` on failure."""
    args = tuple(str(a) for a in argv)
    if not args:
        raise BackendError("empty command")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise BackendError(f"command not found: {args[0]}") from None
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        res = CommandResult(args, -1, out, err, time.monotonic() - t0)
        raise BackendError(f"{' '.join(args)}: timed out after {timeout:g} s", res) from None
    res = CommandResult(args, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)
    if check and proc.returncode != 0:
        raise BackendError(
            f"{' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()[:200]}", res
        )
    return res
