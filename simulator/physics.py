"""Job physics: what happens to a simulated job between and at events, as ground truth. A job's progress is its TRUE
throughput over time minus rescale pauses; a checkpoint is committed every ``commit_interval_s`` of a run (the job's
own, else the calibration's), and a stop loses what was trained since; so does a torchrun job's change of size, which
restarts every worker from the checkpoint. A recalled node leaves its job at once (the job pays its scale-down pause and
shrinks, or stops if the ledger's :class:`policy.Loss` says that left it below its min). A grow pays its up pause when
every new worker is ready (the warm rule of :mod:`simulator.costs`); a start from zero nodes pays the calibration's
start or restart. Which job runs on which node is the ledger's; this module moves the jobs on and tells the event loop
when each will finish."""

from __future__ import annotations

from curves import throughput_at
from policy import Ledger, LedgerError, Loss, LossOutcome, Stop
from simulator.calibration import Calibration
from simulator.clock import EventQueue, Priority
from simulator.costs import join_ready, start_ends, warm_began
from simulator.fleet import Fleet, remove_job
from simulator.jobs import TORCHRUN
from simulator.modelsizes import checkpoint_mb
from simulator.records import Completion, Joined, PolicyError, SimConfig, SimJob, SimJobState
from simulator.tallying import Tallying


