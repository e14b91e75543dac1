"""The daemon's side of its scavenger backend: observe pilots, hold idle nodes, give nodes back.

:meth:`Scavenging.look` polls the backend (at most every ``poll_interval``); a scheduler command
that fails or hangs marks the look **stale**, and nothing is submitted or decided on it. The usable
nodes are those of RUNNING (not ENDING) pilots whose own agent is connected. :meth:`Scavenging.hold_idle`
submits pilots for idle nodes some trainer can use (never one the scheduler planned for a pending job),
queues one for the nodes of a preempted pilot (:meth:`Scavenging.queue_for_recalled`), and cancels a
RUNNING pilot whose agent never said hello within ``agent_grace``. Our live pilots are kept in the
store's meta (:data:`PILOTS_KEY`), so a restarted daemon polls them before it submits anything new."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, Mapping

from malletrain.daemon.pilotsmeta import PILOTS_KEY, MetaStore, PilotTexts, parse_pilots, pilots_json
from scavenger.base import (
    AgentRoster, BackendError, Discovery, EndReason, NodeState, PilotEnded, PilotEnding, PilotEvent, PilotId,
    PilotQueued, PilotRequest, PilotStarted, PilotState, PilotView, SchedulerBackend, Throttled
)
from contract.nodeshape import job_slots, node_slots

log = logging.getLogger("malletrain.daemon.scavenging")

EventLog = Callable[..., None]
"""``log_event(kind, job=None, **detail)``: the store's event log."""

MAX_SHUN_STRIKES = 6
"""A node that keeps losing pilots for want of an agent waits at most ``agent_grace * 2**5``."""

MAX_SUBMITS_PER_HOLD = 32
"""Pilots one :meth:`Scavenging.hold_idle` submits at most: a whole machine turning idle (a daemon's
first look at 4,608 idle nodes) is held over many loop iterations, not in one that runs thousands
of ``sbatch`` while no agent is heard and nothing is decided (32 a step is 320 a second at the
default loop interval, above any centre's ``submit_rate``)."""

REQUEUE_AFTER_S = 5.0
"""Seconds from a preemption seen to the pilot queued for that node: the daemon's shrink off the node is done
by then (preemption -> training resumed: 0.2-1 s, at most 3.9 s in bench_slurm.py at load 12), and main-queue
jobs last far longer."""

MAX_WAITING_PILOTS = 64
"""Pilots queued for recalled nodes at most at once (:meth:`Scavenging.queue_for_recalled`): a machine-wide
recall must not fill the backend's ``max_pilots`` with pilots that wait while other nodes are idle."""

Versions = tuple[int | None, int | None]
"""The backend's and the hub's ``version``: see :meth:`Scavenging.versions`."""

AGENTLESS_LOOK_S = 1.0
"""The pilots whose agent is missing are looked for at most this often (a look is a pass over every
pilot; a recall changes the pilots, and at Summit size recalls come several a second): one found a
second late is cancelled a second late, after ``agent_grace`` (60 s by default)."""


class NodeStatus(StrEnum):
    """A node of the machine as this daemon sees it (``malletrain nodes`` shows the value); one owner,
    :meth:`Scavenging.node_states`, derives it from the pilots, the agents and the last look."""

    HELD = "held"  # our pilot runs there and its agent is connected
    HOLDING = "holding"  # our pilot is submitted or runs there; its agent has not said hello yet
    IDLE = "idle"  # idle in the last look, not ours
    BUSY = "busy"  # anything else (the main scheduler's)


