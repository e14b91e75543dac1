"""Checkpoints and shutdown: new checkpoints copied to the state dir every iteration, and a clean
stop that waits for the workers it stops, so their last commit and last reports are kept."""

from __future__ import annotations

import fcntl
import os
import time

from malletrain.daemon.base import DaemonBase
from malletrain.daemon.records import STATE_FILE, STOP_WAIT_S, STOPPED, job_of
from malletrain.jobspec import JobState
from scavenger.base import AgentGone
from scavenger.hub import WorkerExitedEvent


class Shutdown(DaemonBase):
    """Checkpoints kept across restarts, and :meth:`close`."""

    def _persist_checkpoints(self) -> None:
        """Copy new checkpoints from the runtime's store to the state dir (a runtime hook; most do nothing)."""
        for job in self.runtime.persist_checkpoints([r.id for r in self.runs.values() if not r.state.terminal]):
            self.store.log_event("checkpoint_saved", job)

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
        for run in self.runs.values():
            if not run.state.terminal and (run.members or run.workers):
                before = set(run.leaving)
                self._stop_workers(run, now)
                stopping += [(run, wid) for wid in run.leaving if wid not in before]
                if run.state.active:
                    self._set_state(run, JobState.SUSPENDED, STOPPED)
        if not stopping:
            return
        deadline = time.monotonic() + STOP_WAIT_S
        while any(wid in run.leaving for run, wid in stopping) and time.monotonic() < deadline:
            for ev in self.hub.poll():
                if isinstance(ev, WorkerExitedEvent):
                    run = self.runs.get(job_of(ev.worker))
                    if run is not None:
                        run.leaving.pop(ev.worker, None)
                elif isinstance(ev, AgentGone):
                    for run, wid in stopping:
                        if run.leaving.get(wid, ("",))[0] == ev.node:
                            run.leaving.pop(wid, None)
            self.monitor.drain(timeout_ms=50)
            self._persist_checkpoints()
        while self.monitor.drain(timeout_ms=100):  # reports still on their way from the exited workers
            pass
        self._observe_progress(self.clock())  # stores what the last reports added
        self._persist_checkpoints()

    # ---------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Stop every job's workers (see :meth:`_stop_for_restart`), release every node, close
        sockets; idempotent. The jobs it stops are SUSPENDED ("daemon stopped") and resume
        when a daemon runs again on the same state dir."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        now = self.clock()
        for run in list(self.runs.values()):
            if run.ending is not None:  # observed but not yet carried out
                self._finish(run, *run.ending)
        self._count_node_seconds(now)
        self._stop_for_restart(now)
        self._save_node_seconds()
        self.scav.close()
        self.runtime.close()
        self.torchrun.close()
        self.store.log_event("daemon_stop", pid=os.getpid())
        self.replay.save()
        self.metrics.close()
        for sock in (self.monitor, self.hub):
            sock.close()
        self.control.close()
        self.ctx.term()
        self.store.close()
        try:
            (self.state_dir / STATE_FILE).unlink()
        except FileNotFoundError:
            pass
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)
