"""The pilot book: every pilot of a batch backend, moved along :data:`scavenger.base.TRANSITIONS` by
what the scheduler says (:class:`Observation`), and the events that makes; :func:`classify_end` says
why a pilot ended, :class:`SubmitLimiter` paces submissions. Pure bookkeeping, no command."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

from scavenger.base import (
    EndReason,
    PilotEnded,
    PilotEnding,
    PilotEvent,
    PilotId,
    PilotQueued,
    PilotRequest,
    PilotStarted,
    PilotState,
    PilotView,
    SavedPilot,
    Throttled,
    can_move,
)

__all__ = ("Observation", "PilotBook", "PilotRecord", "SubmitLimiter", "classify_end")

log = logging.getLogger("scavenger.pilots")  # the batch backend's log, as before the split


# ---- what a scheduler query says about one pilot ---------------------------------------


@dataclass(frozen=True)
class Observation:
    """One pilot as one scheduler reply shows it. ``reason``: None when the state alone cannot tell
    why it ended (Slurm COMPLETED); ``preempted``: None when a detail lookup must tell."""

    pilot: PilotId
    state: PilotState
    raw_state: str
    nodes: tuple[str, ...] = ()
    start: float | None = None
    expires_at: float | None = None
    deadline: float | None = None
    reason: EndReason | None = None
    preempted: bool | None = None
    detail: str = ""

    @property
    def needs_detail(self) -> bool:
        """Ended, and only a per-job lookup can tell a preemption from a normal exit."""
        return self.state is PilotState.ENDED and self.preempted is None and self.reason in (
            None,
            EndReason.CANCELLED,
            EndReason.EXITED,
        )


def classify_end(obs: Observation, cancelled_by_us: bool, preempted_before: bool) -> tuple[EndReason, str]:
    """Why a pilot ended (the one rule for all backends): a recorded preemption wins, then the
    scheduler's walltime verdict, then our own cancel, then a preemption inferred from the reply
    alone (PBS: a SIGTERM exit we did not cause), then failure."""
    detail = obs.detail or obs.raw_state
    if preempted_before or obs.preempted:
        return EndReason.PREEMPTED, detail
    if obs.reason is EndReason.TIMEOUT:
        return EndReason.TIMEOUT, detail
    if cancelled_by_us:
        return EndReason.CANCELLED, f"{detail} (cancelled by us)"
    if obs.reason is EndReason.PREEMPTED:
        return EndReason.PREEMPTED, detail
    if obs.reason is EndReason.FAILED:
        return EndReason.FAILED, detail
    if obs.reason is EndReason.CANCELLED:
        return EndReason.CANCELLED, f"{detail} (not by us)"
    if obs.reason is EndReason.UNKNOWN:
        return EndReason.UNKNOWN, detail
    return EndReason.EXITED, detail


# ---- the book of pilots -------------------------------------------------------------------


@dataclass
class PilotRecord:
    """One pilot as the backend tracks it (mutable; :class:`PilotView` is the outside look)."""

    id: PilotId
    request: PilotRequest
    submitted_at: float
    state: PilotState = PilotState.QUEUED
    raw_state: str = ""
    nodes: tuple[str, ...] = ()
    started_at: float | None = None
    expires_at: float | None = None
    queued_since: float = 0.0
    replaces: PilotId | None = None
    replaced_by: PilotId | None = None
    cancel_requested: bool = False
    cancel_cause: EndReason | None = None
    preempted: bool = False
    announced: EndReason | None = None  # the reason of the last PilotEnding sent

    def view(self) -> PilotView:
        return PilotView(self.id, self.state, self.nodes, self.expires_at, self.replaces, self.cancel_requested,
                         self.request.waits_for_node)


class PilotBook:
    """Every live pilot of one backend: :meth:`apply` turns observations into events, :meth:`finish`
    ends a pilot once; ended pilots leave, so its size is the number of pilots in flight."""

    def __init__(self) -> None:
        self._live: dict[PilotId, PilotRecord] = {}
        self._events: list[PilotEvent] = []
        self._ended: dict[PilotId, EndReason] = {}
        self._on_node: dict[str, set[PilotId]] = {}  # node -> live pilots that asked for it or run there
        self._touched: dict[PilotId, None] = {}  # pilots whose view may have changed (or that came or went), in order

    # -- queries
    def __contains__(self, pid: object) -> bool:
        return pid in self._live

    def get(self, pid: PilotId) -> PilotRecord | None:
        return self._live.get(pid)

    def live(self) -> list[PilotRecord]:
        return list(self._live.values())

    def nodes_in_use(self) -> set[str]:
        """Nodes a live pilot asked for or runs on."""
        return {n for r in self._live.values() for n in (r.nodes or r.request.nodes)}

    def holder_of(self, nodes: Sequence[str]) -> PilotRecord | None:
        """A live pilot (not a queued replacement) on any of ``nodes`` (the first submitted)."""
        want = set(nodes)
        found = {pid for n in want for pid in self._on_node.get(n, ())}
        candidates = [self._live[pid] for pid in found] if len(found) < 2 else [
            r for pid, r in self._live.items() if pid in found]  # several: in submission order, as a scan finds them
        for r in candidates:
            if r.replaces is None and want & set(r.nodes or r.request.nodes):
                return r
        return None

    def on_node(self, node: str) -> set[PilotId]:
        """The live pilots that asked for ``node`` or run there (the index: no look at every pilot)."""
        return set(self._on_node.get(node, ()))

    def set_nodes(self, rec: PilotRecord, nodes: tuple[str, ...]) -> None:
        """``rec`` runs on ``nodes`` (as the scheduler says)."""
        if nodes != rec.nodes:
            self._touched[rec.id] = None
        rec.nodes = nodes
        self._index(rec)

    def _index(self, rec: PilotRecord) -> None:
        for n in (*rec.nodes, *rec.request.nodes):
            self._on_node.setdefault(n, set()).add(rec.id)

    def _unindex(self, rec: PilotRecord) -> None:
        for n in (*rec.nodes, *rec.request.nodes):
            ids = self._on_node.get(n)
            if ids is not None:
                ids.discard(rec.id)
                if not ids:
                    del self._on_node[n]

    def touch(self, pid: PilotId) -> None:
        """``pid``'s view may have changed (a field a :class:`PilotView` shows was set outside the book)."""
        self._touched[pid] = None

    def take_touched(self) -> list[PilotId]:
        """The pilots touched since the last call (added, changed, ended), in the order first touched:
        what the views of every pilot must look at again, not every pilot."""
        out, self._touched = list(self._touched), {}
        return out

    def drain(self) -> list[PilotEvent]:
        out, self._events = self._events, []
        return out

    # -- changes
    def add(self, pid: PilotId, request: PilotRequest, now: float) -> PilotRecord:
        rec = PilotRecord(pid, request, now, nodes=request.nodes, queued_since=now, replaces=request.after)
        if request.after is not None and request.after in self._live:
            self._live[request.after].replaced_by = pid
        self._live[pid] = rec
        self._index(rec)
        self._touched[pid] = None
        self._events.append(PilotQueued(pid, request.nodes, request.after))
        return rec

    def resume(self, saved: SavedPilot, now: float) -> PilotRecord:
        """Track a pilot an earlier daemon submitted (a restart): state UNKNOWN, no event, until
        the next poll tells what it is (QUEUED silently, RUNNING as started, gone as ended)."""
        rec = self._live.get(saved.id)
        if rec is not None:
            return rec
        request = PilotRequest(saved.nodes, after=saved.replaces, waits_for_node=saved.waits_for_node)
        rec = PilotRecord(saved.id, request, now, state=PilotState.UNKNOWN, nodes=saved.nodes, queued_since=now,
                          replaces=saved.replaces)
        self._live[saved.id] = rec
        self._index(rec)
        self._touched[saved.id] = None
        for other in self._live.values():  # link replacements whichever came back first
            if other.replaces == rec.id:
                rec.replaced_by = other.id
            if rec.replaces == other.id:
                other.replaced_by = rec.id
        return rec

    def apply(self, obs: Observation, now: float) -> None:
        """Move the pilot to what ``obs`` says (ENDED is left to :meth:`finish`)."""
        rec = self._live.get(obs.pilot)
        if rec is None or obs.state is PilotState.ENDED:
            return
        state, expires = rec.state, rec.expires_at
        self._apply(rec, obs, now)
        if rec.state is not state or rec.expires_at != expires:
            self._touched[rec.id] = None  # (most of a poll's observations change nothing)

    def _apply(self, rec: PilotRecord, obs: Observation, now: float) -> None:
        rec.raw_state = obs.raw_state
        if obs.nodes:
            self.set_nodes(rec, obs.nodes)
        if obs.expires_at is not None:
            rec.expires_at = obs.expires_at
        new = obs.state
        if rec.state is PilotState.ENDING and new is PilotState.RUNNING:
            return  # walltime notice given: the scheduler still says RUNNING until the end
        if not can_move(rec.state, new):
            log.warning("pilot %s: scheduler says %s (%s) after %s; ignored", rec.id, new.value, obs.raw_state,
                        rec.state.value)
            return
        old, rec.state = rec.state, new
        if new is PilotState.QUEUED and old in (PilotState.RUNNING, PilotState.SUSPENDED):
            rec.started_at, rec.queued_since = None, now
            self._events.append(PilotQueued(rec.id, rec.nodes, requeued=True))
        elif new is PilotState.RUNNING and rec.started_at is None:
            rec.started_at = obs.start if obs.start is not None else now
            self._events.append(PilotStarted(rec.id, rec.nodes, rec.expires_at))
        elif new is PilotState.ENDING:
            if obs.preempted:
                rec.preempted = True
            elif rec.announced is not None:
                return  # already announced (walltime notice): completing is the same ending
            reason = EndReason.PREEMPTED if rec.preempted else (
                EndReason.CANCELLED if rec.cancel_requested else EndReason.EXITED
            )
            self._announce(rec, obs.deadline, reason)
        elif new is PilotState.SUSPENDED:
            rec.preempted = True
            self._announce(rec, now, EndReason.PREEMPTED)

    def notice_walltime(self, now: float, lead_s: float) -> list[PilotRecord]:
        """RUNNING pilots within ``lead_s`` of their walltime: ENDING, announced (TIMEOUT)."""
        due: list[PilotRecord] = []
        if lead_s <= 0:
            return due
        for rec in self._live.values():
            if rec.state is PilotState.RUNNING and rec.expires_at is not None and now >= rec.expires_at - lead_s:
                rec.state = PilotState.ENDING
                self._touched[rec.id] = None
                self._announce(rec, rec.expires_at, EndReason.TIMEOUT)
                due.append(rec)
        return due

    def finish(self, pid: PilotId, reason: EndReason, detail: str, now: float) -> PilotRecord | None:
        """End ``pid`` (once): PilotEnded, out of the book; its queued replacement waits from now."""
        rec = self._live.pop(pid, None)
        if rec is None:
            return None
        self._unindex(rec)
        self._touched[pid] = None
        rec.state = PilotState.ENDED
        self._ended[pid] = reason
        if len(self._ended) > 10_000:
            self._ended.pop(next(iter(self._ended)))
        self._events.append(PilotEnded(pid, rec.nodes, reason, detail))
        succ = self._live.get(rec.replaced_by) if rec.replaced_by else None
        if succ is not None:
            succ.queued_since = now
        return rec

    def _announce(self, rec: PilotRecord, deadline: float | None, reason: EndReason) -> None:
        if rec.announced is reason:
            return
        rec.announced = reason
        self._events.append(PilotEnding(rec.id, rec.nodes, deadline, reason))


