"""The driver of the policy: what the simulator does at a decision, as the daemon does at its own. It shows the policy
the ledger's view (every admitted job and the queued jobs the policy's rule shows, :mod:`policy.queueview`) with each
job's samples left and node-hours used, the recalls known in advance (``SimConfig.recall_notice_s``) and what the
simulated monitor measured; then it carries the decision out: stopped jobs end, jobs that lost their slot wait again,
shrinks and grows go to :class:`simulator.physics.JobPhysics`, wake-ups go on the event heap. It holds no rule of its
own about which job runs where."""

from __future__ import annotations

import time
from typing import Callable, Mapping

from policy import Decision, EventKind, Ledger, View
from policy.queueview import shown_queue
from simulator.clock import EventQueue, Priority
from simulator.fleet import Fleet, remove_job
from simulator.physics import JobPhysics
from simulator.policies import SimPolicy
from simulator.records import DecisionRow, PolicyError, SimConfig, SimJob, SimJobState, Wake, check_counts
from simulator.summary import DecisionStats
from simulator.tallying import Tallying
from simulator.workload import Workload
from traces.model import IdleTimeline

ENDLESS_WANT = 64  # queued jobs drawn ahead from an endless stream when the policy has no Pjmax


class PolicyDriver:
    """Asks the policy at each decision and carries its decision out."""

    def __init__(self, sim_policy: SimPolicy, ledger: Ledger, fleet: Fleet, physics: JobPhysics,
                 tallying: Tallying, events: EventQueue[object], workload: Workload, timeline: IdleTimeline,
                 config: SimConfig, end: float, keep_decisions: bool) -> None:
        self.sim_policy = sim_policy
        self.policy = sim_policy.policy
        self._pcfg = sim_policy.config
        self._ledger = ledger
        self._fleet = fleet
        self._physics = physics
        self._tallying = tallying
        self._events = events
        self._workload = workload
        self._timeline = timeline
        self._notice_s = config.recall_notice_s
        self._end = end
        self._keep = keep_decisions
        self.stream_done = False
        self.rows: list[DecisionRow] = []
        self.decision_ms: list[float] = []
        self.decisions: list[Decision] = []
        self.stats = DecisionStats()  # what the policy did (from its decisions)
        self._wakes: set[float] = set()

    def woken(self, t: float) -> None:
        """The wake-up the policy asked for at ``t`` came."""
        self._wakes.discard(t)

    def decide(self, t: float, progress: Callable[[], None] | None = None) -> None:
        """One decision at ``t``: ask the policy, carry its decision out, record its row."""
        fleet, ledger = self._fleet, self._ledger
        queued = self._queue_window(t)
        decision_ms = 0.0
        if fleet.admitted or queued:
            view = self._view(t, queued)
            t0 = time.perf_counter()
            evidence = {j.id: j.monitor.evidence(t) for j in fleet.admitted if j.monitor is not None}
            decision = self.policy.decide(view, evidence)
            decision_ms = (time.perf_counter() - t0) * 1000.0
            self.decision_ms.append(decision_ms)
            ledger.delivered(view)
            self._tallying.tally.solver_calls += decision.solved
            if self._keep:
                self.decisions.append(decision)
            self._apply_decision(decision, view, t)
            self._push_wakeups(decision, t)
        self._physics.schedule_completions(t)
        n_idle = ledger.n_idle
        self.rows.append(DecisionRow(
            time=t, idle_nodes=n_idle, used_nodes=n_idle - ledger.n_free,
            running_jobs=sum(1 for j in fleet.admitted if ledger.count(j.id)), queued_jobs=len(fleet.queue),
            rescales=self._physics.step_rescales, decision_ms=decision_ms,
            constrained=n_idle <= fleet.absorb_capacity(),
        ))
        self._physics.step_rescales = 0

    def _queue_window(self, t: float) -> list[SimJob]:
        """The queued jobs the policy is shown (:func:`policy.queueview.shown_queue`), an endless stream
        drawn from as needed to fill every slot (each job submitted when drawn)."""
        fleet = self._fleet
        want = self._pcfg.max_running or ENDLESS_WANT
        while len(fleet.queue) < want and not self.stream_done:
            spec = self._workload.draw()
            if spec is None:
                self.stream_done = True
                break
            fleet.queue.append(fleet.submit(spec, t))
        return shown_queue(fleet.queue, self.policy.state.queue_front, want, id_of=lambda j: j.id)

    def _view(self, t: float, queued: list[SimJob]) -> View:
        """The ledger's view of the admitted jobs and the queue's window (queued jobs made no progress)."""
        ledger = self._ledger
        for job in self._fleet.admitted:
            ledger.progressed(job.id, job.work_left)
            ledger.used(job.id, job.node_seconds / 3600.0)  # what a budget is counted in, as the daemon does
        if self._notice_s > 0:
            ledger.recall_expected(self._recalls_known(t))
        return ledger.view(t, [j.id for j in self._fleet.admitted] + [j.id for j in queued])

    def _recalls_known(self, t: float) -> dict[str, float]:
        """The trace's recalls in ``(t, t + recall_notice_s]``: each node's first, as a scheduler knows them."""
        tl = self._timeline
        lo, hi = tl.times.searchsorted([t, t + self._notice_s], side="right")
        known: dict[str, float] = {}
        for i in range(int(lo), int(hi)):
            if not tl.idle[i]:
                known.setdefault(tl.nodes[int(tl.node_ids[i])], float(tl.times[i]))
        return known

    def _push_wakeups(self, decision: Decision, t: float) -> None:
        times = [decision.wake_at] if decision.wake_at is not None else []
        for job_id in decision.watch:  # evidence the policy waits for arrives when the run's records do
            mon = self._fleet.jobs[job_id].monitor
            if mon is not None and mon.stable_at is not None:
                times.append(mon.stable_at)
        for w in times:
            if t < w < self._end and w not in self._wakes:
                self._wakes.add(w)
                self._events.push(w, Priority.DECIDE, Wake())

    def _apply_decision(self, decision: Decision, view: View, t: float) -> None:
        fleet, physics = self._fleet, self._physics
        self._note_events(decision, t)
        stopped = self._tallying.tally.policy_stops
        for job_id, why in decision.stop.items():  # ended by the policy (budget, deadline), as the daemon does
            if physics.stop(fleet.jobs[job_id], why, t):
                stopped[why.reason] = stopped.get(why.reason, 0) + 1
        admitted = set(decision.admitted)
        by_id = fleet.jobs
        for job in [j for j in fleet.admitted if j.id not in admitted]:  # lost its slot (preempted, suspended)
            physics.lost_slot(job, t)
        for job_id in decision.admitted:
            job = by_id[job_id]
            if job.state is SimJobState.QUEUED:
                remove_job(fleet.queue, job)
                job.state = SimJobState.ADMITTED
                job.last_update = t
                if job.admitted_at is None:
                    job.admitted_at = t
        fleet.admit([by_id[j] for j in decision.admitted])
        physics.profiling = set(decision.profiling)
        self._apply_plan(decision.assignment, t)
        if self._pcfg.allocation.value == "milp" and decision.solved:
            self.stats.note_beliefs(view, decision, fleet.jobs, self.policy)

    def _note_events(self, decision: Decision, t: float) -> None:
        self.stats.note(decision, t)
        tally = self._tallying.tally
        for ev in decision.events:
            if ev.kind is EventKind.PREEMPTED:
                self._fleet.jobs[ev.job].preemptions += 1
                tally.preemptions += 1

    def _apply_plan(self, assignment: Mapping[str, tuple[str, ...]], t: float) -> None:
        """Carry out a node map: every shrink first, then every grow (a node moving between jobs is free
        when it is taken)."""
        name = self.sim_policy.name
        growing: list[tuple[SimJob, tuple[str, ...]]] = []
        ledger, physics = self._ledger, self._physics
        for job in list(self._fleet.admitted):
            new = tuple(assignment.get(job.id, ()))
            old = ledger.nodes_of(job.id)
            if len(new) == len(old) and (new == ledger.job(job.id).nodes or set(new) == set(old)):
                continue  # its nodes (sorted, as the policy saw them), or the same set
            check_counts(name, job, new)
            if len(new) > len(old):
                if not set(old) <= set(new):
                    raise PolicyError(f"policy {name}: job {job.id} would both gain and lose nodes")
                growing.append((job, new))
            elif not set(new) <= set(old):
                raise PolicyError(f"policy {name}: job {job.id} would both gain and lose nodes")
            else:
                physics.shrink(job, new, t)
        for job, new in growing:
            physics.grow(name, job, new, t)
