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
        """A clean stop: every job's workers go, leaving nothing behind that a restart needs.

        The workers are told to leave (an empty generation) and stopped, then
        waited for (at most :data:`STOP_WAIT_S`) while the daemon still serves the
        rendezvous and the monitor: rank 0 leaves its last commit in the store on
        the way out, which goes to the state dir, and the last reports are read.

        Progress: the stored count is what the workers reported, flushed after
        they exited, so it is never behind what they trained and committed. It can
        be ahead by the steps after the last commit (reported, then rolled back by
        the stop and trained again after the restart): at most one commit
        interval. The other choice, the samples counter in the checkpoint, would
        make the daemon read its users' checkpoints and trust a counter a script
        need not keep in the units it reports; and a job whose rank 0 was killed
        before it could leave a checkpoint would lose everything it reported.
        """
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
