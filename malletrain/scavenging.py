"""The daemon's side of its scavenger backend: observe pilots, hold idle nodes, give nodes back.

The daemon speaks only :class:`scavenger.base.SchedulerBackend` (local, Slurm, PBS):

observe
    :meth:`Scavenging.look` polls the backend for pilot events (queued / started /
    ending / ended) and discovers idle nodes and known future claims (Slurm's
    planned starts), at most every ``poll_interval`` seconds. A scheduler command
    that fails or hangs leaves the last look in place and marks it **stale**: the
    daemon then submits no pilot and asks the policy nothing until a look succeeds
    again (it catches up from the events of that look).
decide
    the usable nodes (:meth:`Scavenging.usable`) are the nodes of RUNNING pilots
    whose agent is connected and, when the agent's hello carries a batch job id,
    is the agent of that pilot. A pilot that is ENDING (preempted within its
    grace time, or its walltime near) is not usable: jobs leave it at their next
    commit, before the scheduler takes it.
act
    :meth:`Scavenging.hold_idle` submits a pilot for every idle node (in groups of
    ``nodes_per_pilot``; the backend rate-limits and caps them), never a node the
    scheduler planned for a pending job; :meth:`Scavenging.release` cancels the
    RUNNING pilot of nodes whose agent left.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from scavenger.base import (
    BackendError,
    Discovery,
    PilotEnded,
    PilotEnding,
    PilotEvent,
    PilotId,
    PilotQueued,
    PilotRequest,
    PilotStarted,
    PilotState,
    Throttled,
)

log = logging.getLogger("malletrain.scavenging")

EventLog = Callable[..., None]
"""``log_event(kind, job=None, **detail)``: the store's event log."""


