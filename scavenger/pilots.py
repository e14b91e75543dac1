"""What every batch-scheduler backend shares: a pure :class:`Dialect` (render argv, parse replies)
run by one :class:`BatchBackend`, one command per step, every pilot in one :class:`PilotBook`, so
Slurm and PBS share every rule (end classification, walltime replacement, suspended and stuck
pilots, the cap on pilots in flight)."""

from __future__ import annotations

import functools
import logging
import sys
import time
from types import MappingProxyType
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, TypeVar

from scavenger.base import (
    BackendError,
    Claim,
    CommandFailed,
    CommandResult,
    Discovery,
    EndReason,
    NodeInfo,
    NodeState,
    PilotEvent,
    PilotId,
    PilotRequest,
    PilotState,
    PilotView,
    Runner,
    SavedPilot,
    SchedulerBackend,
    Throttled,
    run_command,
)

from scavenger.pilotbook import Observation, PilotBook, PilotRecord, SubmitLimiter, classify_end

__all__ = ("BatchBackend", "BatchConfig", "Dialect", "Observation", "PilotBook", "PilotRecord", "SubmitLimiter",
           "classify_end", "require_ok")

log = logging.getLogger(__name__)
_T = TypeVar("_T")


# ---- a scheduler dialect and the backend that runs it ----------------------------------------


class Dialect(Protocol):
    """One scheduler's commands, all pure: parsers get the whole :class:`CommandResult` and raise
    :class:`~scavenger.base.CommandFailed` or :class:`~scavenger.base.BadReply`."""

    name: str

    def render_nodes(self) -> list[str]: ...
    def parse_nodes(self, res: CommandResult) -> tuple[NodeInfo, ...]: ...
    def render_claims(self) -> list[str] | None: ...
    def parse_claims(self, res: CommandResult) -> tuple[Claim, ...]: ...
    def render_submit(self, request: PilotRequest, walltime_s: float) -> list[str]: ...
    def parse_submit(self, res: CommandResult) -> PilotId: ...
    def render_cancel(self, pilots: Sequence[PilotId]) -> list[str]: ...
    def check_cancel(self, res: CommandResult) -> None: ...
    def render_poll(self, pilots: Sequence[PilotId]) -> list[str]: ...
    def parse_poll(self, res: CommandResult, pilots: Sequence[PilotId]) -> list[Observation]: ...
    def render_detail(self, pilot: PilotId) -> list[str]: ...
    def parse_detail(self, res: CommandResult, pilot: PilotId) -> Observation | None: ...


