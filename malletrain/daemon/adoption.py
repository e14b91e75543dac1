"""Scavenging and adoption after a restart: the jobs the last daemon left, the workers its agents
still run (re-adopted, or stopped as nobody's), the adoption window, and holding idle nodes."""

from __future__ import annotations

from malletrain.daemon.base import DaemonBase, log
from malletrain.daemon.records import JobRun, job_of
from malletrain.jobspec import Launcher
from malletrain.logs import about


class Adoption(DaemonBase):
    """What a restarted daemon takes over, and the idle nodes it holds."""

    def _load_jobs(self, now: float) -> None:
        for rec in self.store.jobs():
            if rec.state.terminal or self._refused_trainer(rec.id, rec.spec):
                continue
            gen = self.store.generation(rec.id)
            run = JobRun(rec.id, rec.spec, rec.state, base_samples=rec.samples,
                         owner=(rec.owner_uid, rec.owner_gid))
            self.runs[rec.id] = run
            if gen:  # numbering never goes backwards: old workers may still run
                self.runtime_of(rec.id).resume_generation(rec.id, gen)
            if rec.spec.launcher is Launcher.TORCHRUN:  # its restart count goes on
                self.torchrun.resume_worlds(rec.id, self._worlds_published(rec.id))
            self._register(rec.id)
            run.last_progress = rec.samples
            if rec.state.active:
                run.adopted, run.left_on = True, tuple(rec.nodes)
                self._adopt_until = now + self.cfg.agent_dead_after + 1.0

    def _worlds_published(self, job_id: str) -> int:
        """How many non-empty member lists the daemons published for ``job_id`` (the event log)."""
        return sum(1 for ev in self.store.events("members") if ev.get("job") == job_id and ev.get("nodes"))

    def _adopt_workers(self, node: str, workers: tuple[str, ...]) -> None:
        for wid in workers:
            run = self.runs.get(job_of(wid))
            if run is not None and node in run.left_on and node not in run.workers:
                run.workers[node] = wid
                run.started.add(wid)
                self.store.log_event("adopt", run.id, node=node, worker=wid)
            elif run is None or run.workers.get(node) != wid:
                if run is None or wid not in run.leaving:
                    self.hub.stop_worker(node, wid, grace=1.0)  # a worker nobody owns

    def _adoption_complete(self) -> bool:
        """Every pilot the last daemon held has its agent back, and every job it ran has its workers
        back: adoption need not wait out ``agent_dead_after`` (that is for dead nodes, not restarts)."""
        held = self.scav.held()
        alive = self.hub.alive()
        # the last daemon's pilots too: one whose agent has not said hello yet is not in held(), and a
        # new pilot submitted for its node would fight the agent still running there
        if not held or any(node not in alive for node in set(held) | self.scav.last_daemons_nodes()):
            return False
        return all(node in run.workers for run in self.runs.values() for node in run.left_on)

    def _finish_adoption(self, now: float) -> None:
        """Each adopted job runs on the nodes the last daemon left it on whose workers came back (its
        trainer's ledger places it there); below its min it is suspended."""
        self._adopt_until = 0.0
        self._feed_ledgers(now)  # the usable nodes and the live jobs, to place the adopted ones on
        for run in self.runs.values():
            if not run.adopted:
                continue
            stopped = self._adopt_nodes(run, now)
            run.adopted, run.left_on = False, ()
            run.members, run.published = [], ()  # republish: the runtime may be new
            try:  # runtimes with daemon-side state (a Horovod driver) take the job over
                self.runtime_of(run.id).readopt(run.id, run.spec.command, {wid: node for node, wid in run.workers.items()})
            except (OSError, ValueError, RuntimeError) as exc:
                log.warning("runtime.readopt(%s): %s", run.id, exc, extra=about(job=run.id))
                self.store.log_event("readopt_error", run.id, error=str(exc))
            if stopped:
                self._suspend(run, now, "not re-adopted after a daemon restart")
                try:
                    self.runtime_of(run.id).forget(run.id)  # e.g. a driver the last daemon left running
                except Exception as exc:
                    log.warning("runtime.forget(%s): %s", run.id, exc, extra=about(job=run.id))
            self.store.log_event("readopted", run.id, nodes=list(self.nodes_of(run.id)))
        self._changed = True

    def _hold_idle_nodes(self) -> None:
        """A scavenger holds every idle node some trainer can use (pilots are preemptable: no cost to
        the main queue), never one the main scheduler planned for a pending job, and nothing while the
        last look is stale."""
        self.scav.hold_idle(self.clock(), wanted=lambda node: self.node_trainer(node) is not None)