@dataclass
class Scavenging:
    """One daemon's backend, its last look at the machine and the rules above.

    ``hub`` is the agent hub (``alive()``; optionally ``batch_job(node)``, the id an
    agent's hello carried). ``clock`` is the daemon's clock.
    """

    backend: Any
    hub: Any
    log_event: EventLog
    nodes_per_pilot: int = 1
    poll_interval: float = 0.0
    discovery: Discovery | None = None
    stale: bool = False
    error: str = ""
    _next_look: float = field(default=0.0, repr=False)
    _hold_blocked_until: float = field(default=0.0, repr=False)

    # ------------------------------------------------------------ observe
    def look(self, now: float) -> list[PilotEvent]:
        """Poll then discover when due; the pilot events of this look ([] when not due or failed)."""
        if now < self._next_look:
            return []
        self._next_look = now + self.poll_interval
        events: list[PilotEvent] = []
        try:
            events = list(self.backend.poll())
            self.discovery = self.backend.discover()
        except BackendError as exc:  # the daemon never dies of a scheduler hiccup; it waits for a good look
            self._failed(exc)
            return events  # what poll told before discover failed is fresh: keep it
        if self.stale:
            self.log_event("backend_ok", backend=self.backend.name, after=self.error)
            log.info("%s backend answers again", self.backend.name)
        self.stale, self.error = False, ""
        return events

    def _failed(self, exc: BackendError) -> None:
        text = f"{type(exc).__name__}: {exc}"
        if not self.stale or text != self.error:
            self.log_event("backend_error", backend=self.backend.name, error=text)
            log.warning("%s backend: %s (no decision until it answers)", self.backend.name, text)
        self.stale, self.error = True, text

    @staticmethod
    def describe(ev: PilotEvent) -> tuple[str, dict[str, Any]]:
        """The event log's kind and fields for a pilot event."""
        base: dict[str, Any] = {"pilot": ev.pilot, "nodes": list(ev.nodes)}
        if isinstance(ev, PilotQueued):
            return "pilot_queued", {**base, "replaces": ev.replaces, "requeued": ev.requeued}
        if isinstance(ev, PilotStarted):
            return "pilot_started", {**base, "expires_at": ev.expires_at}
        if isinstance(ev, PilotEnding):
            return "pilot_ending", {**base, "deadline": ev.deadline, "reason": ev.reason.value}
        assert isinstance(ev, PilotEnded)
        return "pilot_ended", {**base, "reason": ev.reason.value, "detail": ev.detail}

    def adopt(self, node: str, batch_job: str, pid: int) -> PilotId | None:
        """An agent says hello from ``node``: if no pilot of ours runs there (a daemon restart),
        the backend takes its pilot over (backends without ``adopt`` cannot)."""
        if any(node in v.nodes and v.state is not PilotState.QUEUED for v in self.backend.pilots().values()):
            return None
        adopt = getattr(self.backend, "adopt", None)
        if adopt is None:
            return None
        pilot = adopt(node, batch_job, pid)
        if pilot is not None:
            self.log_event("pilot_adopted", pilot=pilot, node=node, pid=pid)
        return pilot

    # ------------------------------------------------------------ decide
    def held(self) -> dict[str, PilotId]:
        """Node -> the RUNNING pilot on it."""
        out: dict[str, PilotId] = {}
        for pid, view in self.backend.pilots().items():
            if view.state is PilotState.RUNNING:
                for node in view.nodes:
                    out[node] = pid
        return out

    def agent_batch_job(self, node: str) -> str:
        get = getattr(self.hub, "batch_job", None)
        if get is None:
            return ""
        try:
            return str(get(node) or "")
        except (KeyError, ValueError):
            return ""

    def usable(self) -> set[str]:
        """Nodes of RUNNING pilots whose own agent is connected."""
        alive = self.hub.alive()
        out = set()
        for node, pid in self.held().items():
            if node in alive:
                batch = self.agent_batch_job(node)
                if not batch or batch == pid:
                    out.add(node)
        return out

    def recall_times(self) -> dict[str, float]:
        """Node -> the earliest known start of a main-queue job planned on it (Slurm ``squeue --start``)."""
        d = self.discovery
        if d is None:
            return {}
        out: dict[str, float] = {}
        for claim in d.claims:
            if claim.start is None:
                continue
            for node in claim.nodes:
                out[node] = min(out.get(node, claim.start), claim.start)
        return out

    def machine_nodes(self) -> tuple[str, ...]:
        d = self.discovery
        return tuple(n.name for n in d.nodes) if d is not None else ()

    # ------------------------------------------------------------ act
    def hold_idle(self, now: float) -> list[PilotId]:
        """A pilot for every idle node no pilot of ours asks for (never on stale data)."""
        d = self.discovery
        if self.stale or d is None or now < self._hold_blocked_until:
            return []
        taken = {n for v in self.backend.pilots().values() for n in v.nodes}
        free = sorted(d.idle - taken)
        out: list[PilotId] = []
        for i in range(0, len(free) - self.nodes_per_pilot + 1, self.nodes_per_pilot):
            nodes = tuple(free[i: i + self.nodes_per_pilot])
            try:
                pid = self.backend.submit(PilotRequest(nodes))
            except Throttled as exc:
                self._hold_blocked_until = exc.retry_at if exc.retry_at is not None else now + self.poll_interval
                break
            except BackendError as exc:
                self.log_event("pilot_submit_error", nodes=list(nodes), error=str(exc))
                log.warning("%s: submitting a pilot on %s: %s", self.backend.name, nodes, exc)
                break
            self.log_event("pilot_submitted", pilot=pid, nodes=list(nodes))
            out.append(pid)
        return out

    def release(self, nodes: set[str]) -> None:
        """Cancel the RUNNING pilot of each of ``nodes`` whose agent is (still) gone."""
        alive = self.hub.alive()
        held = self.held()
        for pid in sorted({held[n] for n in nodes if n in held and n not in alive}):
            try:
                self.backend.cancel(pid)
                self.log_event("pilot_cancelled", pilot=pid)
            except BackendError as exc:
                log.warning("%s: cancel %s: %s (retried when its agent is gone again)", self.backend.name, pid, exc)

    def node_states(self) -> dict[str, str]:
        """Each node of the machine: held (agent up) / holding (pilot, no agent yet) / idle / busy."""
        d = self.discovery
        alive = self.hub.alive()
        pilot_nodes = {n for v in self.backend.pilots().values() for n in v.nodes}
        held = self.held()
        out = {}
        for node in self.machine_nodes():
            if node in held:
                out[node] = "held" if node in alive else "holding"
            elif node in pilot_nodes:
                out[node] = "holding"
            elif d is not None and node in d.idle:
                out[node] = "idle"
            else:
                out[node] = "busy"
        return out

    def close(self) -> None:
        self.backend.close()


def view_extras(view_type: type, recall_times: dict[str, float]) -> dict[str, Any]:
    """Optional :class:`policy.View` fields this daemon can fill: known recall times per node, under
    the first of the names a View may give them (none: the policy does not use them)."""
    names = {f.name for f in fields(view_type)}
    for name in ("recall_at", "recall_times", "node_recall_at"):
        if name in names:
            return {name: dict(recall_times)}
    return {}
