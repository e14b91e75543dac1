"""Observe: only records what happened (pilot events, agents and their workers, progress and
rescale pauses from the monitor, jobs and cancels the CLI wrote into the store); a job that must end
is marked (:meth:`.records.JobRun.end`) and act carries it out. Each look returns whether something
changed (the loop decides again for it); a lost node, whichever way it was learnt, is one
:class:`.records.NodeLost` handled by :meth:`Observe.node_lost`."""

from __future__ import annotations

from malletrain.daemon.config import DaemonConfig
from malletrain.daemon.decide import Decide
from malletrain.daemon.intake import JobIntake
from malletrain.daemon.records import JobRun, NodeLost, job_of, rescale_kind, stopped_by_us
from malletrain.daemon.state import JobTable, Runtimes, log
from malletrain.daemon.jobspec import NODE_SLOTS_KEY, JobState, Launcher, node_slots_text
from malletrain.daemon.logs import about
from malletrain.daemon.metrics import Metrics
from malletrain.daemon.monitor import Monitor
from malletrain.daemon.scavenging import Scavenging
from malletrain.daemon.store import Store
from policy.health import (
    Stall, StallRule, failed_for_good, reports_progress, silent_for, stall_text, stall_verdict,
)
from scavenger.base import AgentGone, AgentUp, BackendError, PilotEnded, PilotEnding, PilotStarted, SchedulerBackend
from scavenger.hub import AgentHub, AgentWorkers, WorkerExitedEvent, WorkerStartedEvent