# ---- submissions: token bucket + exponential backoff ---------------------------------------


@dataclass
class SubmitLimiter:
    """At most ``rate`` submissions a second (bursts of ``burst``); after a failed
    submission wait ``backoff_s`` doubling up to ``backoff_max_s`` (reset by a success)."""

    rate: float = 2.0
    burst: int = 5
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    _tokens: float = field(default=-1.0, repr=False)
    _last: float | None = field(default=None, repr=False)
    _blocked_until: float = field(default=0.0, repr=False)
    _failures: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if not self.rate > 0 or self.burst < 1:
            raise ValueError(f"submit limiter: rate must be > 0 and burst >= 1, got {self.rate}, {self.burst}")
        self._tokens = float(self.burst)

    def _refill(self, now: float) -> None:
        if self._last is not None:
            self._tokens = min(float(self.burst), self._tokens + max(0.0, now - self._last) * self.rate)
        self._last = now

    def retry_at(self, now: float) -> float | None:
        """None if a submission may go now, else when it may."""
        self._refill(now)
        if now < self._blocked_until:
            return self._blocked_until
        if self._tokens < 1.0:
            return now + (1.0 - self._tokens) / self.rate
        return None

    def take(self, now: float) -> None:
        """Spend a token, or raise :class:`Throttled`."""
        when = self.retry_at(now)
        if when is not None:
            raise Throttled(f"submission throttled until {when:.3f}", when)
        self._tokens -= 1.0

    def failed(self, now: float) -> None:
        self._failures += 1
        delay = min(self.backoff_max_s, self.backoff_s * 2 ** (self._failures - 1))
        self._blocked_until = now + delay

    def succeeded(self) -> None:
        self._failures = 0
        self._blocked_until = 0.0

