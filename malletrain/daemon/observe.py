"""Observe: only records what happened (pilot events, agents and their workers, progress and
rescale pauses from the monitor, jobs and cancels the CLI wrote into the store); a job that must end
is marked (:meth:`~malletrain.daemon.jobs.Jobs._end`) and act carries it out."""

from __future__ import annotations

from malletrain.daemon.base import DaemonBase, log
from malletrain.daemon.records import JobRun, job_of, rescale_kind, stopped_from_outside
from malletrain.jobspec import JobSpec, JobState
from malletrain.logs import about
from malletrain.scavenging import Scavenging
from malletrain.store import StoreError
from scavenger.base import AgentGone, AgentUp, PilotEnded, PilotEnding, PilotStarted
from scavenger.hub import AgentWorkers, WorkerExitedEvent, WorkerStartedEvent


class Observe(DaemonBase):
    """What the backend, the agents, the monitor and the store say happened."""

    def usable_nodes(self) -> set[str]:
        """Nodes of RUNNING pilots whose own agent is connected (not ENDING ones: jobs leave those)."""
        return self.scav.usable()

    def _observe_backend(self, now: float) -> None:
        """Pilot events and the idle nodes (at most every poll_interval); a failed look marks them stale."""
        for ev in self.scav.look(now):
            kind, detail = Scavenging.describe(ev)
            self.store.log_event(kind, **detail)
            if isinstance(ev, PilotEnded):
                for node in ev.nodes:
                    if node not in self.scav.held():  # not a replacement that already took over
                        self._node_lost(node, now, f"pilot {ev.reason.value}")
            elif isinstance(ev, (PilotStarted, PilotEnding)):
                self._changed = True  # a node to grow onto, or one to leave before its deadline
        self._note_machine_size()

    def _observe_agents(self, now: float) -> None:
        for ev in self.hub.poll():
            if isinstance(ev, AgentUp):
                self.scav.adopt(ev.node, self.scav.agent_batch_job(ev.node), self.hub.pid(ev.node))
                self.store.log_event("agent_up", node=ev.node)
                log.info("agent up on node %s", ev.node, extra=about(node=ev.node))
                self._changed = True
            elif isinstance(ev, AgentWorkers):
                self.scav.adopt(ev.node, str(ev.batch_job or self.scav.agent_batch_job(ev.node)),
                                ev.pid)
                self._adopt_workers(ev.node, ev.workers)
            elif isinstance(ev, AgentGone):
                self.store.log_event("agent_gone", node=ev.node, reason=ev.reason)
                log.info("agent on node %s gone (%s)", ev.node, ev.reason, extra=about(node=ev.node))
                self._node_lost(ev.node, now, ev.reason)
                if ev.node in self.scav.held():
                    self._to_release.add(ev.node)  # act cancels its pilot: observe only records
            elif isinstance(ev, WorkerStartedEvent):
                run = self.runs.get(job_of(ev.worker))
                if run is not None:
                    run.started.add(ev.worker)
                    self.store.log_event("worker_started", run.id, node=ev.node, worker=ev.worker)
            elif isinstance(ev, WorkerExitedEvent):
                self._worker_exited(ev, now)

    def _node_lost(self, node: str, now: float, reason: str) -> None:
        holders = self._lose_node(node, now)
        for run in self.runs.values():
            if run.id in holders or node in run.workers:
                wid = run.workers.pop(node, None)
                if wid:
                    run.leaving.pop(wid, None)
                self.store.log_event("node_lost", run.id, node=node, reason=reason)
                log.info("job %s lost node %s (%s)", run.id, node, reason, extra=about(job=run.id, node=node))
        self._changed = True

    def _worker_exited(self, ev: WorkerExitedEvent, now: float) -> None:
        run = self.runs.get(job_of(ev.worker))
        if run is None:
            return
        if ev.worker in run.leaving:
            del run.leaving[ev.worker]
            return
        if run.workers.get(ev.node) != ev.worker:
            return  # an old worker of a node the job no longer has
        if ev.node not in self.scav.held():  # its pilot is ending or gone: a recall (Slurm signals the whole
            self._node_lost(ev.node, now, "pilot ending")  # step), not a failure of the job
            return
        del run.workers[ev.node]
        if ev.code == 0 and ev.node in run.members:
            self._end(run, JobState.COMPLETED, f"worker {ev.worker} exited 0")
            return
        if stopped_from_outside(ev.code):  # not the job's failure: a new worker takes its place at once
            self.store.log_event("worker_stopped", run.id, worker=ev.worker, code=ev.code)
            log.info("job %s: worker %s was stopped (exit %d) on node %s; starting another", run.id, ev.worker,
                     ev.code, ev.node, extra=about(job=run.id, worker=ev.worker))
            self._changed = True
            return
        run.failures += 1
        self._give_up_node(run, ev.node, now)
        self.store.log_event("worker_failed", run.id, worker=ev.worker, code=ev.code, failures=run.failures)
        if run.failures >= self.cfg.max_failures:
            self._end(run, JobState.FAILED, f"{run.failures} workers failed without progress; last {ev.worker} exit {ev.code}")
        self._changed = True

    def _observe_progress(self, now: float) -> None:
        """Progress from the monitor, stored as soon as it grows (one small UPDATE; WAL, no fsync).

        Stored at once rather than once a second: a ``kill -9`` then loses only the
        reports the dead daemon had received but not yet read (one loop interval), so
        the stored count stays with what the workers trained (storing once a second, a stop left it
        3,840 samples behind). A clean stop reads every last report first (:meth:`close`).
        """
        for run in list(self.runs.values()):
            stats = self.monitor.jobs.get(run.id)
            if stats is None:
                continue
            progress = run.base_samples + stats.samples
            if progress > run.last_progress:
                run.last_progress = progress
                run.failures = 0
            for ev in stats.new_rescales():
                kind = rescale_kind(ev, run.emptied_at)
                self.store.record_rescale(run.id, ev.from_size, ev.to_size, ev.pause_s, kind)
                self.metrics.observe_rescale(kind, ev.pause_s)
                if kind != "resume":
                    run.rescales.append(ev)
                    self._changed = True
            if progress > run.saved_samples:
                self.store.set_samples(run.id, progress)
                run.saved_samples = progress
            target = run.spec.samples
            if target is not None and progress >= target:
                self.store.set_samples(run.id, progress)
                self._end(run, JobState.COMPLETED, f"trained {progress} of {target} samples")

    def _observe_store(self, now: float) -> None:
        """New jobs and cancels written by the CLI (directly into the store)."""
        live = self.store.job_states([s for s in JobState if not s.terminal])  # specs read only for new jobs
        for jid, status in live.items():
            run = self.runs.get(jid)
            if run is not None:
                if status.cancel_requested:
                    self._end(run, JobState.CANCELLED, "cancelled by user")
                continue
            rec = self.store.get(jid) if status.state is JobState.PENDING else None  # a new job's spec, read once
            if rec is not None and not self._refused_trainer(rec.id, rec.spec):
                self.runs[rec.id] = JobRun(rec.id, rec.spec, rec.state, base_samples=rec.samples,
                                           owner=(rec.owner_uid, rec.owner_gid))
                self._register(rec.id)
                self._changed = True
        for run in list(self.runs.values()):
            if not run.state.terminal and run.id not in live:  # cancelled while queued
                rec = self.store.get(run.id)
                if rec is not None and rec.state.terminal:
                    self._end(run, rec.state, rec.message or "ended in the store")

    def _refused_trainer(self, job_id: str, spec: JobSpec) -> bool:
        """A job that reached the store without the daemon (CLI, no daemon running) naming a trainer
        this daemon does not have: FAILED, with the reason."""
        why = self.unknown_trainer(spec)
        if why is None:
            return False
        try:
            self.store.set_state(job_id, JobState.FAILED, why)
            self.store.set_nodes(job_id, [])  # workers an earlier daemon ran for it: stopped as nobody's
        except StoreError as exc:  # e.g. cancelled a moment ago
            log.warning("%s", exc, extra=about(job=job_id))
        self.store.log_event("trainer_unknown", job_id, trainer=spec.trainer)
        return True