class Observe:
    """What the backend, the agents, the monitor, the runtimes and the store say happened. It tells decide's
    ledger only of a node a failed worker gives up, asks runtimes only whether ranks finished, calls no other part."""

    def __init__(self, table: JobTable, cfg: DaemonConfig, scav: Scavenging, hub: AgentHub, store: Store,
                 monitor: Monitor, metrics: Metrics, decide: Decide, intake: JobIntake,
                 runtimes: Runtimes | None = None) -> None:
        self.table = table
        self.cfg = cfg
        self.scav = scav
        self.hub = hub
        self.store = store
        self.monitor = monitor
        self.metrics = metrics
        self.decide = decide
        self.intake = intake
        self.runtimes = runtimes  # read only: whose ranks may say the work is done before their workers exit
        self._machine_size = 0
        self._node_slots: tuple[int, str] | None = None
        self._shape_seen_at: float | None = None  # the time of the look whose node shape was noted

    def discover_machine(self, backend: SchedulerBackend) -> None:
        """One look at the machine at start: its size bounds the jobs `submit` accepts."""
        try:
            self.scav.discovery = backend.discover()
        except BackendError as exc:  # the scheduler may be down now: the count comes with the first good look
            self.store.log_event("backend_error", backend=backend.name, error=str(exc))
            return
        self._note_machine_size()

    def _note_machine_size(self) -> None:
        n = self.scav.machine_size()
        if n and n != self._machine_size:
            self._machine_size = n
            self.store.set_machine_nodes(n)  # `submit` refuses jobs bigger than the machine
        d = self.scav.discovery
        if d is None or d.at == self._shape_seen_at:
            return  # the node shape of a look already seen
        self._shape_seen_at = d.at
        shape = self.scav.node_shape()
        if shape is not None and shape != self._node_slots:
            self._node_slots = shape
            self.store.set_meta(NODE_SLOTS_KEY, node_slots_text(*shape))  # ... and more workers a node than it has

    def pilots(self, now: float) -> bool:
        """Pilot events and the idle nodes (at most every poll_interval); a failed look marks them stale."""
        changed = False
        for ev in self.scav.look(now):
            kind, detail = Scavenging.describe(ev)
            self.store.log_event(kind, **detail)
            if isinstance(ev, PilotEnded):
                for node in ev.nodes:
                    if node not in self.scav.held():  # not a replacement that already took over
                        self.node_lost(NodeLost(node, f"pilot {ev.reason.value}"), now)
                        changed = True
            elif isinstance(ev, (PilotStarted, PilotEnding)):
                changed = True  # a node to grow onto, or one to leave before its deadline
        self._note_machine_size()
        return changed

    def agents(self, now: float) -> bool:
        """The agents' frames: agents up and gone, the workers they run, started and exited."""
        changed = False
        for ev in self.hub.poll():
            if isinstance(ev, AgentUp):
                self.scav.adopt(ev.node, self.scav.agent_batch_job(ev.node), self.hub.pid(ev.node))
                self.store.log_event("agent_up", node=ev.node)
                log.info("agent up on node %s", ev.node, extra=about(node=ev.node))
                changed = True
            elif isinstance(ev, AgentWorkers):
                self.scav.adopt(ev.node, str(ev.batch_job or self.scav.agent_batch_job(ev.node)),
                                ev.pid)
                self._adopt_workers(ev.node, ev.workers)
            elif isinstance(ev, AgentGone):
                self.store.log_event("agent_gone", node=ev.node, reason=ev.reason)
                log.info("agent on node %s gone (%s)", ev.node, ev.reason, extra=about(node=ev.node))
                self.node_lost(NodeLost(ev.node, ev.reason), now)
                changed = True
                if ev.node in self.scav.held():
                    self.table.to_release.add(ev.node)  # act cancels its pilot: observe only records
            elif isinstance(ev, WorkerStartedEvent):
                run = self.table.runs.get(job_of(ev.worker))
                if run is not None:
                    run.started.add(ev.worker)
                    self.store.log_event("worker_started", run.id, node=ev.node, worker=ev.worker)
            elif isinstance(ev, WorkerExitedEvent):
                changed |= self._worker_exited(ev, now)
        return changed

    def node_lost(self, ev: NodeLost, now: float) -> None:
        """A node this daemon no longer has: its jobs forget their worker there and the loop is woken; the ledgers
        learn the loss from the usable set's difference at the next feed (:meth:`Decide.feed_ledgers`)."""
        node, reason = ev.node, ev.reason
        for run in self.table.runs.values():
            if node in run.workers:
                run.worker_gone(node)
                self.store.log_event("node_lost", run.id, node=node, reason=reason)
                log.info("job %s lost node %s (%s)", run.id, node, reason, extra=about(job=run.id, node=node))

    def _worker_exited(self, ev: WorkerExitedEvent, now: float) -> bool:
        run = self.table.runs.get(job_of(ev.worker))
        if run is None:
            return False
        if run.worker_left(ev.worker):
            return False
        if run.workers.get(ev.node) != ev.worker:
            return False  # an old worker of a node the job no longer has
        if ev.node not in self.scav.held():  # its pilot is ending or gone: a recall (Slurm signals the whole
            self.node_lost(NodeLost(ev.node, "pilot ending"), now)  # step), not a failure of the job
            return True
        run.worker_gone(ev.node)
        if ev.code == 0 and ev.node in run.members:
            return run.end(JobState.COMPLETED, f"worker {ev.worker} exited 0")
        if stopped_by_us(ev.code, ev.stopped, ev.worker in run.inherited):  # a new worker takes its place
            self.store.log_event("worker_stopped", run.id, worker=ev.worker, code=ev.code)
            log.info("job %s: worker %s was stopped (exit %d) on node %s; starting another", run.id, ev.worker,
                     ev.code, ev.node, extra=about(job=run.id, worker=ev.worker))
            return True
        started = run.start_sent.get(ev.worker)
        early = started is not None and (run.progress_at is None or run.progress_at < started)
        run.worker_failed(early)
        self.decide.give_up_node(run, ev.node, now)
        self.store.log_event("worker_failed", run.id, worker=ev.worker, code=ev.code, failures=run.failures,
                             before_first_step=early)
        why = failed_for_good(run.failures, run.early_failures, self.cfg.max_failures)
        if why is not None:
            run.end(JobState.FAILED, f"{why}; last {ev.worker} exit {ev.code}")
        return True

    def _adopt_workers(self, node: str, workers: tuple[str, ...]) -> None:
        """The workers an agent reports (after a restart): a job's on a node the last daemon left it on
        are adopted; any other is stopped as nobody's."""
        for wid in workers:
            run = self.table.runs.get(job_of(wid))
            if run is not None and node in (run.left_on or ()) and node not in run.workers:
                run.new_worker(node, wid)
                run.started.add(wid)
                run.inherited.add(wid)
                self.store.log_event("adopt", run.id, node=node, worker=wid)
            elif run is None or run.workers.get(node) != wid:
                if run is None or wid not in run.leaving:
                    self.hub.stop_worker(node, wid, grace=1.0)  # a worker nobody owns

    def progress(self, now: float) -> bool:
        """Progress from the monitor, stored as soon as it grows (a ``kill -9`` then loses one loop interval's
        reports). Returns whether a rescale was measured or a job reached its target."""
        changed = False
        for run in list(self.table.runs.values()):
            done = self.runtimes.of(run.spec).finished(run.id) if self.runtimes and run.members else None
            changed |= run.end(JobState.COMPLETED, done) if done else False
            stats = self.monitor.jobs.get(run.id)
            if stats is None:
                changed |= self._silence(run, now)
                continue
            progress = run.base_samples + stats.samples
            run.progressed(progress, now)
            changed |= self._silence(run, now)
            for ev in stats.new_rescales():
                kind = rescale_kind(ev, run.emptied_at)
                self.store.record_rescale(run.id, ev.from_size, ev.to_size, ev.pause_s, kind)
                self.metrics.observe_rescale(kind, ev.pause_s)
                if kind != "resume":
                    run.rescales.append(ev)
                    changed = True
            if progress > run.saved_samples:
                self.store.set_samples(run.id, progress)
                run.samples_saved(progress)
            target = run.spec.samples
            if target is not None and progress >= target:
                self.store.set_samples(run.id, progress)
                changed |= run.end(JobState.COMPLETED, f"trained {progress} of {target} samples")
        return changed

    def _silence(self, run: JobRun, now: float) -> bool:
        """A running job's silence, as :mod:`policy.health` reads it: stalled (recorded for ``status``),
        to restart (act does it) or failed. Returns whether it is to restart or end."""
        if not run.phase.live or run.restart:
            return False
        rule = StallRule(float(run.spec.stall_after or self.cfg.stall_after), self.cfg.stall_restarts)
        silent = silent_for(now, run.workers_since, run.progress_at)
        reports = reports_progress(run.spec.launcher is Launcher.TORCHRUN, run.spec.worker_batch,
                                   run.progress_at is not None)
        verdict = stall_verdict(silent, rule, run.stall_restarts, reports)
        if verdict is Stall.NONE:
            run.note_stall("", 0.0)
            return False
        if not run.stalled:
            self.store.log_event("stalled", run.id, silent_s=round(silent, 1), bound_s=rule.after_s)
            log.warning("job %s: no progress for %.0f s: stalled", run.id, silent, extra=about(job=run.id))
        run.note_stall(stall_text(silent, rule, run.stall_restarts), round(silent, 1))
        if verdict is Stall.RESTART:
            run.ask_restart(f"stalled: no progress for {silent:.0f} s")
            return True
        if verdict is Stall.FAIL:
            return run.end(JobState.FAILED, f"stalled: no progress for {silent:.0f} s after {run.stall_restarts} "
                                            f"restart(s) from its checkpoint")
        return False

    def submissions(self, now: float) -> bool:
        """New jobs and cancels written by the CLI (directly into the store); returns whether there were any."""
        changed = False
        runs = self.table.runs
        live = self.store.job_states([s for s in JobState if not s.terminal])  # specs read only for new jobs
        for jid, status in live.items():
            run = runs.get(jid)
            if run is not None:
                if status.cancel_requested:
                    changed |= run.end(JobState.CANCELLED, "cancelled by user")
                continue
            rec = self.store.get(jid) if status.state is JobState.PENDING else None  # a new job's spec, read once
            if rec is not None and not self.intake.refused(rec.id, rec.spec):
                runs[rec.id] = JobRun(rec.id, rec.spec, rec.state, base_samples=rec.samples,
                                      owner=(rec.owner_uid, rec.owner_gid), umask=rec.owner_umask)
                self.intake.register(rec.id)
                changed = True
        for run in list(runs.values()):
            if not run.state.terminal and run.id not in live:  # cancelled while queued
                rec = self.store.get(run.id)
                if rec is not None and rec.state.terminal:
                    changed |= run.end(rec.state, rec.message or "ended in the store")
        return changed
