"""Jobs and workers (act): make each job's workers match its nodes (its trainer's ledger). Start workers on new nodes
ahead of time, publish the member list once they are ready, stop workers of nodes a job lost, end
the jobs observe marked. Every action is idempotent (agents ignore duplicate starts and stops; a
member list is published only when it differs). Act is handed its plan (:class:`.state.Plan`) and
calls no other part of the daemon."""

from __future__ import annotations

import os
from typing import Callable

from malletrain.daemon.accounting import NodeAccounting
from malletrain.daemon.records import JOIN_BATCH_S, LEAVE_GRACE_S, START_RETRY_S, JobPhase, JobRun
from malletrain.daemon.state import JobTable, Plan, Runtimes, log
from malletrain.daemon.jobspec import JobSpec, JobState, Launcher
from malletrain.daemon.logs import about
from contract.workerenv import ENV_JOB_SECRET
from malletrain.daemon.metrics import Metrics
from malletrain.daemon.monitor import Monitor
from malletrain.daemon.scavenging import Scavenging
from contract.workerenv import ENV_WORKER_BATCH
from malletrain.daemon.store import Store, StoreError
from policy import below_min
from scavenger.hub import AgentHub


class Act:
    """A job's lifecycle as act carries it out."""

    def __init__(self, table: JobTable, hub: AgentHub, scav: Scavenging, store: Store, monitor: Monitor,
                 metrics: Metrics, runtimes: Runtimes, accounting: NodeAccounting,
                 job_secret: Callable[[str], str], clock: Callable[[], float],
                 member_env: Callable[[JobSpec], dict[str, str]] | None = None) -> None:
        self.table = table
        self.hub = hub
        self.scav = scav
        self.store = store
        self.monitor = monitor
        self.metrics = metrics
        self.runtimes = runtimes
        self.accounting = accounting
        self.job_secret = job_secret
        self.clock = clock
        self.member_env = member_env  # an array element's index, a trial's number and files
        self._worker_seq = 0

    def act(self, now: float, plan: Plan) -> bool:
        """Carry out ``plan`` (and the ends observe recorded); returns whether a job ended or was
        suspended (something to decide again for)."""
        changed = False
        runs = self.table.runs
        for run in list(runs.values()):
            if run.ending is not None:
                changed |= self.finish(run, *run.ending)
        self.scav.release(self.table.to_release)
        self.table.to_release.clear()
        for run in list(runs.values()):
            if run.state.terminal:
                continue
            nodes = plan.nodes.get(run.id, ())  # its trainer's ledger: usable nodes only, never below its min
            if run.members and (run.restart or set(nodes) != set(run.members)) and self._world_done(run):
                changed = True  # left as it is: the next observe ends it COMPLETED
                continue
            if not nodes:  # the decision gave it none, or the ledger's Loss suspended it (and says why)
                if run.members or run.workers or run.state.active:
                    why = run.suspended_by.describe() if run.suspended_by is not None else "no nodes in the policy's plan"
                    self.suspend(run, now, why)
                    changed = True
                continue
            if run.restart:  # observe found it stalled: its workers start again (from its checkpoint)
                self.restart(run, now)
                changed = True
                continue
            try:
                self._act_job(run, nodes, now, run.id in plan.profiling)
            except ValueError as exc:  # e.g. the runtime refuses the job's command or ids
                changed |= self.finish(run, JobState.FAILED, f"cannot run: {exc}")
            except Exception as exc:  # any other bad value of one job ends that job, never the loop
                log.exception("job %s: acting on it failed", run.id, extra=about(job=run.id))
                changed |= self.finish(run, JobState.FAILED, f"cannot run: {type(exc).__name__}: {exc}")
        for run in runs.values():
            for wid, (node, kill_at) in list(run.leaving.items()):
                if now >= kill_at:
                    self.hub.stop_worker(node, wid, grace=1.0)
                    run.kill_again_at(wid, node, now + 5.0)
        return changed

    def _world_done(self, run: JobRun) -> bool:
        """Whether every rank of the job's published world exited 0 since observe looked: act then leaves that
        world as it is (finished work must not run again), and observe ends the job COMPLETED at the next step."""
        try:
            done = self.runtimes.of(run.spec).finished(run.id)
        except Exception as exc:  # a runtime hiccup must not kill the loop: acted on as not done
            log.warning("runtime.finished(%s): %s", run.id, exc, extra=about(job=run.id))
            return False
        if done:
            self.store.log_event("world_done", run.id, reason=done)
            log.info("job %s: %s since it was observed: its world is left as it is", run.id, done,
                     extra=about(job=run.id))
        return bool(done)

    def _act_job(self, run: JobRun, nodes: tuple[str, ...], now: float, profiling: bool) -> None:
        if run.workers_since is None:
            run.workers_since = now  # its silence counts from here (policy.health)
        for node in nodes:
            if node not in run.workers:
                self._worker_seq += 1
                run.new_worker(node, f"{run.id}.{node}.{int(now * 1000) % 10**9}{self._worker_seq}")
            wid = run.workers[node]
            if wid not in run.started and now - run.start_sent.get(wid, -1e9) >= START_RETRY_S:
                runtime = self.runtimes.of(run.spec)
                uid, gid = self._run_as(run, runtime.COMMAND_BESIDE_DAEMON)
                slots = self.scav.slots_of(node, run.spec.workers_per_node)
                spec = runtime.launch_spec(run.id, run.spec.command, wid, node, slots=slots)
                env = dict(spec.env)
                env.update(run.spec.env)
                if run.spec.worker_batch is not None:
                    env[ENV_WORKER_BATCH] = str(run.spec.worker_batch)
                if self.member_env is not None:
                    env.update(self.member_env(run.spec))
                env[ENV_JOB_SECRET] = self.job_secret(run.id)  # after the user's env: not overridable
                self.hub.start_worker(node, wid, spec.argv, env, spec.cwd or run.spec.cwd, uid, gid,
                                      slots=spec.slots, umask=run.umask, starts_own_ranks=spec.starts_own_ranks)
                run.start_sent[wid] = now
        target = set(nodes)  # (list lookups: 64 x 64 a job, every step)
        for node in [n for n in run.workers if n not in target]:
            run.worker_leaves(node, now + LEAVE_GRACE_S)
        # a member whose worker changed (it died and another took its place) is joining again
        published_ids = set(run.published)
        kept = [n for n in run.members if n in target and run.workers.get(n) in published_ids]
        kept_set = set(kept)
        joining = [n for n in nodes if n not in kept_set]
        ready = [n for n in joining if self._ready(run, run.workers[n])]
        run.ready_at = {run.workers[n]: run.ready_at.get(run.workers[n], now) for n in ready}
        waited = now - min(run.ready_at.values(), default=now)
        # together once all are ready; into a running world, the ready ones alone once the first has
        # waited JOIN_BATCH_S (a job's first world still waits for all its workers)
        members = kept + ready if len(ready) == len(joining) or (kept and waited >= JOIN_BATCH_S) else kept
        if members and below_min(len(members), run.spec.min_nodes):
            members = []
        changed = members != run.members or tuple(run.workers[n] for n in members) != run.published
        if changed and (members or run.members):
            self.publish(run, members, now)
        want = JobState.PROFILING if profiling else JobState.RUNNING
        if run.members and set(run.members) == target:
            self.set_state(run, want, "placed")
        elif run.members:
            self.set_state(run, JobState.RESCALING, f"to {len(nodes)} nodes")

    @staticmethod
    def _run_as(run: JobRun, beside_daemon: bool = False) -> tuple[int | None, int | None]:
        """A root daemon runs each job as its owner, any other daemon as its own user (the only user whose jobs
        it takes); ``beside_daemon`` (Horovod's driver cannot switch users): a root daemon runs only root's jobs."""
        if os.geteuid() != 0:
            return None, None
        if run.owner[0] is None:  # a row of the old schema: never run as root by default
            raise ValueError("the job has no recorded owner (submitted before owners were stored); "
                             "a root daemon does not run it as root: resubmit it as its user")
        if beside_daemon and run.owner[0] != 0:
            raise ValueError(f"this runtime runs the job's command beside the daemon, as root; a root daemon runs "
                             f"only root's jobs with it (uid {run.owner[0]}: use a daemon of your own)")
        return run.owner

    def _ready(self, run: JobRun, wid: str) -> bool:
        if wid not in run.started:
            return False
        try:
            return bool(self.runtimes.of(run.spec).ready(run.id, wid))
        except Exception as exc:  # a runtime hiccup must not kill the loop
            log.warning("runtime.ready(%s, %s): %s", run.id, wid, exc, extra=about(job=run.id, worker=wid))
            return False

    def publish(self, run: JobRun, members: list[str], now: float) -> None:
        workers = [run.workers[n] for n in members]
        gen = self.runtimes.of(run.spec).set_members(run.id, workers)
        self.store.set_generation(run.id, gen)
        self.monitor.set_world(run.id, gen, len(members), workers)  # reports count at this size, not at what they claim
        if members and self.runtimes.default.restarted_from_scratch(run.id):
            self._progress_lost(run)
        self.store.log_event("members", run.id, generation=gen, nodes=members, before=run.members)
        if members and run.spec.launcher is Launcher.TORCHRUN:
            self.store.count_world(run.id)
        run.members = list(members)
        run.published = tuple(run.workers[n] for n in members)
        self.store.set_nodes(run.id, members)

    def _progress_lost(self, run: JobRun) -> None:
        """The job's new world trains from step 0 (its last worker died, no checkpoint): the samples
        counted so far no longer exist, so its count starts again (status and the target with it)."""
        stats = self.monitor.jobs.get(run.id)
        lost = run.counted_from_zero(stats.samples if stats is not None else 0)
        self.store.reset_samples(run.id, 0)
        self.store.log_event("progress_lost", run.id, samples=lost)
        log.warning("job %s: its new world starts from step 0 (no survivor, no checkpoint): %d samples "
                    "counted so far are gone", run.id, lost, extra=about(job=run.id))

    def suspend(self, run: JobRun, now: float, reason: str) -> None:
        self.stop_workers(run, now)
        if run.state.active:
            self.set_state(run, JobState.SUSPENDED, reason)

    def restart(self, run: JobRun, now: float) -> None:
        """Stop a stalled job's workers; the next step starts new ones on its nodes, and they resume from
        its last checkpoint (:mod:`policy.health`)."""
        restarts = run.stall_restarts + 1
        self.store.log_event("stall_restart", run.id, reason=run.restart, restarts=restarts)
        log.warning("job %s: %s; restarting its workers (restart %d)", run.id, run.restart, restarts,
                    extra=about(job=run.id))
        self.stop_workers(run, now)
        run.restarted()

    def stop_workers(self, run: JobRun, now: float) -> None:
        run.emptied_at = now
        run.workers_since = None
        if run.members:
            try:
                runtime = self.runtimes.of(run.spec)
                gen = runtime.set_members(run.id, [])  # members leave at their next commit ...
                self.store.set_generation(run.id, gen)
                runtime.forget(run.id)  # ... and workers started later wait for a new list
            except Exception as exc:
                log.warning("runtime.set_members(%s, []): %s", run.id, exc, extra=about(job=run.id))
            run.members = []
        run.published = ()
        for node, wid in run.all_workers_leave(now + 5.0):
            self.hub.stop_worker(node, wid, grace=2.0)
        self.store.set_nodes(run.id, [])

    def finish(self, run: JobRun, state: JobState, reason: str) -> bool:
        """End the job now (its workers stopped, its state stored); returns whether it was not ended yet."""
        if run.state.terminal:
            return False
        self.store.set_samples(run.id, run.last_progress)  # status shows what was trained, not the last 1-s sample
        if run.id in self.accounting.node_seconds:
            self.store.log_event("node_hours", run.id, used=round(self.accounting.used_node_hours(run.id), 6))
        self.stop_workers(run, self.clock())
        self.set_state(run, state, reason)
        self.monitor.forget(run.id, ended=True)  # its workers' last reports in flight are dropped quietly
        if not run.leaving:
            self.release(run)  # else once its workers have left (the loop drops the run then)
        return True

    def release(self, run: JobRun) -> None:
        """An ended job's runtime state goes (its checkpoint too) once its stopped workers have left: one stopped
        by a cancel still writes its checkpoint on the SIGTERM, which a runtime that forgot the job would refuse."""
        try:
            self.runtimes.of(run.spec).forget(run.id, keep_state=False)
        except Exception as exc:
            log.warning("runtime.forget(%s): %s", run.id, exc, extra=about(job=run.id))

    @staticmethod
    def unpublish(run: JobRun) -> None:
        """Forget the member list published for ``run`` (an adopted job's: the runtime may be new), so
        that the next step publishes it again."""
        run.members, run.published = [], ()

    def set_state(self, run: JobRun, state: JobState, reason: str) -> None:
        if run.state == state:
            return
        try:
            self.store.set_state(run.id, state, reason)
        except StoreError as exc:  # e.g. cancelled by the CLI a moment ago
            log.warning("%s", exc, extra=about(job=run.id))
            rec = self.store.get(run.id)
            if rec is not None:
                run.move(JobPhase(rec.state.value))
            return
        log.info("job %s: %s -> %s (%s)", run.id, run.state.value, state.value, reason, extra=about(job=run.id))
        self.metrics.observe_state(state)
        run.move(JobPhase(state.value))