@dataclass(frozen=True)
class BatchConfig:
    """What every batch backend shares (times in seconds). ``max_pilots``: pilots in flight (a
    centre's cap on jobs per user). ``renew_before_s``: announce the walltime this long before it
    and queue a replacement on the same nodes (0: neither). ``max_queued_s``: cancel a pilot still
    queued this long (a replacement counts from its predecessor's end). ``daemon_address``: what
    the agents connect to (tcp://HOST:PORT); ``python``: the interpreter on the compute nodes."""

    walltime_s: float = 3600.0
    nodes_per_pilot: int = 1
    max_pilots: int = 20
    renew_before_s: float = 120.0
    max_queued_s: float = 60.0
    submit_rate: float = 2.0
    submit_burst: int = 5
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    command_timeout_s: float = 15.0
    env: Mapping[str, str] = field(default_factory=dict)
    daemon_address: str = ""
    account: str | None = None
    python: str = sys.executable
    agent_args: tuple[str, ...] = ()
    output: str = "/dev/null"

    def check(self) -> None:
        if not self.daemon_address:
            raise ValueError("pilot config: daemon_address is required (the agents connect to it)")
        for name in ("walltime_s", "submit_rate", "command_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"pilot config: {name} must be > 0, got {getattr(self, name)!r}")
        for name in ("nodes_per_pilot", "max_pilots"):
            if getattr(self, name) < 1:
                raise ValueError(f"pilot config: {name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("renew_before_s", "max_queued_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"pilot config: {name} must be >= 0, got {getattr(self, name)!r}")


def require_ok(res: CommandResult, what: str, benign: Sequence[str] = ()) -> None:
    """Raise :class:`CommandFailed` naming ``what`` when ``res`` exited nonzero, unless each line it printed
    on stderr has one of the ``benign`` phrases (a job already gone: cancelling or querying it again)."""
    if res.returncode == 0:
        return
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    if benign and lines and all(any(b in ln for b in benign) for ln in lines):
        return
    raise CommandFailed(f"{what}: {' '.join(res.argv)} exited {res.returncode}: {res.stderr.strip()[:200]}", res)


def _changes_pilots(method: Callable[..., _T]) -> Callable[..., _T]:
    """A :class:`BatchBackend` method that may change its pilots: their views are built again
    at the next :meth:`BatchBackend.pilots` (after the method, whatever it raised)."""

    @functools.wraps(method)
    def wrapper(self: "BatchBackend", *args: Any, **kwargs: Any) -> _T:
        try:
            return method(self, *args, **kwargs)
        finally:
            self._views = None

    return wrapper


class BatchBackend(SchedulerBackend):
    """A :class:`~scavenger.base.SchedulerBackend` over one :class:`Dialect` (``clock``: the wall
    clock, as scheduler times are wall times; ``runner``: :func:`run_command` or a fake)."""

    queues_for_busy_nodes = True  # a pilot may wait in the queue for a node a main-queue job holds

    def __init__(self, dialect: Dialect, config: BatchConfig, clock: Callable[[], float] = time.time,
                 runner: Runner = run_command) -> None:
        config.check()
        self.dialect = dialect
        self.name = dialect.name
        self.config = config
        self.clock = clock
        self.runner = runner
        self.book = PilotBook()
        self.limiter = SubmitLimiter(config.submit_rate, config.submit_burst, config.backoff_s, config.backoff_max_s)
        self.commands = 0  # scheduler commands run (for tests and benchmarks)
        self._views: Mapping[PilotId, PilotView] | None = None  # pilots(), built once per change
        self._last_views: Mapping[PilotId, PilotView] = MappingProxyType({})  # the last views built (each one's
        #                              pilots touched since are built again at the next pilots(): book.take_touched)
        self._version = 0  # counts the changes of the views
        self._held: dict[str, PilotId] = {}  # held_nodes(), built with it
        self._busy: frozenset[str] = frozenset()  # nodes a main-queue job held at the last discover

    # -- commands
    def _run(self, argv: Sequence[str]) -> CommandResult:
        self.commands += 1
        return self.runner(list(argv), timeout=self.config.command_timeout_s, check=False, env=self.config.env)

    # -- protocol
    def discover(self) -> Discovery:
        nodes = self.dialect.parse_nodes(self._run(self.dialect.render_nodes()))
        claims: tuple[Claim, ...] = ()
        argv = self.dialect.render_claims()
        if argv is not None:
            claims = self.dialect.parse_claims(self._run(argv))
        busy = self.book.nodes_in_use()
        idle = frozenset(n.name for n in nodes if n.holdable and n.name not in busy)
        now = self.clock()
        self._restart_waits(nodes, now)
        return Discovery(nodes, claims, idle, now)

    def _restart_waits(self, nodes: Sequence[NodeInfo], now: float) -> None:
        """A pilot queued for nodes a main-queue job still holds is not stuck: its time in the queue
        (``max_queued_s``) counts from when they were last seen free."""
        self._busy = frozenset(n.name for n in nodes if n.state is NodeState.BUSY)
        for rec in self.book.live():
            if self._waits_on_busy(rec):
                rec.queued_since = now

    def _waits_on_busy(self, rec: PilotRecord) -> bool:
        """``rec`` is queued for nodes a main-queue job held at the last discover (and asked to wait)."""
        return rec.request.waits_for_node and rec.state is PilotState.QUEUED and not self._busy.isdisjoint(
            rec.request.nodes)

    @_changes_pilots
    def submit(self, request: PilotRequest) -> PilotId:
        if request.nodes and len(request.nodes) != self.config.nodes_per_pilot:
            raise ValueError(
                f"{self.name}: a pilot holds {self.config.nodes_per_pilot} node(s), asked for {request.nodes}"
            )
        if request.after is None and request.nodes:
            holder = self.book.holder_of(request.nodes)
            if holder is not None:
                return holder.id  # idempotent: that node is already held (or asked for)
        if len(self.book.live()) >= self.config.max_pilots:
            raise Throttled(f"{self.name}: {self.config.max_pilots} pilots in flight (the cap)", None)
        now = self.clock()
        self.limiter.take(now)
        walltime = request.walltime_s if request.walltime_s is not None else self.config.walltime_s
        try:
            pid = self.dialect.parse_submit(self._run(self.dialect.render_submit(request, walltime)))
        except BackendError:
            self.limiter.failed(now)
            raise
        self.limiter.succeeded()
        self.book.add(pid, request, now)
        return pid

    @_changes_pilots
    def cancel(self, pilot: PilotId) -> None:
        self._cancel([pilot], None)

    @_changes_pilots
    def cancel_all(self, pilots: Sequence[PilotId]) -> None:
        """Cancel ``pilots`` with one command (a burst of recalls at Summit size is hundreds of
        pilots in one loop iteration: one ``scancel`` each took the iteration over a second)."""
        self._cancel(list(pilots), None)

    @property
    def version(self) -> int:
        """Moves only when a view of :meth:`pilots` changed (not at a poll that changed nothing)."""
        self.pilots()
        return self._version

    def pilots(self) -> Mapping[PilotId, PilotView]:
        """Every live pilot's view (read-only; a change makes a new mapping), rebuilt after a call that
        may change them from the pilots the book touched only (a Summit recall burst touches hundreds
        of 4,608)."""
        if self._views is None:
            self._apply_touched(self.book.take_touched())
            self._views = self._last_views
        return self._views

    def _apply_touched(self, touched: Sequence[PilotId]) -> None:
        last = self._last_views
        changes = []
        for pid in touched:
            rec = self.book.get(pid)
            new = rec.view() if rec is not None else None
            if new != last.get(pid):
                changes.append((pid, new))
        if not changes:
            return
        views = dict(last)
        moved: list[PilotView] = []
        for pid, new in changes:
            old = views.pop(pid, None) if new is None else views.get(pid)
            if new is not None:
                views[pid] = new  # (a new pilot goes last, as it does in the book)
            moved.extend(v for v in (old, new) if v is not None and v.state is PilotState.RUNNING)
        if moved:
            self._held = self._held_after(views, {n for v in moved for n in v.nodes})
        self._last_views = MappingProxyType(views)
        self._version += 1

    def _held_after(self, views: Mapping[PilotId, PilotView], nodes: set[str]) -> dict[str, PilotId]:
        """:meth:`held_nodes` once ``nodes`` changed hands: node -> the RUNNING pilot there (of two, the
        one the book had last, as a look at every view in order finds it)."""
        held = dict(self._held)
        order: dict[PilotId, int] | None = None
        for n in nodes:
            running = [pid for pid in self.book.on_node(n)
                       if pid in views and views[pid].state is PilotState.RUNNING and n in views[pid].nodes]
            if len(running) > 1:
                order = order if order is not None else {pid: i for i, pid in enumerate(views)}
                running = [max(running, key=order.__getitem__)]
            if running:
                held[n] = running[0]
            else:
                held.pop(n, None)
        return held

    def pilots_on(self, node: str) -> list[PilotView]:
        """The views of the live pilots on ``node`` (asked for it or running there), without a look
        at every pilot: every agent's hello asks (4,608 of them in a Summit warm-up)."""
        views = self.pilots()
        return [views[pid] for pid in sorted(self.book.on_node(node)) if pid in views and node in views[pid].nodes]

    def held_nodes(self) -> Mapping[str, PilotId]:
        """Node -> the RUNNING pilot on it (read-only; built with :meth:`pilots`)."""
        self.pilots()
        return MappingProxyType(self._held)

    def adopt(self, node: str, batch_job: str, pid: int = 0) -> PilotId | None:
        """A pilot an earlier daemon submitted says hello from ``node``: track it again, RUNNING there
        (the next poll corrects it); None without a batch job id. Idempotent."""
        if not batch_job:
            return None
        pilot = PilotId(batch_job)
        if pilot in self.book:
            return pilot  # nothing changes (every hello of our own agents asks)
        now = self.clock()
        self._views = None
        self.book.add(pilot, PilotRequest((node,)), now)
        self.book.apply(Observation(pilot, PilotState.RUNNING, "RUNNING", (node,)), now)
        return pilot

    @_changes_pilots
    def resume(self, saved: Sequence[SavedPilot]) -> list[PilotId]:
        """Track again the pilots an earlier daemon left: they count towards ``max_pilots`` and hold
        their nodes at once; the next :meth:`poll` tells what each is. Idempotent."""
        now = self.clock()
        out = []
        for pilot in saved:
            self.book.resume(pilot, now)
            out.append(pilot.id)
        if out:
            log.info("%s: took back %d pilot(s) of an earlier daemon: %s", self.name, len(out), ", ".join(out))
        return out

    @_changes_pilots
    def poll(self) -> list[PilotEvent]:
        """One queue query for every live pilot, one lookup per pilot that ended; then the
        shared rules (walltime notice and renewal, suspended pilots, stuck queued pilots)."""
        now = self.clock()
        live = [r.id for r in self.book.live()]
        if live:
            observations = self.dialect.parse_poll(self._run(self.dialect.render_poll(live)), live)
            seen = {o.pilot for o in observations}
            for obs in observations:
                self.book.apply(obs, now)
            ended = [o for o in observations if o.state is PilotState.ENDED]
            missing = [p for p in live if p not in seen]
            for obs in ended:
                self._end(self._detail(obs) if obs.needs_detail else obs, now)
            for pid in missing:
                found = self._lookup(pid)
                if found is not None and found.state is not PilotState.ENDED:
                    self.book.apply(found, now)
                else:
                    self._end(found or Observation(pid, PilotState.ENDED, "", reason=EndReason.UNKNOWN,
                                                 detail="the scheduler no longer knows this job"), now)
        self._after_poll(now)
        return self.book.drain()

    @_changes_pilots
    def close(self) -> None:
        live = [r.id for r in self.book.live()]
        if live:
            try:
                self._cancel(live, None)
            except BackendError as exc:
                log.warning("%s: cancelling pilots at close: %s", self.name, exc)

    # -- helpers
    def _detail(self, obs: Observation) -> Observation:
        found = self._lookup(obs.pilot)
        if found is None:
            return Observation(obs.pilot, PilotState.ENDED, obs.raw_state, obs.nodes, reason=obs.reason,
                               preempted=False, detail=obs.detail or obs.raw_state)
        return found

    def _lookup(self, pid: PilotId) -> Observation | None:
        return self.dialect.parse_detail(self._run(self.dialect.render_detail(pid)), pid)

    def _end(self, obs: Observation, now: float) -> None:
        rec = self.book.get(obs.pilot)
        if rec is None:
            return
        if obs.nodes and not rec.nodes:
            self.book.set_nodes(rec, obs.nodes)
        preempted_before = rec.preempted or rec.cancel_cause is EndReason.PREEMPTED
        reason, detail = classify_end(obs, rec.cancel_requested, preempted_before)
        if rec.cancel_cause is EndReason.TIMEOUT and reason in (EndReason.CANCELLED, EndReason.EXITED):
            reason, detail = EndReason.TIMEOUT, f"{obs.detail or obs.raw_state} (ended by us at its walltime)"
        self.book.finish(rec.id, reason, detail, now)
        succ = self.book.get(rec.replaced_by) if rec.replaced_by else None
        if succ is not None and reason is not EndReason.TIMEOUT and not succ.cancel_requested:
            self._try_cancel([succ.id], EndReason.CANCELLED)  # only a walltime hands the node over

    def _after_poll(self, now: float) -> None:
        cfg = self.config
        for rec in self.book.notice_walltime(now, cfg.renew_before_s):
            log.info("%s: pilot %s reaches its walltime at %s", self.name, rec.id, rec.expires_at)
        for rec in self.book.live():
            if rec.state is PilotState.SUSPENDED and not rec.cancel_requested:
                self._try_cancel([rec.id], EndReason.PREEMPTED)
        due = [
            r.id for r in self.book.live()
            if r.state is PilotState.ENDING and r.announced is EndReason.TIMEOUT and r.replaced_by is not None
            and r.expires_at is not None and now >= r.expires_at and not r.cancel_requested
        ]
        if due:  # the scheduler enforces limits in a periodic pass (Slurm: 30 s): end them on time, so the
            self._try_cancel(due, EndReason.TIMEOUT)  # replacement takes the node at once
        for rec in self.book.live():
            if (
                rec.state is PilotState.ENDING and rec.announced is EndReason.TIMEOUT and rec.replaced_by is None
                and not rec.cancel_requested and not rec.preempted and rec.nodes
            ):
                self._renew(rec)
        stuck = [
            r.id for r in self.book.live()
            if r.state is PilotState.QUEUED and not r.cancel_requested
            and (r.replaces is None or r.replaces not in self.book)
            and now - r.queued_since > cfg.max_queued_s and not self._waits_on_busy(r)
        ]
        if stuck:
            self._try_cancel(stuck, EndReason.CANCELLED)

    def _renew(self, rec: PilotRecord) -> None:
        try:
            self.submit(PilotRequest(rec.nodes, rec.request.walltime_s, after=rec.id))
        except Throttled:
            pass  # next poll
        except BackendError as exc:
            log.warning("%s: replacement for pilot %s: %s", self.name, rec.id, exc)

    def _try_cancel(self, pilots: list[PilotId], cause: EndReason) -> None:
        try:
            self._cancel(pilots, cause)
        except BackendError as exc:
            log.warning("%s: cancel %s: %s (retried next poll)", self.name, pilots, exc)

    def _cancel(self, pilots: list[PilotId], cause: EndReason | None) -> None:
        """One cancel command for ``pilots`` (and their queued replacements); when it fails, the
        pilots are as they were (not cancelling) and the error is raised."""
        ids: list[PilotId] = []
        before: dict[PilotId, bool] = {}
        for pid in pilots:
            rec = self.book.get(pid)
            if rec is None:
                continue
            ids.append(pid)
            before.setdefault(pid, rec.cancel_requested)
            rec.cancel_requested = True
            self.book.touch(pid)
            if cause in (EndReason.PREEMPTED, EndReason.TIMEOUT):
                rec.cancel_cause = cause
            if cause is EndReason.TIMEOUT:
                continue  # ended at its walltime: its replacement takes over
            succ = self.book.get(rec.replaced_by) if rec.replaced_by else None
            if succ is not None and succ.id not in ids:
                before.setdefault(succ.id, succ.cancel_requested)
                succ.cancel_requested = True
                self.book.touch(succ.id)
                ids.append(succ.id)
        if not ids:
            return
        try:
            self.dialect.check_cancel(self._run(self.dialect.render_cancel(ids)))
        except BackendError:
            for pid, was in before.items():
                rec = self.book.get(pid)
                if rec is not None:
                    rec.cancel_requested = was
                    self.book.touch(pid)
            raise