class JobPhysics:
    """Moves the jobs of ``fleet`` on in time and carries out what happens to them."""

    def __init__(self, ledger: Ledger, fleet: Fleet, tallying: Tallying, cal: Calibration,
                 events: EventQueue[object], config: SimConfig, free_pause: bool) -> None:
        self._ledger = ledger
        self._fleet = fleet
        self._tallying = tallying
        self._tally = tallying.tally
        self._cal = cal
        self._events = events
        self._charge_start = config.charge_start
        self._free_pause = free_pause
        self._left: dict[str, float] = {}  # node -> when its last worker left it (its agent warms a new one)
        self._dirty: set[str] = set()  # jobs whose completion time moved
        self.profiling: set[str] = set()  # jobs whose profile runs (the last decision's)
        self.step_rescales = 0  # rescales since the last decision's row

    def advance_all(self, t: float) -> None:
        for job in self._fleet.admitted:
            self.advance(job, t)

    def advance(self, job: SimJob, t: float) -> None:
        dt = t - job.last_update
        if dt <= 0:
            return
        n = self._ledger.count(job.id)
        if n:
            last, paused = job.last_update, job.paused_until
            work = t - (paused if paused > last else last)
            if not work > 0.0:
                work = 0.0
            samples = job.rate * work
            job.commit(last, t, self._commit_interval(job))
            job.progress = min(job.spec.samples, job.progress + samples)
            job.paused_node_seconds += n * (dt - work) + len(job.joining) * work  # joining: idle nodes
            job.node_seconds += n * dt
            if job.id in self.profiling:
                job.profiling_node_seconds += n * dt
                job.profiling_paused_node_seconds += n * (dt - work)
                job.profiling_lost_samples += job.rate * (dt - work)
        job.last_update = t

    def schedule_completions(self, t: float) -> None:
        for job_id in sorted(self._dirty):  # a set of str: sorted, or ties depend on PYTHONHASHSEED
            job = self._fleet.jobs[job_id]
            if job.state is not SimJobState.ADMITTED or job.rate <= 0:  # rate 0: on no nodes
                continue
            remaining = job.spec.samples - job.progress
            done_at = max(t, job.paused_until) + remaining / job.rate
            self._events.push(done_at, Priority.COMPLETION, Completion(job.id, job.version))
        self._dirty.clear()

    def _commit_interval(self, job: SimJob) -> float:
        """Seconds between ``job``'s commits: its own if it declares one, else the calibration's (the free
        calibration: none lost)."""
        if self._cal.is_free or job.spec.commit_interval_s is None:
            return self._cal.commit_interval_s
        return job.spec.commit_interval_s

    def roll_back(self, job: SimJob) -> None:
        """A stop: the work since the last commit is lost (the job restarts from its checkpoint)."""
        self._lose_uncommitted(job)
        job.run_since = None
        self._ledger.progressed(job.id, job.work_left)

    def _lose_uncommitted(self, job: SimJob) -> None:
        if job.run_since is not None and job.progress > job.committed:
            lost = job.progress - job.committed
            job.lost_samples += lost
            job.progress = job.committed
            if job.one_node_rate > 0:  # the period split counts work as done: a rollback is charged to
                self._tally.split_work[self._tallying.period()] -= lost / job.one_node_rate  # its period

    def _resized(self, job: SimJob, t: float, cost: float) -> None:
        """A running job changes size: an in-process job pauses for ``cost``; a torchrun job's workers all
        restart (``cost``) from its last commit, losing what was trained since, and commit anew from then."""
        self.pause(job, t, cost)
        if job.spec.launcher != TORCHRUN or self._cal.is_free or self._free_pause or job.run_since is None:
            return
        self._lose_uncommitted(job)
        job.run_since = max(t, job.paused_until)
        job.committed = job.progress
        self._ledger.progressed(job.id, job.work_left)

    def complete(self, ev: Completion, t: float) -> bool:
        job = self._fleet.jobs[ev.job_id]
        if job.version != ev.version or job.state is not SimJobState.ADMITTED:
            return False
        self.advance(job, t)
        job.progress = job.spec.samples
        job.finished_at = t
        job.state = SimJobState.DONE
        self._ended(job, t)
        job.stopped()
        self._fleet.drop_admitted(job)
        job.monitor = None
        job.history.append((t, job.progress, 0, job.paused_until))
        return True

    def cancel(self, job_id: str, t: float) -> bool:
        job = self._fleet.jobs.get(job_id)
        if job is None or job.state not in (SimJobState.QUEUED, SimJobState.ADMITTED):
            return False
        self._leave(job, t)
        self._ended(job, t)
        job.state = SimJobState.CANCELLED
        job.monitor = None
        return True

    def stop(self, job: SimJob, why: Stop, t: float) -> bool:
        """The policy ends ``job`` (``Decision.stop``): its workers stop, its nodes are free, it never runs
        again. Returns whether it was live (queued or admitted) until now."""
        if job.state not in (SimJobState.QUEUED, SimJobState.ADMITTED):
            return False
        self._leave(job, t)
        self._ended(job, t)
        job.state = SimJobState.STOPPED
        job.stop = why
        job.monitor = None
        job.history.append((t, job.progress, 0, job.paused_until))
        return True

    def _leave(self, job: SimJob, t: float) -> None:
        """``job`` leaves its slot or the queue at ``t``."""
        if job.state is SimJobState.ADMITTED:
            self.advance(job, t)
            job.stopped()
            self._fleet.drop_admitted(job)
        else:
            remove_job(self._fleet.queue, job)

    def _ended(self, job: SimJob, t: float) -> None:
        """The ledger forgets ``job``; its nodes' agents begin warming a worker for the next job."""
        self._left.update(dict.fromkeys(self._ledger.nodes_of(job.id), t))
        self._ledger.ended(job.id)

    def lost_slot(self, job: SimJob, t: float) -> None:
        """The policy took ``job``'s slot (preempted or suspended): it stops and waits again, progress kept."""
        self._ledger.placed(job.id, (), t)
        job.stopped()
        self.roll_back(job)
        job.state = SimJobState.QUEUED
        self.changed(job, t)  # its history and monitor record the stop
        self._fleet.requeue(job)

    def recalled(self, job: SimJob, loss: Loss, t: float) -> None:
        """``loss.lost`` left ``job`` without notice; the ledger's ``loss.outcome`` says what follows:
        shrunk, it pays the down pause (none if none of those had joined yet); suspended below its
        min, it stops (the policy re-queues it)."""
        if loss.outcome is LossOutcome.SUSPENDED:
            job.stopped()
            self.roll_back(job)
            self._tally.stops += 1
        elif loss.outcome is LossOutcome.SHRUNK and not job.joining.issuperset(loss.lost):
            self._tally.rescales += 1
            self.step_rescales += 1
            self._resized(job, t, job.spec.down_cost_s)
        self.changed(job, t)

    def pause(self, job: SimJob, t: float, cost: float) -> None:
        if not self._free_pause:
            job.paused_until = max(job.paused_until, t + cost)

    def changed(self, job: SimJob, t: float) -> None:
        job.version += 1
        n = self._ledger.count(job.id)
        held = self._ledger.nodes_of(job.id)
        self._left.update(dict.fromkeys(set(job.held).difference(held), t))
        job.held = held
        if job.joining:  # nodes whose workers are still starting add nothing yet
            job.joining.intersection_update(held)
            n -= len(job.joining)
        job.rate = throughput_at(job.spec.scaling, n)
        job.history.append((t, job.progress, n, job.paused_until))
        if job.monitor is not None:
            job.monitor.change(t, job.last_n, n, max(t, job.paused_until))
        job.last_n = n
        self._dirty.add(job.id)

    def joined(self, job: SimJob, t: float) -> bool:
        """The workers on the nodes ``job`` grew onto are ready: they join, the job pays its up pause."""
        if t != job.join_at or not job.joining or job.state is not SimJobState.ADMITTED:
            return False  # a later grow moved the join, or the job lost those nodes or stopped
        self.advance(job, t)
        job.joining.clear()
        self._resized(job, t, job.spec.up_cost_s)
        self.changed(job, t)
        return True

    def shrink(self, job: SimJob, new: tuple[str, ...], t: float) -> None:
        self._ledger.placed(job.id, new, t)
        if new:
            self._tally.rescales += 1
            self.step_rescales += 1
            self._resized(job, t, job.spec.down_cost_s)
        else:
            self.roll_back(job)
            self._tally.stops += 1
        self.changed(job, t)

    def grow(self, name: str, job: SimJob, new: tuple[str, ...], t: float) -> None:
        ledger = self._ledger
        old = ledger.nodes_of(job.id)
        kept = set(old)
        added = tuple(node for node in new if node not in kept)
        try:  # the nodes it kept first, in its order, then the new ones
            ledger.placed(job.id, old + added, t)
        except LedgerError as exc:
            raise PolicyError(f"policy {name}: {exc}") from None
        started = not old
        if job.id in self.profiling:
            job.profiled = True
            job.profiling_scale_ups += 1
        self._tally.starts += started
        self._tally.rescales += not started
        self.step_rescales += not started
        warm = self._warm_began(added)
        ready = join_ready(self._cal, warm, t)
        if not started and (ready > t or job.joining):  # the others train on until every new worker is ready
            job.join_at = max(job.join_at if job.joining else t, ready)
            job.joining.update(added)
            self._events.push(job.join_at, Priority.TRACE, Joined(job.id))
        elif not started:
            self._resized(job, t, job.spec.up_cost_s)
        elif self._charge_start:
            self.pause(job, t, job.spec.up_cost_s)
        if started:
            self._start(job, t, warm)
        self.changed(job, t)

    def _warm_began(self, nodes: tuple[str, ...]) -> list[float]:
        """When each node's agent began warming the worker a job gets there (:mod:`simulator.costs`)."""
        return [warm_began(s, self._cal.pilot_start_s, self._left.get(n)) for n in nodes
                if (s := self._ledger.idle_since(n)) is not None]

    def _start(self, job: SimJob, t: float, warm: list[float]) -> None:
        """A start from zero nodes (a restart from the last commit if it ran before), charged by the warm rule."""
        load = self._cal.load_s(checkpoint_mb(job.spec.model))  # its own checkpoint, if it restarts
        ends = start_ends(self._cal, t, warm, restart=job.runs > 0, load_s=load)
        self._tally.restarts += job.runs > 0
        self._tally.cold_starts += job.runs == 0
        job.runs += 1
        if ends > t:  # charged even for the oracle: free rescales, not free starts
            job.paused_until = max(job.paused_until, ends)
        self._tally.start_paused_node_seconds += self._ledger.count(job.id) * max(0.0, job.paused_until - t)
        job.run_since = max(t, job.paused_until)
        job.committed = job.progress

