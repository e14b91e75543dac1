"""Scavenging and adoption after a restart: the jobs the last daemon left, the adoption window (the
agents that come back report their workers to observe, which adopts them), and holding idle nodes."""

from __future__ import annotations

from typing import Callable

from malletrain.daemon.config import DaemonConfig
from malletrain.daemon.act import Act
from malletrain.daemon.decide import Decide
from malletrain.daemon.intake import JobIntake
from malletrain.daemon.records import JobPhase, JobRun
from malletrain.daemon.state import JobTable, Runtimes, log
from malletrain.daemon.jobspec import Launcher
from malletrain.daemon.logs import about
from malletrain.daemon.scavenging import Scavenging
from malletrain.daemon.store import Store
from scavenger.hub import AgentHub


class Adoption:
    """What a restarted daemon takes over, and the idle nodes it holds. Calls decide (to place the
    adopted jobs) and act (to suspend those whose workers did not come back); neither calls it."""

    def __init__(self, table: JobTable, cfg: DaemonConfig, store: Store, hub: AgentHub, scav: Scavenging,
                 runtimes: Runtimes, intake: JobIntake, decide: Decide, act: Act,
                 clock: Callable[[], float]) -> None:
        self.table = table
        self.cfg = cfg
        self.store = store
        self.hub = hub
        self.scav = scav
        self.runtimes = runtimes
        self.intake = intake
        self.decide = decide
        self.act = act
        self.clock = clock

    def load_jobs(self, now: float) -> None:
        """The jobs the store keeps (the last daemon's): those that ran open the adoption window."""
        for rec in self.store.jobs():
            if rec.state.terminal or self.intake.refused(rec.id, rec.spec):
                continue
            gen = self.store.generation(rec.id)
            run = JobRun(rec.id, rec.spec, rec.state, rec.state.active, base_samples=rec.samples,
                         last_progress=rec.samples, owner=(rec.owner_uid, rec.owner_gid), umask=rec.owner_umask)
            self.table.runs[rec.id] = run
            if gen:  # numbering never goes backwards: old workers may still run
                self.runtimes.of(rec.spec).resume_generation(rec.id, gen)
            if rec.spec.launcher is Launcher.TORCHRUN:  # its restart count goes on
                self.runtimes.torchrun.resume_worlds(rec.id, self._worlds_published(rec.id))
            self.intake.register(rec.id)
            if rec.state.active:
                run.left_on = tuple(rec.nodes)
                self.table.adopt_until = now + self.cfg.agent_dead_after + 1.0

    def _worlds_published(self, job_id: str) -> int:
        """How many non-empty member lists the daemons published for ``job_id`` (counted in the store's
        meta as they were published; the event log for a store an older daemon wrote)."""
        counted = self.store.worlds(job_id)
        if counted is not None:
            return counted
        logged = sum(1 for ev in self.store.events("members") if ev.get("job") == job_id and ev.get("nodes"))
        self.store.set_worlds(job_id, logged)  # counted from here on
        return logged

    def complete(self) -> bool:
        """Every pilot the last daemon held has its agent back, and every job it ran has its workers
        back: adoption need not wait out ``agent_dead_after`` (that is for dead nodes, not restarts)."""
        held = self.scav.held()
        alive = self.hub.alive()
        # the last daemon's pilots too: one whose agent has not said hello yet is not in held(), and a
        # new pilot submitted for its node would fight the agent still running there
        if not held or any(node not in alive for node in set(held) | self.scav.last_daemons_nodes()):
            return False
        return all(node in run.workers for run in self.table.runs.values() for node in run.left_on or ())

    def finish(self, now: float) -> None:
        """Each adopted job runs on the nodes the last daemon left it on whose workers came back (its
        trainer's ledger places it there); below its min it is suspended."""
        self.table.adopt_until = 0.0
        self.decide.feed_ledgers(now)  # the usable nodes and the live jobs, to place the adopted ones on
        for run in self.table.runs.values():
            if run.left_on is None:  # not the last daemon's (one asked to end since is ENDING, and still handed over)
                continue
            stopped = self.decide.adopt_nodes(run, run.left_on, now)
            run.left_on = None
            if run.phase is JobPhase.ADOPTED:
                run.move(JobPhase(run.state.value))  # as stored: act carries it on from there
            self.act.unpublish(run)  # republish: the runtime may be new
            runtime = self.runtimes.of(run.spec)
            try:  # runtimes with daemon-side state (a Horovod driver) take the job over
                runtime.readopt(run.id, run.spec.command, {wid: node for node, wid in run.workers.items()})
            except (OSError, ValueError, RuntimeError) as exc:
                log.warning("runtime.readopt(%s): %s", run.id, exc, extra=about(job=run.id))
                self.store.log_event("readopt_error", run.id, error=str(exc))
            if stopped:
                self.act.suspend(run, now, "not re-adopted after a daemon restart")
                try:
                    runtime.forget(run.id)  # e.g. a driver the last daemon left running
                except Exception as exc:
                    log.warning("runtime.forget(%s): %s", run.id, exc, extra=about(job=run.id))
            self.store.log_event("readopted", run.id, nodes=list(self.decide.nodes_of(run.id)))

    def hold_idle_nodes(self) -> None:
        """Hold every idle node some trainer can use (pilots are preemptable), never one the main scheduler
        planned for a pending job, and nothing while the last look is stale."""
        self.scav.hold_idle(self.clock(), wanted=lambda node: self.decide.node_trainer(node) is not None)
