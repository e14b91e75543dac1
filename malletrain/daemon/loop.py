"""The loop: ONE reconcile loop, observe -> decide -> act, and the 1-s sampler.

:class:`Daemon` is built from its parts (docs/design.md) and :meth:`Daemon.step` passes values between
them; the "decide again" flag is the loop's alone."""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Callable

import zmq

from malletrain.daemon.config import DaemonConfig
from malletrain.daemon.accounting import NodeAccounting
from malletrain.daemon.act import Act
from malletrain.daemon.adoption import Adoption
from malletrain.daemon.api import ControlApi
from malletrain.daemon.decide import Decide, load_trainers
from malletrain.daemon.intake import JobIntake
from malletrain.daemon.observe import Observe
from malletrain.daemon.records import REPLAN_S, STOPPED, JobRun, Trainer
from malletrain.daemon.shutdown import Shutdown
from malletrain.daemon.state import JobTable, log
from malletrain.daemon.sweeps import SweepDriver, member_environ
from malletrain.daemon.wiring import DaemonParts, Wiring
from malletrain.daemon.jobspec import JobState
from malletrain.daemon.loopwait import LoopWait
from malletrain.daemon.scavenging import NodeStatus
from policy import Decision, Policy


class Daemon:
    """Build with ``Daemon(cfg)``; drive with :meth:`run` (or :meth:`step` in tests); :meth:`close` cleans up."""

    def __init__(self, cfg: DaemonConfig, clock: Callable[[], float] = time.time,
                 parts: DaemonParts | None = None) -> None:
        self.wiring = Wiring(cfg, clock, parts)
        try:
            self._build(cfg, clock, self.wiring)
        except BaseException:
            self.wiring.abandon()
            raise

    def _build(self, cfg: DaemonConfig, clock: Callable[[], float], w: Wiring) -> None:
        self.cfg, self.clock, self.parts, self.state_dir, self.ctx = cfg, clock, w.parts, w.state_dir, w.ctx
        self.store, self.metrics, self.monitor, self.replay, self.hub = w.store, w.metrics, w.monitor, w.replay, w.hub
        self.runtime, self.torchrun, self.backend, self.scav = w.runtime, w.torchrun, w.backend, w.scav
        trainers, saved_policy_state = load_trainers(cfg, self.store, self.state_dir)
        self.table = table = JobTable(trainers)
        self.accounting = NodeAccounting(self.store)  # node-seconds (budget_node_hours); fragments: the ledgers
        runtimes = w.runtimes
        intake = JobIntake(table, self.store, self.monitor, w.job_secret)
        self.decide = Decide(table, self.store, self.monitor, self.metrics, self.scav, self.accounting,
                             saved_policy_state)
        self.act = Act(table, self.hub, self.scav, self.store, self.monitor, self.metrics, runtimes, self.accounting,
                       w.job_secret, clock, lambda spec: member_environ(spec, self.state_dir))
        self.sweeps = SweepDriver(table, self.store, self.state_dir, clock)
        self.observe = Observe(table, cfg, self.scav, self.hub, self.store, self.monitor, self.metrics, self.decide,
                               intake, runtimes)
        self.adoption = Adoption(table, cfg, self.store, self.hub, self.scav, runtimes, intake, self.decide,
                                 self.act, clock)
        self.api = ControlApi(table, self.store, self.monitor, self.scav, self.accounting, self.decide, self.sweeps)
        self.shutdown = Shutdown(table, self.act, self.observe, self.hub, self.monitor, self.runtime, self.store,
                                 self.accounting, clock)
        w.open_control(self.api.handle, self.api.owner_of)
        self.control, self.control_address = w.control, w.control_address
        self.observe.discover_machine(self.backend)
        self._changed = True  # something changed since the last decision: decide at the next step
        self._next_sample = 0.0
        self._next_decide = 0.0
        self._closed = False
        now = clock()
        self.adoption.load_jobs(now)
        if w.killed_last_time() and not table.adopt_until:
            # the last daemon was killed (a clean stop removes daemon.json and logs its stop): its agents
            # may still run even with no job active; give them the adoption window to come back before
            # holding nodes, or a new pilot's agent never gets in beside a surviving one (one connection a node)
            table.adopt_until = now + cfg.agent_dead_after + 1.0
        # jobs a clean stop suspended in the middle of their profile: restarted at the first decision
        table.stopped_profiles = sorted(
            run.id for run in table.runs.values()
            if run.id in table.trainer_of(run).policy.state.profiles and run.state is JobState.SUSPENDED
            and (self.store.get(run.id) is not None and self.store.require(run.id).message == STOPPED))
        w.write_state_file()
        self.store.log_event("daemon_start", pid=os.getpid(), control=self.control_address)

    # ---------------------------------------------------------------- the loop
    def run(self, duration_s: float | None = None, on_tick: Callable[["Daemon"], None] | None = None) -> None:
        end = None if duration_s is None else time.monotonic() + duration_s
        quick = False
        while not self.stopping and (end is None or time.monotonic() < end):
            t0 = time.monotonic()
            self._guarded(lambda: self.step(quick))
            if on_tick is not None:
                on_tick(self)
            spare = self.cfg.loop_interval - (time.monotonic() - t0)
            lost: list[bool] = []  # reports and agent frames as they come (none to wait for after an iteration
            #                        that overran: what is there); a recall starts the next step at once
            wait = LoopWait(self.monitor, self.hub, self._observe_agents_between_steps, self.store.batch, self.clock)
            self._guarded(lambda: lost.append(wait.wait(max(0.0, spare))))
            quick = bool(lost and lost[0]) and not quick  # (never two in a row: the scheduler is asked at least
            #                                               every other iteration, whatever the agents say)

    def _guarded(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except (OSError, RuntimeError, ValueError, KeyError, zmq.ZMQError, sqlite3.Error, ArithmeticError,
                MemoryError, TypeError) as exc:
            # the daemon never dies of one bad input (an overflow, a huge value); the event log keeps the reason
            log.exception("reconcile step failed")
            self.store.log_event("step_error", error=f"{type(exc).__name__}: {exc}")

    def _observe_agents_between_steps(self, now: float) -> None:
        """Agent frames read while the loop waits: handled as at a step, decided on at the next one."""
        self._changed |= self.observe.agents(now)

    def step(self, quick: bool = False) -> None:
        """One iteration. ``quick``: started at once on a lost agent (a recall), so the new plan comes before
        any scheduler command (those wait for the next iteration: at Summit size they cost seconds)."""
        now = self.clock()
        table = self.table
        self.accounting.count(now, table.runs.values())
        changed = self._observe(now, quick)
        if now < table.adopt_until and not self.adoption.complete():
            self._changed |= changed
            return  # agents may still reconnect with the workers of the last daemon
        if table.adopt_until:
            self.adoption.finish(now)
            changed = True
        if not quick:
            self.adoption.hold_idle_nodes()
        changed |= self.sweeps.step(now)  # trials told, pruned, opened (before the decision that places them)
        changed |= self.decide.feed_ledgers(now)  # a node lost or usable asks for a decision, event or not
        changed |= self._changed
        # a profile's step ends on evidence: while one runs, ask at every iteration (the policy
        # answers an unchanged problem without solving)
        if self.scav.stale:
            pass  # no decision on stale data: the next good look catches up
        elif changed or now >= self._next_decide or self.decide.profiling:
            changed = False
            self._next_decide = now + REPLAN_S
            with self.store.batch():  # a decision's events, plans and policy states: one commit
                wake = self.decide.decide(now)
            if wake is not None:
                self._next_decide = min(self._next_decide, wake)
        self._changed = self.act.act(now, self.decide.plan()) or changed
        self.shutdown.persist_checkpoints()
        self._sample(now)

    def _observe(self, now: float, quick: bool) -> bool:
        """Observe, in order: the scheduler (not in a quick step), the agents, the reports, the store
        and the control socket. Returns whether something changed."""
        changed = False
        if not quick:
            changed |= self.observe.pilots(now)
        with self.store.batch():  # a burst of agent events, every job's progress: one commit each
            changed |= self.observe.agents(now)
        self.monitor.drain()
        with self.store.batch():
            changed |= self.observe.progress(now)
        self.replay.tick(now)
        self.control.serve(0)  # the API writes submits and cancels into the store ...
        changed |= self.observe.submissions(now)  # ... and are observed here, with the CLI's
        return changed

    def _sample(self, now: float) -> None:
        if now < self._next_sample:
            return
        self._next_sample = now + 1.0
        self.accounting.save(self.runs)
        states = self.scav.node_states()
        held = [n for n, s in states.items() if s in (NodeStatus.HELD, NodeStatus.HOLDING)]
        idle = sum(s is NodeStatus.IDLE for s in states.values())
        used = {n for r in self.runs.values() for n in r.members}
        self.store.log_event(
            "nodes", idle=len(held) + idle, held=len(held), used=len(used),
            jobs={r.id: len(r.members) for r in self.runs.values() if r.members},
        )
        self.metrics.observe_nodes(idle, len(held), len(used))
        self.metrics.observe_runs(self.runs.values(), self.monitor)
        self.metrics.observe_monitor(self.monitor)
        for rid in [rid for rid, r in self.runs.items() if r.state.terminal and not r.leaving]:
            self.act.release(self.runs.pop(rid))  # its runtime state goes once its workers have left

    def close(self) -> None:
        """Stop every job's workers (:meth:`.shutdown.Shutdown.stop`: SUSPENDED, "daemon stopped", resumed by
        the next daemon on this state dir), release every node, close sockets; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.shutdown.stop()
        self.wiring.close()

    # ---------------------------------------------------------------- what tests and front ends read
    @property
    def runs(self) -> dict[str, JobRun]:
        return self.table.runs

    @property
    def trainers(self) -> dict[str, Trainer]:
        return self.table.trainers

    @property
    def stopping(self) -> bool:
        return self.table.stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self.table.stopping = value

    @property
    def policy(self) -> Policy:
        """The first trainer's policy (the only one of a config without ``[[trainers]]``)."""
        return next(iter(self.trainers.values())).policy

    @property
    def last_decision(self) -> Decision | None:
        """The first trainer's last decision (each trainer's: ``trainers[name].last_decision``)."""
        return next(iter(self.trainers.values())).last_decision
