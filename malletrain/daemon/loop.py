"""The loop: ONE reconcile loop, observe -> decide -> act, and the 1-s sampler.

:class:`Daemon` is put together from its parts (see :mod:`malletrain.daemon`): :class:`.Wiring`
builds it, :class:`.Observe` and :class:`.Adoption` observe, :class:`.Trainers` decides, :class:`.Jobs`
acts, :class:`.ControlApi` serves the control socket and :class:`.Shutdown` stops it.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Callable

import zmq

from malletrain.daemon.adoption import Adoption
from malletrain.daemon.api import ControlApi
from malletrain.daemon.base import log
from malletrain.daemon.jobs import Jobs
from malletrain.daemon.observe import Observe
from malletrain.daemon.records import REPLAN_S
from malletrain.daemon.shutdown import Shutdown
from malletrain.daemon.trainers import Trainers
from malletrain.daemon.wiring import Wiring
from malletrain.loopwait import LoopWait


class Daemon(Wiring, Observe, Adoption, Trainers, Jobs, ControlApi, Shutdown):
    """Build with :meth:`start`; drive with :meth:`run` (or :meth:`step` in tests); :meth:`close` cleans up."""

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
            wait = LoopWait(self.monitor, self.hub, self._observe_agents, self.store.batch, self.clock)
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

    def step(self, quick: bool = False) -> None:
        """One iteration. ``quick``: it started at once because an agent was lost (a recall): its new
        plan comes before any scheduler command (the look at pilots and nodes, which runs one
        ``scontrol`` per ended pilot, and the pilots submitted for idle nodes wait for the next
        iteration, at most ``loop_interval`` later): a burst of recalls at Summit size made those
        seconds."""
        now = self.clock()
        self._count_node_seconds(now)
        if not quick:
            self._observe_backend(now)
        with self.store.batch():  # a burst of agent events, every job's progress: one commit each
            self._observe_agents(now)
        self.monitor.drain()
        with self.store.batch():
            self._observe_progress(now)
        self.replay.tick(now)
        self._observe_store(now)
        self._serve_control()
        if now < self._adopt_until and not self._adoption_complete():
            return  # agents may still reconnect with the workers of the last daemon
        if self._adopt_until:
            self._finish_adoption(now)
        if not quick:
            self._hold_idle_nodes()
        self._feed_ledgers(now)
        # a profile's step ends on evidence: while one runs, ask at every iteration (the policy
        # answers an unchanged problem without solving)
        if self.scav.stale:
            pass  # no decision on stale data: the next good look catches up
        elif self._changed or now >= self._next_decide or self._profiling:
            self._changed = False
            self._next_decide = now + REPLAN_S
            with self.store.batch():  # a decision's events, plans and policy states: one commit
                self._decide(now)
        self._act(now)
        self._persist_checkpoints()
        self._sample(now)

    def _sample(self, now: float) -> None:
        if now < self._next_sample:
            return
        self._next_sample = now + 1.0
        self._save_node_seconds()
        states = self.scav.node_states()
        held = [n for n, s in states.items() if s in ("held", "holding")]
        used = {n for r in self.runs.values() for n in r.members}
        self.store.log_event(
            "nodes", idle=len(held) + sum(s == "idle" for s in states.values()), held=len(held), used=len(used),
            jobs={r.id: len(r.members) for r in self.runs.values() if r.members},
        )
        self.metrics.observe_nodes(sum(s == "idle" for s in states.values()), len(held), len(used))
        self.metrics.observe_runs(self.runs.values(), self.monitor)
        self.metrics.observe_monitor(self.monitor)
        for rid in [rid for rid, r in self.runs.items() if r.state.terminal and not r.leaving]:
            del self.runs[rid]

    # ---------------------------------------------------------------- accounting (NodeAccounting)
    def used_node_hours(self, job_id: str) -> float:
        """Node-hours the job's workers have held, as this daemon (and the ones before it) counted them."""
        return self.accounting.used_node_hours(job_id)

    def _count_node_seconds(self, now: float) -> None:
        self.accounting.count(now, self.runs.values())

    def _save_node_seconds(self) -> None:
        self.accounting.save(self.runs)
