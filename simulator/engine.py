"""Discrete-event replay of an idle-node timeline with elastic training jobs.

Events (nodes become idle, nodes recalled, jobs arrive, jobs complete, the policy's wake-ups)
sit on a heap ordered by ``(time, priority, seq)``. All events at one timestamp are applied
together, then the policy decides once. The engine holds no rule of its own: admission,
profiling, lending, curves, costs and allocation are the daemon's :class:`policy.Policy`, fed
what a job monitor would have measured (:class:`simulator.monitor.SimJobMonitor`); which node is
ours since when, which job runs on which, interruptions and "below its min a job stops" are the
policy's :class:`policy.Ledger`, which the engine feeds with events and which builds the View.
What stays here is physics and ground truth: a job's progress is its TRUE throughput over time
minus rescale pauses; a recalled node leaves its job at once (the job pays its scale-down pause
and shrinks, or stops if the ledger says that left it below its min; the policy then puts it back
at the front of the queue). Records: :mod:`simulator.records`; summary: :mod:`simulator.summary`.

Costs: one calibration (:mod:`simulator.calibration`; starts and grows by :mod:`simulator.costs`'s warm
rule); without ``SimConfig.calibration`` the ``free`` ablation (the CLI charges the shipped file).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Callable, Iterator, Mapping

from curves import throughput_at
from policy import Decision, EventKind, JobView, Ledger, LedgerError, View
from simulator.calibration import free
from simulator.clock import EventQueue, Priority, SimClock
from simulator.costs import join_ready, start_ends, warm_began
from simulator.jobs import TORCHRUN
from simulator.monitor import SimJobMonitor
from simulator.policies import SimPolicy
from simulator.records import (QUEUE_VIEW_CAP, Arrival, Cancel, Completion, Decide, DecisionRow, End, PilotUp,
                               PolicyError, Joined, SimConfig, SimJob, SimJobState, SimResult, Wake, check_counts,
                               queue_window, remove_job)
from simulator.summary import DecisionStats, Tally, about_replay, replay_summary
from simulator.workload import JobSpec, Workload
from traces.model import EventBatch, IdleTimeline

__all__ = ("QUEUE_VIEW_CAP", "DecisionRow", "PolicyError", "SimConfig", "SimJob", "SimJobState", "SimResult", "Simulator")


class Simulator:
    """Replays ``timeline`` over ``[start, end]`` with ``workload`` under ``policy``."""

    def __init__(
        self,
        timeline: IdleTimeline,
        workload: Workload,
        policy: SimPolicy,
        config: SimConfig = SimConfig(),
        progress: Callable[[float], None] | None = None,
        seed: int = 0,
        keep_decisions: bool = False,
        monitor_factory: Callable[[str, JobSpec], SimJobMonitor] | None = None,
    ) -> None:
        self._monitor_factory = monitor_factory  # a test's scripted monitor instead of SimJobMonitor
        self.timeline = timeline
        self.workload = workload
        self.sim_policy = policy
        self.policy = policy.policy
        self.pcfg = policy.config
        self.config = config
        self.seed = seed
        self.start = timeline.start if config.start is None else float(config.start)
        self.end = timeline.end if config.end is None else float(config.end)
        if not self.start < self.end:
            raise ValueError(f"empty replay window: start {self.start} >= end {self.end}")
        self.clock = SimClock(self.start)
        self.events: EventQueue[object] = EventQueue()
        self._progress = progress
        self._free_pause = policy.free_rescales
        # the simulated monitor measures rates if the policy learns or profiles, costs if it reads them
        self._want_rates = self.pcfg.learn or self.pcfg.profiling.value != "never"
        self._want_costs = self.pcfg.rescale_costs.value == "measured" and self.pcfg.allocation.value == "milp"
        self.ledger = Ledger()  # what the driver observed (nodes, who runs where, work left): builds the View
        self.cal = config.calibration if config.calibration is not None else free()
        self._left: dict[str, float] = {}  # node -> when its last worker left it (its agent warms a new one)
        self.jobs: dict[str, SimJob] = {}
        self.admitted: list[SimJob] = []
        self._capacity: int | None = None  # absorb_capacity() of the admitted list (None: not known)
        self.queue: list[SimJob] = []  # submitted, not admitted (FCFS order is the policy's business)
        self._stream_done = False
        self._batches: Iterator[EventBatch] | None = None
        self._last_t = self.start  # accounting
        self.tally = Tally()
        self.rows: list[DecisionRow] = []
        self.decision_ms: list[float] = []
        self._dirty: set[str] = set()
        self._step_rescales = 0
        self._pending = False  # a change waits for a decision
        self._next_decision_at = -math.inf
        self._decide_scheduled = False
        self._wakes: set[float] = set()
        self._profiling: set[str] = set()
        self._keep = keep_decisions
        self.decisions: list[Decision] = []
        self.stats = DecisionStats()  # what the policy did (from its decisions)

    # ------------------------------------------------------------ main loop

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        cpu0 = time.process_time()
        self._prime()
        interval = self.config.min_interval_s
        while len(self.events):
            t = self.events.peek_time()
            assert t is not None
            self._integrate(t)
            self.clock.advance_to(t)
            changed, ended = self._apply_events_at(t)
            if ended:
                break
            self._pending |= changed
            if not self._pending:
                continue
            if t >= self._next_decision_at:
                self._advance_jobs(t)
                self._decide(t)
                self._pending = False
                self._next_decision_at = t + interval
            else:
                self._schedule_completions(t)  # jobs shrunk by a recall finish later
                if not self._decide_scheduled:
                    self.events.push(self._next_decision_at, Priority.DECIDE, Decide())
                    self._decide_scheduled = True
        self._integrate(self.end)
        self._advance_jobs(self.end)
        return self._result(time.perf_counter() - wall0, time.process_time() - cpu0)

    def _prime(self) -> None:
        initial = dict.fromkeys(sorted(self.timeline.initial_idle))
        batches = self.timeline.batches()
        pending: EventBatch | None = None
        for batch in batches:
            if batch.time > self.start:
                pending = batch
                break
            for node in batch.became_idle:
                initial[node] = None
            for node in batch.recalled:
                initial.pop(node, None)
        self._batches = batches
        first = EventBatch(self.start, tuple(initial), ())
        self.events.push(self.start, Priority.TRACE, first)
        if pending is not None and pending.time < self.end:
            self.events.push(pending.time, Priority.TRACE, pending)
        for spec in self.workload.timed:
            self.events.push(self.start + spec.arrival_s, Priority.ARRIVAL, Arrival(spec))
        self.events.push(self.end, Priority.END, End())

    def _apply_events_at(self, t: float) -> tuple[bool, bool]:
        changed = False
        while self.events.peek_time() == t:  # None once empty
            _, _, ev = self.events.pop()
            if isinstance(ev, EventBatch):
                self._apply_batch(ev)
                self._push_next_batch()
                changed = True
            elif isinstance(ev, Completion):
                changed |= self._complete(ev, t)
            elif isinstance(ev, Arrival):
                self.queue.append(self._new_job(ev.spec, t))
                changed = True
            elif isinstance(ev, Cancel):
                changed |= self._cancel(ev.job_id, t)
            elif isinstance(ev, PilotUp):
                changed |= self._pilots_up(ev)
            elif isinstance(ev, Joined):
                changed |= self._joined(self.jobs[ev.job_id], t)
            elif isinstance(ev, Decide):
                self._decide_scheduled = False
            elif isinstance(ev, Wake):
                self._wakes.discard(t)
                changed = True
            elif isinstance(ev, End):
                return changed, True
        return changed, False

    def _push_next_batch(self) -> None:
        batch = None if self._batches is None else next(self._batches, None)
        if batch is None or batch.time >= self.end:
            self._batches = None
            return
        self.events.push(batch.time, Priority.TRACE, batch)

    # ------------------------------------------------------------ accounting

    def _integrate(self, t: float) -> None:
        """Account ``[last, t)``, over which nothing changes (every change happens at an event time)."""
        last = self._last_t
        dt = t - last
        if dt > 0:
            ledger = self.ledger
            n_idle = ledger.n_idle
            held = ledger.n_usable
            used = held - ledger.n_free
            self.tally.idle_node_seconds += n_idle * dt
            self.tally.held_node_seconds += held * dt
            self.tally.used_node_seconds += used * dt
            capacity = self.absorb_capacity()
            k = 0 if n_idle <= capacity else 1
            self.tally.split_seconds[k] += dt
            self.tally.split_idle[k] += n_idle * dt
            self.tally.split_used[k] += used * dt
            self.tally.split_work[k] += self._work_between(last, t)
            self.tally.excess_node_seconds += max(0, n_idle - capacity) * dt
            self._last_t = t

    def absorb_capacity(self) -> int:
        """Nodes the admitted jobs could hold at once: the sum of their max nodes (kept: asked at every
        event; the admitted list changes only at decisions, completions, cancels)."""
        if self._capacity is None:
            self._capacity = sum(j.spec.max_nodes for j in self.admitted)
        return self._capacity

    def _work_between(self, t0: float, t1: float) -> float:
        """Model-neutral work (node-seconds at one node) the admitted jobs do over ``[t0, t1)``."""
        work = 0.0
        for job in self.admitted:  # at every event: max() spelled as conditionals (same values, no calls)
            rate = job.rate
            if rate > 0:  # a job on no nodes has rate 0
                r1 = job.one_node_rate
                if r1 > 0:
                    paused = job.paused_until
                    busy = t1 - (paused if paused > t0 else t0)
                    work += rate / r1 * (busy if busy > 0.0 else 0.0)
        return work

    def _advance_jobs(self, t: float) -> None:
        for job in self.admitted:
            self._advance(job, t)

    def _advance(self, job: SimJob, t: float) -> None:
        dt = t - job.last_update
        if dt <= 0:
            return
        n = self.ledger.count(job.id)
        if n:
            last, paused = job.last_update, job.paused_until
            work = t - (paused if paused > last else last)  # max(0.0, t - max(last, paused)), no calls
            if not work > 0.0:
                work = 0.0
            samples = job.rate * work
            job.commit(last, t, self.cal.commit_interval_s)
            job.progress = min(job.spec.samples, job.progress + samples)
            job.paused_seconds += dt - work
            job.paused_node_seconds += n * (dt - work) + len(job.joining) * work  # joining: idle nodes
            job.node_seconds += n * dt
            if job.id in self._profiling:
                job.profiling_node_seconds += n * dt
                job.profiling_paused_node_seconds += n * (dt - work)
                job.profiling_lost_samples += job.rate * (dt - work)
        job.last_update = t

    def _roll_back(self, job: SimJob) -> None:
        """A stop: the work since the last commit is lost (the job restarts from its checkpoint)."""
        if job.run_since is not None and job.progress > job.committed:
            lost = job.progress - job.committed
            job.lost_samples += lost
            job.progress = job.committed
            if job.one_node_rate > 0:  # the period split counts work as done: a rollback is charged to
                k = 0 if self.ledger.n_idle <= self.absorb_capacity() else 1  # the period it happens in
                self.tally.split_work[k] -= lost / job.one_node_rate
        job.run_since = None
        self.ledger.progressed(job.id, job.work_left)

    # ------------------------------------------------------------ events

    def _new_job(self, spec: JobSpec, t: float) -> SimJob:
        if self.sim_policy.submission is not None:
            spec = self.sim_policy.submission(spec)
        cap = self.config.max_nodes
        if cap is not None and spec.max_nodes > cap:
            spec = replace(spec, max_nodes=max(cap, spec.min_nodes))
        pause = self.cal.rescale_pause_s
        if spec.launcher == TORCHRUN and not self.cal.is_free:  # every change of size restarts its workers
            pause = self.cal.torchrun_restart_s if self.cal.torchrun_restart_s is not None else self.cal.restart_s
        if pause is not None and (spec.up_cost_s, spec.down_cost_s) != (pause, pause):
            spec = replace(spec, up_cost_s=pause, down_cost_s=pause)
        job = SimJob(id=f"j{len(self.jobs):05d}", spec=spec, submitted_at=t, order=len(self.jobs), last_update=t,
                     user_curve=self.sim_policy.user_curve(spec))
        if self._monitor_factory is not None:
            job.monitor = self._monitor_factory(job.id, spec)
        elif self._want_rates or self._want_costs:
            job.monitor = SimJobMonitor(job.id, spec.scaling, seed=self.seed, noise=self.config.record_noise,
                                        rel_ci=self.pcfg.profile_rel_ci, rates=self._want_rates,
                                        costs=self._want_costs)
        self.jobs[job.id] = job
        self.ledger.submitted(JobView(id=job.id, min_nodes=spec.min_nodes, max_nodes=spec.max_nodes, order=job.order,
                                      scaling=job.user_curve, profile=False, work_left=job.work_left))
        return job

    def _apply_batch(self, batch: EventBatch) -> None:
        ledger, t = self.ledger, batch.time
        delay = self.cal.pilot_start_s
        if delay > 0:
            submitted = ledger.idle(batch.became_idle, t)
            if submitted:
                self.events.push(t + delay, Priority.TRACE, PilotUp(submitted, t))
        else:
            ledger.usable(batch.became_idle, t)
        hit: set[str] = set()
        for node in batch.recalled:
            job_id = ledger.holder(node)
            if job_id is not None and job_id not in hit:
                self._advance(self.jobs[job_id], t)  # account the interval before the node leaves
                hit.add(job_id)
        for loss in ledger.lost(batch.recalled, t):
            self._recalled(self.jobs[loss.job], loss.stopped, loss.lost, t)

    def _pilots_up(self, ev: PilotUp) -> bool:
        """The pilots submitted at ``ev.since`` run: their nodes still idle since then become usable."""
        ledger = self.ledger
        up = [n for n in ev.nodes if ledger.idle_since(n) == ev.since and not ledger.is_usable(n)]
        return ledger.usable(up, ev.since) > 0

    def _recalled(self, job: SimJob, stopped: bool, lost: tuple[str, ...], t: float) -> None:
        """``lost`` left ``job`` without notice: pay the down pause and shrink (no pause if none had joined
        yet), or stop if that left it below its min (the ledger's rule; the policy re-queues it)."""
        if stopped:
            job.stopped()
            self._roll_back(job)
            self.tally.stops += 1
        elif not job.joining.issuperset(lost):
            self.tally.rescales += 1
            self._step_rescales += 1
            self._pause(job, t, job.spec.down_cost_s)
        self._changed(job, t)

    def _complete(self, ev: Completion, t: float) -> bool:
        job = self.jobs[ev.job_id]
        if job.version != ev.version or job.state is not SimJobState.ADMITTED:
            return False
        self._advance(job, t)
        job.progress = job.spec.samples
        job.finished_at = t
        job.state = SimJobState.DONE
        self._left.update(dict.fromkeys(self.ledger.nodes_of(job.id), t))
        self.ledger.ended(job.id)
        job.stopped()
        remove_job(self.admitted, job)
        self._capacity = None
        job.monitor = None
        job.history.append((t, job.progress, 0, job.paused_until))
        return True

    def cancel_at(self, t: float, job_id: str) -> None:
        """Cancel ``job_id`` at ``t`` (call before :meth:`run`; ids are ``j00000``, ``j00001``... in arrival order)."""
        self.events.push(t, Priority.ARRIVAL, Cancel(job_id))

    def _cancel(self, job_id: str, t: float) -> bool:
        job = self.jobs.get(job_id)
        if job is None or job.state not in (SimJobState.QUEUED, SimJobState.ADMITTED):
            return False
        if job.state is SimJobState.ADMITTED:
            self._advance(job, t)
            job.stopped()
            remove_job(self.admitted, job)
            self._capacity = None
        else:
            remove_job(self.queue, job)
        self._left.update(dict.fromkeys(self.ledger.nodes_of(job.id), t))
        self.ledger.ended(job.id)
        job.state = SimJobState.CANCELLED
        job.monitor = None
        return True

    def _pause(self, job: SimJob, t: float, cost: float) -> None:
        if not self._free_pause:
            job.paused_until = max(job.paused_until, t + cost)

    def _changed(self, job: SimJob, t: float) -> None:
        job.version += 1
        n = self.ledger.count(job.id)
        held = self.ledger.nodes_of(job.id)
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

    def _joined(self, job: SimJob, t: float) -> bool:
        """The workers on the nodes ``job`` grew onto are ready: they join, the job pays its up pause."""
        if t != job.join_at or not job.joining or job.state is not SimJobState.ADMITTED:
            return False  # a later grow moved the join, or the job lost those nodes or stopped
        self._advance(job, t)
        job.joining.clear()
        self._pause(job, t, job.spec.up_cost_s)
        self._changed(job, t)
        return True

    # ------------------------------------------------------------ decisions

    def _queue_window(self, t: float) -> list[SimJob]:
        """The queued jobs the policy is shown: enough to fill every slot (an endless stream is
        drawn from as needed, each job submitted when drawn)."""
        want = self.pcfg.max_running or 64
        while len(self.queue) < want and not self._stream_done:
            spec = self.workload.draw()
            if spec is None:
                self._stream_done = True
                break
            self.queue.append(self._new_job(spec, t))
        return queue_window(self.queue, want)

    def _view(self, t: float, queued: list[SimJob]) -> View:
        """The ledger's view of the admitted jobs and the queue's window (queued jobs made no progress)."""
        ledger = self.ledger
        for job in self.admitted:
            ledger.progressed(job.id, job.work_left)
        return ledger.view(t, [j.id for j in self.admitted] + [j.id for j in queued])

    def _decide(self, t: float) -> None:
        queued = self._queue_window(t)
        decision_ms = 0.0
        if self.admitted or queued:
            view = self._view(t, queued)
            t0 = time.perf_counter()
            evidence = {j.id: j.monitor.evidence(t) for j in self.admitted if j.monitor is not None}
            decision = self.policy.decide(view, evidence)
            decision_ms = (time.perf_counter() - t0) * 1000.0
            self.decision_ms.append(decision_ms)
            self.ledger.delivered(view)
            self.tally.solver_calls += decision.solved
            if self._keep:
                self.decisions.append(decision)
            self._apply_decision(decision, view, t)
            self._push_wakeups(decision, t)
        self._schedule_completions(t)
        n_idle = self.ledger.n_idle
        self.rows.append(DecisionRow(
            time=t,
            idle_nodes=n_idle,
            used_nodes=n_idle - self.ledger.n_free,
            running_jobs=sum(1 for j in self.admitted if self.ledger.count(j.id)),
            queued_jobs=len(self.queue),
            rescales=self._step_rescales,
            decision_ms=decision_ms,
            constrained=n_idle <= self.absorb_capacity(),
        ))
        self._step_rescales = 0
        if self._progress is not None:
            self._progress((t - self.start) / (self.end - self.start))

    def _push_wakeups(self, decision: Decision, t: float) -> None:
        times = [decision.wake_at] if decision.wake_at is not None else []
        for job_id in decision.watch:  # evidence the policy waits for arrives when the run's records do
            mon = self.jobs[job_id].monitor
            if mon is not None and mon.stable_at is not None:
                times.append(mon.stable_at)
        for w in times:
            if t < w < self.end and w not in self._wakes:
                self._wakes.add(w)
                self.events.push(w, Priority.DECIDE, Wake())

    def _apply_decision(self, decision: Decision, view: View, t: float) -> None:
        self._note_events(decision, t)
        admitted = set(decision.admitted)
        by_id = self.jobs
        for job in [j for j in self.admitted if j.id not in admitted]:  # lost its slot (preempted)
            self.ledger.placed(job.id, (), t)
            job.stopped()
            self._roll_back(job)
            job.state = SimJobState.QUEUED
            self._changed(job, t)  # its history and monitor record the stop
            self.queue.insert(0, job)
        for job_id in decision.admitted:
            job = by_id[job_id]
            if job.state is SimJobState.QUEUED:
                remove_job(self.queue, job)
                job.state = SimJobState.ADMITTED
                job.last_update = t
                if job.admitted_at is None:
                    job.admitted_at = t
        self.admitted = [by_id[j] for j in decision.admitted]
        self._capacity = None
        self._profiling = set(decision.profiling)
        self._apply_plan(decision.assignment, t)
        if self.pcfg.allocation.value == "milp" and decision.solved:
            self.stats.note_beliefs(view, decision, self.jobs, self.policy)

    def _note_events(self, decision: Decision, t: float) -> None:
        self.stats.note(decision, t)
        for ev in decision.events:
            if ev.kind is EventKind.PREEMPTED:
                self.jobs[ev.job].preemptions += 1
                self.tally.preemptions += 1

    def _apply_plan(self, assignment: Mapping[str, tuple[str, ...]], t: float) -> bool:
        """Apply a node map; True if any job's nodes changed."""
        name = self.sim_policy.name
        growing: list[tuple[SimJob, tuple[str, ...]]] = []
        changed = False
        ledger = self.ledger
        for job in list(self.admitted):
            new = tuple(assignment.get(job.id, ()))
            old = ledger.nodes_of(job.id)
            if len(new) == len(old) and (new == ledger.job(job.id).nodes or set(new) == set(old)):
                continue  # its nodes (sorted, as the policy saw them), or the same set
            check_counts(name, job, new)
            changed = True
            if len(new) > len(old):
                if not set(old) <= set(new):
                    raise PolicyError(f"policy {name}: job {job.id} would both gain and lose nodes")
                growing.append((job, new))
            elif not set(new) <= set(old):
                raise PolicyError(f"policy {name}: job {job.id} would both gain and lose nodes")
            else:
                self._shrink(job, new, t)
        for job, new in growing:
            self._grow(name, job, new, t)
        return changed

    def _shrink(self, job: SimJob, new: tuple[str, ...], t: float) -> None:
        self.ledger.placed(job.id, new, t)
        if new:
            self.tally.rescales += 1
            self._step_rescales += 1
            self._pause(job, t, job.spec.down_cost_s)
        else:
            self._roll_back(job)
            self.tally.stops += 1
        self._changed(job, t)

    def _grow(self, name: str, job: SimJob, new: tuple[str, ...], t: float) -> None:
        old = self.ledger.nodes_of(job.id)
        kept = set(old)
        added = tuple(node for node in new if node not in kept)
        try:  # the nodes it kept first, in its order, then the new ones
            self.ledger.placed(job.id, old + added, t)
        except LedgerError as exc:
            raise PolicyError(f"policy {name}: {exc}") from None
        started = not old
        if job.id in self._profiling:
            job.profiled = True
            job.profiling_scale_ups += 1
        self.tally.starts += started
        self.tally.rescales += not started
        self._step_rescales += not started
        warm = self._warm_began(added)
        ready = join_ready(self.cal, warm, t)
        if not started and (ready > t or job.joining):  # the others train on until every new worker is ready
            job.join_at = max(job.join_at if job.joining else t, ready)
            job.joining.update(added)
            self.events.push(job.join_at, Priority.TRACE, Joined(job.id))
        elif not started or self.config.charge_start:
            self._pause(job, t, job.spec.up_cost_s)
        if started:
            self._start(job, t, warm)
        self._changed(job, t)

    def _warm_began(self, nodes: tuple[str, ...]) -> list[float]:
        """When each node's agent began warming the worker a job gets there (:mod:`simulator.costs`)."""
        return [warm_began(s, self.cal.pilot_start_s, self._left.get(n)) for n in nodes
                if (s := self.ledger.idle_since(n)) is not None]

    def _start(self, job: SimJob, t: float, warm: list[float]) -> None:
        """A start from zero nodes (a restart from the last commit if it ran before), charged by the warm rule."""
        ends = start_ends(self.cal, t, warm, restart=job.runs > 0)
        self.tally.restarts += job.runs > 0
        self.tally.cold_starts += job.runs == 0
        job.runs += 1
        if ends > t:  # charged even for the oracle: free rescales, not free starts
            job.paused_until = max(job.paused_until, ends)
        self.tally.start_paused_node_seconds += self.ledger.count(job.id) * max(0.0, job.paused_until - t)
        job.run_since = max(t, job.paused_until)
        job.committed = job.progress

    def _schedule_completions(self, t: float) -> None:
        for job_id in sorted(self._dirty):  # a set of str: sorted, or ties depend on PYTHONHASHSEED
            job = self.jobs[job_id]
            if job.state is not SimJobState.ADMITTED or job.rate <= 0:  # rate 0: on no nodes
                continue
            remaining = job.spec.samples - job.progress
            done_at = max(t, job.paused_until) + remaining / job.rate
            self.events.push(done_at, Priority.COMPLETION, Completion(job.id, job.version))
        self._dirty.clear()

    # ------------------------------------------------------------ results

    def _result(self, wall: float, cpu: float) -> SimResult:
        jobs = list(self.jobs.values())
        cfg = self.pcfg
        about = about_replay(self.sim_policy.name, self.workload, self.timeline, self.start, self.end, cfg, self.cal)
        drained = self.workload.finite and self._stream_done and not self.queue and not self.admitted
        summary = replay_summary(about, self.tally, self.stats, jobs, start=self.start, end=self.end,
                                 finite=self.workload.finite, drained=drained, decisions=len(self.rows),
                                 decision_ms=self.decision_ms, wall=wall, cpu=cpu)
        return SimResult(summary, self.rows, jobs, self.start, self.end, self.decisions)