@dataclass
class Scavenging:
    """One daemon's backend, its last look at the machine and the rules above.

    ``hub``: the agent roster; ``meta``: where live pilots are kept across restarts (None: nowhere);
    ``agent_grace``: seconds a RUNNING pilot may go without its agent (0: forever); ``requeue_recalled``,
    ``max_waiting``, ``requeue_after_s``: see :meth:`queue_for_recalled`; ``workers_per_node``: a
    node's slots where the scheduler reports no GPUs (None: 1)."""

    backend: SchedulerBackend
    hub: AgentRoster
    log_event: EventLog
    nodes_per_pilot: int = 1
    poll_interval: float = 0.0
    meta: MetaStore | None = None
    agent_grace: float = 0.0
    requeue_recalled: bool = True
    requeue_after_s: float = REQUEUE_AFTER_S
    max_waiting: int = MAX_WAITING_PILOTS
    workers_per_node: int | None = None
    discovery: Discovery | None = None
    stale: bool = False
    error: str = ""
    _next_look: float = field(default=0.0, repr=False)
    _hold_blocked_until: float = field(default=0.0, repr=False)
    _saved: str | None = field(default=None, repr=False)
    _remembered_version: int | None = field(default=None, repr=False)
    _pilot_texts: PilotTexts = field(default_factory=dict, repr=False)  # pilots_json's entries, kept between calls
    _agentless_since: dict[PilotId, float] = field(default_factory=dict, repr=False)
    _shunned: dict[str, tuple[float, int]] = field(default_factory=dict, repr=False)  # node -> (until, strikes)
    _last_nodes: frozenset[str] = field(default=frozenset(), repr=False)  # the last daemon's pilots' nodes
    _recalled: deque[tuple[float, tuple[str, ...]]] = field(default_factory=deque, repr=False)  # (seen, nodes)
    _usable: tuple[Versions, frozenset[str]] | None = field(default=None, repr=False)  # usable(), by versions
    _taken: tuple[Versions, frozenset[str]] | None = field(default=None, repr=False)  # every pilot's nodes
    _agentless: tuple[Versions, list[tuple[PilotId, PilotView, str]]] | None = field(default=None, repr=False)
    _waits: tuple[int | None, list[tuple[PilotId, PilotView]]] | None = field(default=None, repr=False)
    _agentless_next: float = field(default=0.0, repr=False)  # the agentless pilots are looked for again from then
    _agentless_put_off: float | None = field(default=None, repr=False)
    _gpus: tuple[Discovery, dict[str, int]] | None = field(default=None, repr=False)  # the last look's GPUs by node  # the first look put off since the last

    def versions(self) -> Versions:
        """The backend's and the hub's ``version`` (None if either has none): while both stay the same, the
        last answer of :meth:`usable` and friends stands (at 4,608 nodes each is a pass over every pilot)."""
        return self.backend.version, self.hub.version

    # ------------------------------------------------------------ remember
    def resume(self) -> list[PilotId]:
        """Give the pilots the last daemon kept in ``meta`` back to the backend (once, before the first look): they
        are polled, hold their nodes and count toward the cap before anything new is submitted."""
        if self.meta is None:
            return []
        text = self.meta.get_meta(PILOTS_KEY)
        self._saved = text
        if not text:
            return []
        try:
            saved = parse_pilots(text)
        except ValueError as exc:  # never fatal: those pilots end by their walltime at worst
            self.log_event("pilots_unreadable", error=str(exc))
            log.warning("%s (their pilots are not taken back)", exc)
            return []
        self._last_nodes = frozenset(n for pilot in saved for n in pilot.nodes)
        taken = list(self.backend.resume(saved)) if saved else []
        if taken:
            self.log_event("pilots_resumed", pilots=list(taken))
        return taken

    def last_daemons_nodes(self) -> frozenset[str]:
        """The nodes of the pilots the last daemon kept: after a restart, adoption is complete only once their
        agents are back."""
        return self._last_nodes

    def _remember(self) -> None:
        """Keep the ids of our live pilots in ``meta`` when they changed (not looked at while the backend's
        ``version`` says nothing could have; only the pilots that changed are written again)."""
        if self.meta is None:
            return
        version = self.backend.version
        if version is not None and version == self._remembered_version:
            return
        text = pilots_json(self.backend.pilots(), self._pilot_texts)
        if text != self._saved:
            self.meta.set_meta(PILOTS_KEY, text)
            self._saved = text
        self._remembered_version = version  # only once kept: a failed write is tried again

    # ------------------------------------------------------------ observe
    def look(self, now: float) -> list[PilotEvent]:
        """Poll then discover when due; the pilot events of this look ([] when not due or failed)."""
        if now < self._next_look:
            return []
        self._next_look = now + self.poll_interval
        events: list[PilotEvent] = []
        try:
            events = list(self.backend.poll())
            self._note_recalls(events, now)
            self._remember()
            self.discovery = self.backend.discover()
        except BackendError as exc:  # the daemon never dies of a scheduler hiccup; it waits for a good look
            self._failed(exc)
            return events  # what poll told before discover failed is fresh: keep it
        if self.stale:
            self.log_event("backend_ok", backend=self.backend.name, after=self.error)
            log.info("%s backend answers again", self.backend.name)
        self.stale, self.error = False, ""
        return events

    def _note_recalls(self, events: list[PilotEvent], now: float) -> None:
        """Remember the nodes of each pilot the main scheduler preempted; their pilots are queued
        :data:`REQUEUE_AFTER_S` later, not while jobs shrink off them (an ``sbatch`` blocks the loop for seconds)."""
        if not self.requeue_recalled or not self.backend.queues_for_busy_nodes:
            return
        for ev in events:
            if isinstance(ev, PilotEnded) and ev.reason is EndReason.PREEMPTED and ev.nodes \
                    and len(ev.nodes) == self.nodes_per_pilot:
                self._recalled.append((now, tuple(ev.nodes)))

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
        the backend takes its pilot over (a backend whose ``adopt`` answers None cannot)."""
        if node in self.held():
            return None  # (the common answer)
        views = self.backend.pilots_on(node)  # (a batch backend's index: no look at every pilot)
        if any(v.state is not PilotState.QUEUED for v in views):
            return None
        pilot = self.backend.adopt(node, batch_job, pid)
        if pilot is not None:
            self.log_event("pilot_adopted", pilot=pilot, node=node, pid=pid)
        return pilot

    # ------------------------------------------------------------ decide
    def held(self) -> Mapping[str, PilotId]:
        """Node -> the RUNNING pilot on it (the backend's ``held_nodes()``: a batch backend builds it
        once per change of its pilots, where a loop over them is once per call)."""
        return self.backend.held_nodes()

    def agent_batch_job(self, node: str) -> str:
        try:
            return str(self.hub.batch_job(node) or "")
        except (KeyError, ValueError):
            return ""

    def usable(self) -> set[str]:
        """Nodes of RUNNING pilots whose own agent is connected (computed again only when the backend's
        or the hub's version moved: see :meth:`versions`)."""
        key = self.versions()
        if self._usable is not None and self._usable[0] == key and None not in key:
            return set(self._usable[1])
        out = self._usable_now()
        self._usable = key, frozenset(out)
        return out

    def _usable_now(self) -> set[str]:
        """:meth:`usable`, computed (one dict lookup per node when the hub lists its agents' batch
        jobs at once, ``batch_jobs()``)."""
        batches = self.hub.batch_jobs()
        if batches is not None:
            return {node for node, pid in self.held().items()
                    if node in batches and (not batches[node] or batches[node] == pid)}
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

    def machine_size(self) -> int:
        """How many nodes the last look found (0: none yet); no tuple of their names built."""
        return len(self.discovery.nodes) if self.discovery is not None else 0

    def slots_of(self, node: str, asked: int | None = None) -> int:
        """``node``'s worker slots (the GPUs the last look reported, else ``workers_per_node``, else 1:
        :func:`contract.nodeshape.node_slots`), or fewer where a job ``asked`` for fewer."""
        d = self.discovery
        gpus = None
        if d is not None:
            if self._gpus is None or self._gpus[0] is not d:
                self._gpus = (d, {n.name: n.gpus for n in d.nodes if n.gpus})
            gpus = self._gpus[1].get(node)
        return job_slots(node_slots(gpus, self.workers_per_node), asked)

    def node_shape(self) -> tuple[int, str] | None:
        """The most worker slots a node of the last look has, and where that count comes from as a
        sentence for an error (None: no look yet)."""
        d = self.discovery
        if d is None or not d.nodes:
            return None
        most = max(self.slots_of(n.name) for n in d.nodes)
        if any(n.gpus for n in d.nodes):
            return most, f"{most} worker slots (GPUs) on its largest node"
        where = f"[scavenger] workers_per_node = {self.workers_per_node}" if self.workers_per_node \
            else "no GPUs reported and no [scavenger] workers_per_node: 1"
        backend = " on the local backend" if self.backend.name == "local" else ""
        return most, f"{most} worker slot{'s' * (most != 1)} a node ({where}{backend})"

    def machine_nodes(self) -> tuple[str, ...]:
        d = self.discovery
        return tuple(n.name for n in d.nodes) if d is not None else ()

    # ------------------------------------------------------------ act
    def hold_idle(self, now: float, wanted: Callable[[str], bool] | None = None) -> list[PilotId]:
        """A pilot for every idle node no pilot of ours asks for and ``wanted`` accepts (None: all), after
        cancelling those whose agent stayed away past ``agent_grace``. Nothing on stale data."""
        d = self.discovery
        if self.stale or d is None:
            return []
        self._cancel_agentless(now)
        self._cancel_unwanted_waits(wanted)
        if now < self._hold_blocked_until:
            self._remember()
            return []
        key = self.versions()
        if self._taken is None or self._taken[0] != key or None in key:
            self._taken = key, frozenset(n for v in self.backend.pilots().values() for n in v.nodes)
        taken = self._taken[1]
        shunned = self._shunned_now(now)
        settling = {n for seen, nodes in self._recalled if now < seen + self.requeue_after_s for n in nodes}
        free = sorted(n for n in d.idle - taken - shunned - settling if wanted is None or wanted(n))
        out = self._submit_for(free, now)  # idle nodes first: a node free now never waits behind a recalled one
        if now >= self._hold_blocked_until:
            out += self.queue_for_recalled(d, set(taken) | shunned, now, wanted)
        self._remember()
        return out

    def queue_for_recalled(self, d: Discovery, taken: set[str], now: float,
                           wanted: Callable[[str], bool] | None) -> list[PilotId]:
        """A pilot queued for each preempted pilot's nodes a main-queue job holds or is planned on, once
        ``requeue_after_s`` passed, so the scheduler starts it the moment that job ends (pilots are
        preemptable: the main queue is never delayed). Until then :meth:`hold_idle` gives such a node no
        pilot: one submitted on a look that showed it idle waited behind the main job and was cancelled
        as stuck after ``max_queued_s``."""
        out: list[PilotId] = []
        if not self._recalled or now < self._recalled[0][0] + self.requeue_after_s:
            return out  # (at every iteration: no look at every pilot and node for nothing)
        waiting = len(self._waiting_pilots())
        held = {n.name for n in d.nodes if n.state is NodeState.BUSY or (n.state is NodeState.IDLE and n.planned)}
        while self._recalled and now >= self._recalled[0][0] + self.requeue_after_s:
            nodes = self._recalled[0][1]
            if any(n in taken or n not in held or (wanted is not None and not wanted(n)) for n in nodes) \
                    or waiting >= self.max_waiting:
                self._recalled.popleft()  # left to the usual rule: a pilot once the node is idle
                continue
            pid = self._submit(PilotRequest(nodes, waits_for_node=True), now, "queueing a pilot for recalled")
            if pid is None:
                break
            self._recalled.popleft()
            waiting += 1
            taken.update(nodes)
            self.log_event("pilot_submitted", pilot=pid, nodes=list(nodes), waits_for_node=True)
            log.info("%s: pilot %s queued for %s, recalled: it starts when the main job there ends",
                     self.backend.name, pid, ",".join(nodes))
            out.append(pid)
        return out

    def _cancel_unwanted_waits(self, wanted: Callable[[str], bool] | None) -> None:
        """Cancel each pilot still queued for recalled nodes the daemon no longer wants."""
        if wanted is None:
            return
        for pid, view in self._waiting_pilots():
            if view.cancelling or all(wanted(n) for n in view.nodes):
                continue
            try:
                self.backend.cancel(pid)
            except BackendError as exc:
                log.warning("%s: cancel %s: %s (retried at the next hold)", self.backend.name, pid, exc)
                continue
            self.log_event("pilot_cancelled", pilot=pid, nodes=list(view.nodes), reason="node no longer wanted")

    def _waiting_pilots(self) -> list[tuple[PilotId, PilotView]]:
        """The pilots queued for recalled nodes (``waits_for_node``), by id: found again only when the
        backend's version moved (every hold asks; at 4,608 pilots a look at each is milliseconds)."""
        version = self.backend.version
        if self._waits is None or self._waits[0] != version or version is None:
            self._waits = version, sorted((pid, v) for pid, v in self.backend.pilots().items()
                                          if v.waits_for_node and v.state is PilotState.QUEUED)
        return self._waits[1]

    def _submit_for(self, free: list[str], now: float) -> list[PilotId]:
        """Pilots for ``free`` nodes, at most :data:`MAX_SUBMITS_PER_HOLD` (the rest at the next hold)."""
        out: list[PilotId] = []
        last = min(len(free) - self.nodes_per_pilot + 1, MAX_SUBMITS_PER_HOLD * self.nodes_per_pilot)
        for i in range(0, last, self.nodes_per_pilot):
            nodes = tuple(free[i: i + self.nodes_per_pilot])
            pid = self._submit(PilotRequest(nodes), now, "submitting a pilot on")
            if pid is None:
                break
            self.log_event("pilot_submitted", pilot=pid, nodes=list(nodes))
            out.append(pid)
        return out

    def _submit(self, request: PilotRequest, now: float, doing: str) -> PilotId | None:
        """``request`` submitted; None when the backend throttles (holds wait until it allows) or fails
        (logged): either way this hold submits no more."""
        try:
            return self.backend.submit(request)
        except Throttled as exc:
            self._hold_blocked_until = exc.retry_at if exc.retry_at is not None else now + self.poll_interval
        except BackendError as exc:
            self.log_event("pilot_submit_error", nodes=list(request.nodes), error=str(exc))
            log.warning("%s: %s %s: %s", self.backend.name, doing, request.nodes, exc)
        return None

    def _missing_agent(self, pid: PilotId, view: PilotView, alive: set[str]) -> str:
        """Why ``pid``'s own agent is not on one of its nodes ("": it is on all of them)."""
        for node in view.nodes:
            if node not in alive:
                return f"no agent said hello from node {node}"
            batch = self.agent_batch_job(node)
            if batch and batch != pid:
                return f"the agent on node {node} belongs to batch job {batch}"
        return ""

    def _cancel_agentless(self, now: float) -> None:
        """Cancel each RUNNING pilot whose own agent has been missing for ``agent_grace`` seconds."""
        if self.agent_grace <= 0:
            return
        key = self.versions()
        seen_at = now  # when a pilot found agentless now was first seen so
        if self._agentless is None or self._agentless[0] != key or None in key:
            if self._agentless is not None and now < self._agentless_next:  # looked a moment ago: put off
                self._agentless_put_off = now if self._agentless_put_off is None else self._agentless_put_off
            else:  # (a pilot found now could have been found at the first look put off: it counts from then)
                seen_at = now if self._agentless_put_off is None else self._agentless_put_off
                self._agentless, self._agentless_put_off = (key, self._agentless_pilots()), None
                self._agentless_next = now + min(AGENTLESS_LOOK_S, self.agent_grace / 10)
        assert self._agentless is not None
        watched: dict[PilotId, float] = {}
        alive = None
        for pid, view, why in self._agentless[1]:
            since = watched[pid] = self._agentless_since.get(pid, seen_at)
            if now - since < self.agent_grace:
                continue
            alive = self.hub.alive() if alive is None else alive  # the list may be a second old: asked again
            if self.backend.pilots().get(pid) != view or not self._missing_agent(pid, view, alive):
                del watched[pid]
                continue
            try:
                self.backend.cancel(pid)
            except BackendError as exc:
                log.warning("%s: cancel %s: %s (retried at the next hold)", self.backend.name, pid, exc)
                continue
            del watched[pid]
            for node in view.nodes:
                self._shun(node, now)
            text = f"{why} for {self.agent_grace:g} s"
            self.log_event("pilot_cancelled", pilot=pid, nodes=list(view.nodes), reason=text)
            log.warning("%s: cancelled pilot %s on %s: %s", self.backend.name, pid, ",".join(view.nodes), text)
        self._agentless_since = watched

    def _agentless_pilots(self) -> list[tuple[PilotId, PilotView, str]]:
        """Each RUNNING pilot (not being cancelled) whose own agent is missing, and why."""
        alive = self.hub.alive()
        batches = self.hub.batch_jobs()
        running = [(pid, view) for pid, view in self.backend.pilots().items()
                   if view.state is PilotState.RUNNING and not view.cancelling
                   and (batches is None or not all(batches.get(n, pid) in (pid, None, "") and n in batches
                                                   for n in view.nodes))]  # (the common case, in one pass)
        out = []
        for pid, view in sorted(running):
            why = self._missing_agent(pid, view, alive)
            if why:
                out.append((pid, view, why))
        return out

    def _shun(self, node: str, now: float) -> None:
        """No new pilot on ``node`` for a while: ``agent_grace``, doubling at each pilot lost there for
        want of an agent (:data:`MAX_SHUN_STRIKES`), until an agent works there again."""
        strikes = min(self._shunned.get(node, (0.0, 0))[1] + 1, MAX_SHUN_STRIKES)
        self._shunned[node] = (now + self.agent_grace * 2 ** (strikes - 1), strikes)

    def _shunned_now(self, now: float) -> set[str]:
        """Nodes no new pilot may take now: one whose agent works again is trusted again; the others are tried
        once their time is up, their strikes kept (the next failure waits longer)."""
        if not self._shunned:
            return set()
        for node in self.usable() & self._shunned.keys():
            del self._shunned[node]
        return {node for node, (until, _) in self._shunned.items() if now < until}

    def release(self, nodes: set[str]) -> None:
        """Cancel the RUNNING pilot of each of ``nodes`` whose agent is (still) gone."""
        if not nodes:  # (the daemon calls at every iteration: no copy of every agent and pilot then)
            self._remember()
            return
        alive = self.hub.alive()
        held = self.held()
        pilots = sorted({held[n] for n in nodes if n in held and n not in alive})
        if pilots:
            try:
                self.backend.cancel_all(pilots)  # one command for all on a batch backend (a burst of recalls)
                for pid in pilots:
                    self.log_event("pilot_cancelled", pilot=pid)
            except BackendError as exc:
                log.warning("%s: cancel %s: %s (retried when its agent is gone again)", self.backend.name,
                            ", ".join(pilots), exc)
        self._remember()

    def node_states(self) -> dict[str, NodeStatus]:
        """Each node of the machine: held (agent up) / holding (pilot, no agent yet) / idle / busy."""
        d = self.discovery
        alive = self.hub.alive()
        pilot_nodes = {n for v in self.backend.pilots().values() for n in v.nodes}
        held = self.held()
        out = {}
        for node in self.machine_nodes():
            if node in held:
                out[node] = NodeStatus.HELD if node in alive else NodeStatus.HOLDING
            elif node in pilot_nodes:
                out[node] = NodeStatus.HOLDING
            elif d is not None and node in d.idle:
                out[node] = NodeStatus.IDLE
            else:
                out[node] = NodeStatus.BUSY
        return out

    def close(self) -> None:
        self.backend.close()
        self._remember()  # cancelled pilots are not taken back by the next daemon

