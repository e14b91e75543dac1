"""Checkpoints and shutdown: new checkpoints copied to the state dir every iteration, and a clean
stop that waits for the workers it stops, so their last commit and last reports are kept. It calls
act (to stop workers) and observe (to store the last reports); neither calls it. Closing the sockets,
the store and the lock is the wiring's (:meth:`.wiring.Wiring.close`)."""

from __future__ import annotations

import time
from typing import Callable

from malletrain.daemon.accounting import NodeAccounting
from malletrain.daemon.act import Act
from malletrain.daemon.observe import Observe
from malletrain.daemon.records import STOP_WAIT_S, STOPPED, job_of
from malletrain.daemon.state import JobTable
from malletrain.daemon.jobspec import JobState
from malletrain.daemon.monitor import Monitor
from malletrain.runtimes import Runtime
from malletrain.daemon.store import Store
from scavenger.base import AgentGone
from scavenger.hub import AgentHub, WorkerExitedEvent


class Shutdown:
    """Checkpoints kept across restarts, and the clean stop (:meth:`stop`)."""

    def __init__(self, table: JobTable, act: Act, observe: Observe, hub: AgentHub, monitor: Monitor,
                 runtime: Runtime, store: Store, accounting: NodeAccounting, clock: Callable[[], float]) -> None:
        self.table = table
        self.act = act
        self.observe = observe
        self.hub = hub
        self.monitor = monitor
        self.runtime = runtime
        self.store = store
        self.accounting = accounting
        self.clock = clock

    def persist_checkpoints(self) -> None:
        """Copy new checkpoints from the runtime's store to the state dir (a runtime hook; most do nothing)."""
        runs = self.table.runs.values()
        for job in self.runtime.persist_checkpoints([r.id for r in runs if not r.state.terminal]):
            self.store.log_event("checkpoint_saved", job)

    def stop(self) -> None:
        """Carry out the ends observed but not yet acted on, then stop every job's workers (see
        :meth:`_stop_for_restart`) and keep the node-seconds they used."""
        now = self.clock()
        for run in list(self.table.runs.values()):
            if run.ending is not None:  # observed but not yet carried out
                self.act.finish(run, *run.ending)
        self.accounting.count(now, self.table.runs.values())
        self._stop_for_restart(now)
        self.accounting.save(self.table.runs)

    def _stop_for_restart(self, now: float) -> None:
        """A clean stop: every job's workers are told to leave and stopped, then waited for (at most
        :data:`STOP_WAIT_S`) while the rendezvous and the monitor still serve: rank 0's last commit reaches
        the state dir and the last reports are read. The stored progress is what the workers reported, so at
        most one commit interval ahead of the checkpoint; reading the checkpoint's own counter would trust a
        counter scripts need not keep."""
        stopping = []
        for run in self.table.runs.values():
            if not run.state.terminal and (run.members or run.workers):
                before = set(run.leaving)
                self.act.stop_workers(run, now)
                stopping += [(run, wid) for wid in run.leaving if wid not in before]
                if run.state.active:
                    self.act.set_state(run, JobState.SUSPENDED, STOPPED)
        if not stopping:
            return
        deadline = time.monotonic() + STOP_WAIT_S
        while any(wid in run.leaving for run, wid in stopping) and time.monotonic() < deadline:
            for ev in self.hub.poll():
                if isinstance(ev, WorkerExitedEvent):
                    exited = self.table.runs.get(job_of(ev.worker))
                    if exited is not None:
                        exited.worker_left(ev.worker)
                elif isinstance(ev, AgentGone):
                    for run, wid in stopping:
                        if run.leaving.get(wid, ("",))[0] == ev.node:
                            run.worker_left(wid)
            self.monitor.drain(timeout_ms=50)
            self.persist_checkpoints()
        while self.monitor.drain(timeout_ms=100):  # reports still on their way from the exited workers
            pass
        self.observe.progress(self.clock())  # stores what the last reports added
        self.persist_checkpoints()
