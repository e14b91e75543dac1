"""Discrete-event replay of an idle-node timeline with elastic training jobs: the event loop.

Events (nodes become idle, nodes recalled, pilots up, jobs arrive, workers join, jobs complete, the policy's wake-ups)
sit on a heap ordered by ``(time, priority, seq)``. All events at one timestamp are applied together, each by its
handler (one table, by the event's type), then the policy decides once. The engine holds no rule of its own (see
docs/design.md): the rules are the daemon's :class:`policy.Policy`, the node and job bookkeeping its
:class:`policy.Ledger`, which the engine feeds with events and which builds the View.

The loop is composed of four parts, each passed what it needs: :class:`simulator.fleet.Fleet` (every job, the admitted
ones and the queue), :class:`simulator.physics.JobPhysics` (ground truth: progress, pauses, starts, stops),
:class:`simulator.tallying.Tallying` (the node-second integrals between events) and
:class:`simulator.driver.PolicyDriver` (asks the policy and carries its decisions out). Costs: one calibration
(:mod:`simulator.calibration`; starts and grows by :mod:`simulator.costs`'s warm rule); without
``SimConfig.calibration`` the ``free`` ablation (the CLI charges the shipped file).
"""

from __future__ import annotations

import gc
import math
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from policy import Decision, Ledger
from policy.queueview import QUEUE_VIEW_CAP
from simulator.calibration import free
from simulator.clock import EventQueue, Priority, SimClock
from simulator.driver import PolicyDriver
from simulator.fleet import Fleet, MonitorFactory
from simulator.physics import JobPhysics
from simulator.policies import SimPolicy
from simulator.records import (Arrival, Cancel, Completion, Decide, DecisionRow, End, Joined, PilotUp, PolicyError,
                               SimConfig, SimJob, SimJobState, SimResult, Wake)
from simulator.summary import DecisionStats, Tally, about_replay, replay_summary
from simulator.tallying import Tallying
from simulator.workload import Workload
from traces.model import EventBatch, IdleTimeline

__all__ = ("QUEUE_VIEW_CAP", "DecisionRow", "PolicyError", "SimConfig", "SimJob", "SimJobState", "SimResult", "Simulator")

Handler = Callable[[Any, float], bool]  # an event applied at a time: whether it asks for a decision

REPLAY_GC_THRESHOLD = 20_000
"""The cyclic collector's first threshold during a replay (Python's default: 700). A replay makes
millions of short-lived containers (views, records, plans) and keeps tens of thousands alive (its
jobs, rows, estimators): at the default, the collector walked the live ones in about 30 full
collections over the real Summit week, 3.9 of its 63 CPU seconds; at this one, once (1.3 s in all),
with the same peak memory. The replay's results do not depend on it."""


@contextmanager
def collector_for_replay() -> Iterator[None]:
    """The collector's first threshold at least :data:`REPLAY_GC_THRESHOLD` for the block, the caller's
    thresholds back after it (also when the block raises)."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], REPLAY_GC_THRESHOLD), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


class Simulator:
    """Replays ``timeline`` over ``[start, end]`` with ``workload`` under ``policy``."""

    def __init__(
        self, timeline: IdleTimeline, workload: Workload, policy: SimPolicy, config: SimConfig = SimConfig(),
        progress: Callable[[float], None] | None = None, seed: int = 0, keep_decisions: bool = False,
        monitor_factory: MonitorFactory | None = None,
    ) -> None:
        self.timeline = timeline
        self.workload = workload
        self.sim_policy = policy
        self.policy = policy.policy
        self.pcfg = policy.config
        self.config = config
        self.seed = seed
        self.start = timeline.start if config.start is None else float(config.start)
        self.end = timeline.end if config.end is None else float(config.end)
        if not self.start < self.end:
            raise ValueError(f"empty replay window: start {self.start} >= end {self.end}")
        self.clock = SimClock(self.start)
        self.events: EventQueue[object] = EventQueue()
        self._progress = progress
        self.ledger = Ledger()  # what the driver observed (nodes, who runs where, work left): builds the View
        self.cal = config.calibration if config.calibration is not None else free()
        self.fleet = Fleet(self.ledger, policy, config, self.cal, self.start, seed, monitor_factory)
        self.tallying = Tallying(self.ledger, self.fleet, self.start)
        self.physics = JobPhysics(self.ledger, self.fleet, self.tallying, self.cal, self.events, config,
                                  policy.free_rescales)
        self.driver = PolicyDriver(policy, self.ledger, self.fleet, self.physics, self.tallying, self.events,
                                   workload, timeline, config, self.end, keep_decisions)
        self._batches: Iterator[EventBatch] | None = None
        self._pending = False  # a change waits for a decision
        self._next_decision_at = -math.inf
        self._decide_scheduled = False
        self._handlers: dict[type, Handler] = {
            EventBatch: self._on_batch, Completion: self._on_completion, Arrival: self._on_arrival,
            Cancel: self._on_cancel, PilotUp: self._on_pilots_up, Joined: self._on_joined, Decide: self._on_decide,
            Wake: self._on_wake,
        }

    @property
    def jobs(self) -> dict[str, SimJob]:
        return self.fleet.jobs

    @property
    def tally(self) -> Tally:
        return self.tallying.tally

    @property
    def stats(self) -> DecisionStats:
        return self.driver.stats

    @property
    def rows(self) -> list[DecisionRow]:
        return self.driver.rows

    @property
    def decisions(self) -> list[Decision]:
        return self.driver.decisions

    def run(self) -> SimResult:
        with collector_for_replay():
            return self._run()

    def _run(self) -> SimResult:
        wall0 = time.perf_counter()
        cpu0 = time.process_time()
        self._prime()
        interval = self.config.min_interval_s
        tallying, physics = self.tallying, self.physics
        while len(self.events):
            t = self.events.peek_time()
            assert t is not None
            tallying.integrate(t)
            self.clock.advance_to(t)
            changed, ended = self._apply_events_at(t)
            if ended:
                break
            self._pending |= changed
            if not self._pending:
                continue
            if t >= self._next_decision_at:
                physics.advance_all(t)
                self.driver.decide(t)
                self._report_progress(t)
                self._pending = False
                self._next_decision_at = t + interval
            else:
                physics.schedule_completions(t)  # jobs shrunk by a recall finish later
                if not self._decide_scheduled:
                    self.events.push(self._next_decision_at, Priority.DECIDE, Decide())
                    self._decide_scheduled = True
        tallying.integrate(self.end)
        physics.advance_all(self.end)
        return self._result(time.perf_counter() - wall0, time.process_time() - cpu0)

    def cancel_at(self, t: float, job_id: str) -> None:
        """Cancel ``job_id`` at ``t`` (call before :meth:`run`; ids are ``j00000``, ``j00001``... in arrival order)."""
        self.events.push(t, Priority.ARRIVAL, Cancel(job_id))

    def _report_progress(self, t: float) -> None:
        if self._progress is not None:
            self._progress((t - self.start) / (self.end - self.start))

    def _prime(self) -> None:
        initial = dict.fromkeys(sorted(self.timeline.initial_idle))
        batches = self.timeline.batches()
        pending: EventBatch | None = None
        for batch in batches:
            if batch.time > self.start:
                pending = batch
                break
            for node in batch.became_idle:
                initial[node] = None
            for node in batch.recalled:
                initial.pop(node, None)
        self._batches = batches
        first = EventBatch(self.start, tuple(initial), ())
        self.events.push(self.start, Priority.TRACE, first)
        if pending is not None and pending.time < self.end:
            self.events.push(pending.time, Priority.TRACE, pending)
        for spec in self.workload.timed:
            self.events.push(self.start + spec.arrival_s, Priority.ARRIVAL, Arrival(spec))
        self.events.push(self.end, Priority.END, End())

    def _apply_events_at(self, t: float) -> tuple[bool, bool]:
        """Apply every event at ``t``: whether any asks for a decision, and whether the replay ended."""
        changed = False
        handlers = self._handlers
        while self.events.peek_time() == t:  # None once empty
            _, _, ev = self.events.pop()
            if type(ev) is End:
                return changed, True
            changed |= handlers[type(ev)](ev, t)
        return changed, False

    def _on_batch(self, ev: EventBatch, t: float) -> bool:
        self._apply_batch(ev)
        self._push_next_batch()
        return True

    def _on_completion(self, ev: Completion, t: float) -> bool:
        return self.physics.complete(ev, t)

    def _on_arrival(self, ev: Arrival, t: float) -> bool:
        self.fleet.queue.append(self.fleet.submit(ev.spec, t))
        return True

    def _on_cancel(self, ev: Cancel, t: float) -> bool:
        return self.physics.cancel(ev.job_id, t)

    def _on_pilots_up(self, ev: PilotUp, t: float) -> bool:
        """The pilots submitted at ``ev.since`` run: their nodes still idle since then become usable."""
        ledger = self.ledger
        up = [n for n in ev.nodes if ledger.idle_since(n) == ev.since and not ledger.is_usable(n)]
        return ledger.usable(up, ev.since) > 0

    def _on_joined(self, ev: Joined, t: float) -> bool:
        return self.physics.joined(self.fleet.jobs[ev.job_id], t)

    def _on_decide(self, ev: Decide, t: float) -> bool:
        self._decide_scheduled = False
        return False

    def _on_wake(self, ev: Wake, t: float) -> bool:
        self.driver.woken(t)
        return True

    def _apply_batch(self, batch: EventBatch) -> None:
        ledger, t = self.ledger, batch.time
        delay = self.cal.pilot_start_s
        if delay > 0:
            submitted = ledger.idle(batch.became_idle, t)
            if submitted:
                self.events.push(t + delay, Priority.TRACE, PilotUp(submitted, t))
        else:
            ledger.usable(batch.became_idle, t)
        hit: set[str] = set()
        jobs, physics = self.fleet.jobs, self.physics
        for node in batch.recalled:
            job_id = ledger.holder(node)
            if job_id is not None and job_id not in hit:
                physics.advance(jobs[job_id], t)  # account the interval before the node leaves
                hit.add(job_id)
        for loss in ledger.lost(batch.recalled, t):
            physics.recalled(jobs[loss.job], loss, t)  # the ledger decided what the loss does to it

    def _push_next_batch(self) -> None:
        batch = None if self._batches is None else next(self._batches, None)
        if batch is None or batch.time >= self.end:
            self._batches = None
            return
        self.events.push(batch.time, Priority.TRACE, batch)

    def _result(self, wall: float, cpu: float) -> SimResult:
        fleet, driver = self.fleet, self.driver
        jobs = list(fleet.jobs.values())
        about = about_replay(self.sim_policy.name, self.workload, self.timeline, self.start, self.end, self.pcfg, self.cal)
        drained = self.workload.finite and driver.stream_done and not fleet.queue and not fleet.admitted
        summary = replay_summary(about, self.tally, self.stats, jobs, start=self.start, end=self.end,
                                 finite=self.workload.finite, drained=drained, decisions=len(self.rows),
                                 decision_ms=driver.decision_ms, wall=wall, cpu=cpu)
        return SimResult(summary, self.rows, jobs, self.start, self.end, self.decisions)
