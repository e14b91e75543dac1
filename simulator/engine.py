"""Discrete-event replay of an idle-node timeline with elastic training jobs.

Events (nodes become idle, nodes recalled, jobs arrive, jobs complete, the policy's wake-ups)
sit on a heap ordered by ``(time, priority, seq)``. All events at one timestamp are applied
together, then the policy decides once. The engine holds no rule of its own: admission,
profiling, lending, curves, costs and allocation are the daemon's :class:`policy.Policy`, fed
what a job monitor would have measured (:class:`simulator.monitor.SimJobMonitor`). What stays
here is physics and ground truth: a job's progress is its TRUE throughput over time minus
rescale pauses; a recalled node leaves its job at once (the job pays its scale-down pause and
shrinks; below its min it cannot run and stops; the policy then puts it back at the front of the
queue).

Costs come from one calibration (:mod:`simulator.calibration`, ``SimConfig.calibration``): a node
that goes idle is usable only once its pilot runs (``pilot_start_s``); a job's first start holds its
nodes idle for ``cold_start_s``, a start after any stop for ``restart_s``, and a stop loses the work
since the job's last checkpoint commit (every ``commit_interval_s`` of running); rescales pause for
``rescale_pause_s``. The engine's default is the ``free`` ablation (none of these; the jobs' own
rescale pauses) when ``SimConfig.calibration`` is None; :func:`simulator.simulate` and the CLI
charge the shipped calibration unless told otherwise.
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import islice
from typing import Callable, Iterator, Mapping

from allocator import throughput_at
from policy import Decision, EventKind, JobEvidence, JobView, View
from simulator.calibration import Calibration, free
from simulator.clock import EventQueue, Priority, SimClock
from simulator.monitor import SimJobMonitor
from simulator.policies import SimPolicy
from simulator.workload import JobSpec, Workload
from traces.model import EventBatch, IdleTimeline


class PolicyError(RuntimeError):
    """A plan that breaks the simulator's rules; the message names policy, job and node."""


QUEUE_VIEW_CAP = 1000  # queued jobs shown to the policy at most (FCFS needs only the head)


class SimJobState(enum.Enum):
    """A simulated job's state (the daemon's jobs have their own, :class:`malletrain.jobspec.JobState`)."""

    QUEUED = "queued"  # waiting for a slot (FCFS)
    ADMITTED = "admitted"  # holds one of the Pjmax slots; may hold 0 nodes
    DONE = "done"  # trained all its samples
    CANCELLED = "cancelled"  # cancelled by its user (queued or admitted)


@dataclass
class SimJob:
    id: str
    spec: JobSpec
    submitted_at: float
    order: int = 0  # submission order (FCFS)
    state: SimJobState = SimJobState.QUEUED
    nodes: list[str] = field(default_factory=list)
    progress: float = 0.0
    paused_until: float = -math.inf
    last_update: float = 0.0
    rate: float = 0.0  # true samples/s at len(nodes)
    version: int = 0  # bumped on every change; stale completion events are ignored
    finished_at: float | None = None
    admitted_at: float | None = None  # first admission
    last_interrupted: float | None = None
    preemptions: int = 0
    rescales: int = 0
    paused_seconds: float = 0.0  # time it held nodes but made no progress
    runs: int = 0  # starts from zero nodes (the first is a cold start, the others restarts)
    run_since: float | None = None  # its current run's checkpoint clock starts here (None: not running)
    committed: float = 0.0  # progress at its last checkpoint commit
    lost_samples: float = 0.0  # progress rolled back to the last commit at stops
    paused_node_seconds: float = 0.0
    node_seconds: float = 0.0
    user_curve: Mapping[int, float] | None = None  # what the user told the policy (ground truth's doing)
    monitor: SimJobMonitor | None = None
    last_n: int = 0  # node count at the last change (for the monitor)
    # profiling accounting: every node-second the job holds while its profile runs, the part of it
    # lost to rescale pauses, the samples those pauses cost, and the scale-ups it went through while
    # profiling (inverse order: exactly 1)
    profiled: bool = False
    profiling_node_seconds: float = 0.0
    profiling_paused_node_seconds: float = 0.0
    profiling_lost_samples: float = 0.0
    profiling_scale_ups: int = 0
    # (time, samples done, nodes held from then on, paused until) at every change
    history: list[tuple[float, float, int, float]] = field(default_factory=list)

    # the view the policy was last shown and what it was built from (see _job_view)
    view_cache: tuple[tuple, JobView] | None = field(default=None, repr=False, compare=False)

    @cached_property
    def one_node_rate(self) -> float:
        """The job's true rate at one node (linear through the origin below its first point)."""
        return throughput_at(self.spec.scaling, 1)


@dataclass(frozen=True)
class Completion:
    job_id: str
    version: int


@dataclass(frozen=True)
class Arrival:
    spec: JobSpec


@dataclass(frozen=True)
class Cancel:
    """The user cancels ``job_id`` (queued or admitted): it leaves with its nodes (:meth:`Simulator.cancel_at`)."""

    job_id: str


@dataclass(frozen=True)
class PilotUp:
    """The pilots of ``nodes``, submitted when those nodes went idle at ``since``, run now."""

    nodes: tuple[str, ...]
    since: float


@dataclass(frozen=True)
class Decide:
    """A deferred decision (``min_interval_s`` > 0)."""


@dataclass(frozen=True)
class End:
    pass


@dataclass(frozen=True)
class Wake:
    """A time a policy asked to decide again at (``Policy.wakeups``), e.g. a profiling step's end."""


@dataclass(frozen=True)
class SimConfig:
    """The replay's own settings (the policy's knobs are in :class:`policy.PolicyConfig`)."""

    start: float | None = None  # replay window (defaults: the trace's span)
    end: float | None = None
    # The allocator's cost model charges nothing for starting a job from zero
    # nodes; the simulator follows it unless told to charge the up cost.
    charge_start: bool = False
    # Ask the policy at most once per this many seconds (0: at every timestamp with
    # a change). Node changes still apply at their exact time: a recalled node
    # leaves its job at once; new idle nodes wait in the pool for the next decision.
    min_interval_s: float = 0.0
    # step times of the simulated monitor's records vary by this fraction (uniform)
    record_noise: float = 0.03
    # cap every job's max_nodes at this many nodes (None: the workload's own, 64 for the streams);
    # the evaluation's sweep replays each stream at 16 and 64
    max_nodes: int | None = None
    # what starts, restarts, pilots, rollbacks and rescales cost (simulator.calibration); the engine's
    # default is the free ablation, simulate() and the CLI pass the shipped calibration
    calibration: Calibration | None = None  # None: free here; simulate() makes it the shipped default

    def __post_init__(self) -> None:
        if self.max_nodes is not None and self.max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {self.max_nodes}")
        if not (self.min_interval_s >= 0) or math.isinf(self.min_interval_s):
            raise ValueError(f"min_interval_s must be a finite number >= 0 s, got {self.min_interval_s}")
        if not 0.0 <= self.record_noise < 1.0:
            raise ValueError(f"record_noise must be in [0, 1), got {self.record_noise}")


@dataclass(frozen=True)
class DecisionRow:
    """One line of events.csv: the state right after a decision."""

    time: float
    idle_nodes: int
    used_nodes: int
    running_jobs: int
    queued_jobs: int
    rescales: int
    decision_ms: float
    # the idle pool is at most what the admitted jobs can absorb at their max nodes
    constrained: bool = True


@dataclass
class SimResult:
    summary: dict
    rows: list[DecisionRow]
    jobs: list[SimJob]
    start: float
    end: float
    decisions: list[Decision] = field(default_factory=list)  # kept only with ``keep_decisions``


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
        # what the simulated monitor measures: rates when the policy learns or profiles, costs when
        # the policy reads measured costs
        self._want_rates = self.pcfg.learn or self.pcfg.profiling.value != "never"
        self._want_costs = self.pcfg.rescale_costs.value == "measured" and self.pcfg.allocation.value == "milp"
        # node state: ordered dicts used as sets so iteration order is deterministic
        self.idle: dict[str, None] = {}
        self._idle_since: dict[str, float] = {}  # node valuation (policy View.idle_since)
        self._ended_fragments: list[float] = []  # idle fragments ended since the last decision
        # idle nodes no job holds -> when each became idle (its _idle_since), so the policy's
        # View.idle_since of the free nodes is a copy of this dict, not a lookup per node
        self.free: dict[str, float] = {}
        # idle nodes whose pilot is starting -> when it was submitted (not usable yet)
        self.starting: dict[str, float] = {}
        self.cal = config.calibration if config.calibration is not None else free()
        self.owner: dict[str, SimJob] = {}
        self.jobs: dict[str, SimJob] = {}
        self.admitted: list[SimJob] = []
        self._capacity: int | None = None  # absorb_capacity() of the admitted list (None: not known)
        self.queue: list[SimJob] = []  # submitted, not admitted (FCFS order is the policy's business)
        self._stream_done = False
        self._batches: Iterator[EventBatch] | None = None
        # accounting
        self._last_t = self.start
        self.idle_node_seconds = 0.0
        self.used_node_seconds = 0.0
        self.held_node_seconds = 0.0  # idle nodes a running pilot holds (used or free)
        self.cold_starts = 0
        self.restarts = 0
        self.start_paused_node_seconds = 0.0  # node-seconds held while (re)starting
        # per-interval split: [constrained, unconstrained] (unconstrained = the idle pool exceeds the
        # admitted jobs' summed max nodes, so no allocation could use every idle node)
        self.split_seconds = [0.0, 0.0]
        self.split_idle = [0.0, 0.0]
        self.split_used = [0.0, 0.0]
        self.split_work = [0.0, 0.0]
        self.excess_node_seconds = 0.0  # idle node-seconds above what the admitted jobs could absorb
        self.rescales = 0
        self.starts = 0
        self.stops = 0
        self.preemptions = 0
        self.rows: list[DecisionRow] = []
        self.decision_ms: list[float] = []
        self.solver_calls = 0
        self._dirty: set[str] = set()
        self._step_rescales = 0
        self._pending = False  # a change waits for a decision
        self._next_decision_at = -math.inf
        self._decide_scheduled = False
        self._wakes: set[float] = set()
        self._profiling: set[str] = set()
        self._keep = keep_decisions
        self.decisions: list[Decision] = []
        # statistics of what the policy did (from its decisions' events)
        self._profile_started: dict[str, float] = {}
        self.profile_seconds: list[float] = []
        self.profile_counts: list[int] = []
        self.profile_waits: set[str] = set()
        self.event_counts: dict[str, int] = {}
        self.lent_nodes = 0
        self.returned_nodes = 0
        self.capped_steps = 0
        self._belief_errors: dict[tuple[str, int], float] = {}

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
            elif isinstance(ev, Decide):
                self._decide_scheduled = False
            elif isinstance(ev, Wake):
                self._wakes.discard(t)
                changed = True
            elif isinstance(ev, End):
                return changed, True
        return changed, False

    def _push_next_batch(self) -> None:
        if self._batches is None:
            return
        batch = next(self._batches, None)
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
            n_idle = len(self.idle)
            held = n_idle - len(self.starting)
            used = held - len(self.free)
            self.idle_node_seconds += n_idle * dt
            self.held_node_seconds += held * dt
            self.used_node_seconds += used * dt
            capacity = self.absorb_capacity()
            k = 0 if n_idle <= capacity else 1
            self.split_seconds[k] += dt
            self.split_idle[k] += n_idle * dt
            self.split_used[k] += used * dt
            self.split_work[k] += self._work_between(last, t)
            self.excess_node_seconds += max(0, n_idle - capacity) * dt
            self._last_t = t

    def absorb_capacity(self) -> int:
        """Nodes the admitted jobs could hold at once: the sum of their max nodes."""
        # asked at every event; the admitted list changes only at decisions, completions, cancels
        if self._capacity is None:
            self._capacity = sum(j.spec.max_nodes for j in self.admitted)
        return self._capacity

    def _work_between(self, t0: float, t1: float) -> float:
        """Model-neutral work (node-seconds at one node) the admitted jobs do over ``[t0, t1)``."""
        work = 0.0
        for job in self.admitted:  # at every event: max() spelled as conditionals (same values, no calls)
            rate = job.rate
            if rate > 0 and job.nodes:
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
        n = len(job.nodes)
        if n:
            last, paused = job.last_update, job.paused_until
            work = t - (paused if paused > last else last)  # max(0.0, t - max(last, paused)), no calls
            if not work > 0.0:
                work = 0.0
            samples = job.rate * work
            self._commit(job, last, t)
            job.progress = min(job.spec.samples, job.progress + samples)
            job.paused_seconds += dt - work
            job.paused_node_seconds += n * (dt - work)
            job.node_seconds += n * dt
            if job.id in self._profiling:
                job.profiling_node_seconds += n * dt
                job.profiling_paused_node_seconds += n * (dt - work)
                job.profiling_lost_samples += job.rate * (dt - work)
        job.last_update = t

    def _commit(self, job: SimJob, last: float, t: float) -> None:
        """Set ``job.committed`` to its progress at its last checkpoint commit in ``(last, t]`` (commits
        come every ``commit_interval_s`` after its run started; 0: every step, nothing is ever lost).
        Called before its progress over ``[last, t)`` is added; its rate is constant over it."""
        interval = self.cal.commit_interval_s
        since = job.run_since
        if since is None:
            return
        if interval <= 0:
            job.committed = min(job.spec.samples, job.progress + job.rate * max(0.0, t - max(last, job.paused_until)))
            return
        k = math.floor((t - since) / interval)
        tc = since + k * interval
        if k >= 1 and tc > last:
            job.committed = min(job.spec.samples,
                                job.progress + job.rate * max(0.0, tc - max(last, job.paused_until)))

    def _roll_back(self, job: SimJob) -> None:
        """A stop: the work since the last commit is lost (the job restarts from its checkpoint)."""
        if job.run_since is not None and job.progress > job.committed:
            lost = job.progress - job.committed
            job.lost_samples += lost
            job.progress = job.committed
            if job.one_node_rate > 0:  # the period split counts work as done: a rollback is charged to
                k = 0 if len(self.idle) <= self.absorb_capacity() else 1  # the period it happens in
                self.split_work[k] -= lost / job.one_node_rate
        job.run_since = None

    # ------------------------------------------------------------ events

    def _new_job(self, spec: JobSpec, t: float) -> SimJob:
        if self.sim_policy.submission is not None:
            spec = self.sim_policy.submission(spec)
        cap = self.config.max_nodes
        if cap is not None and spec.max_nodes > cap:
            spec = replace(spec, max_nodes=max(cap, spec.min_nodes))
        pause = self.cal.rescale_pause_s
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
        return job

    def _apply_batch(self, batch: EventBatch) -> None:
        idle, free = self.idle, self.free
        delay = self.cal.pilot_start_s
        submitted: list[str] = []
        for node in batch.became_idle:
            if node not in idle:
                idle[node] = None
                self._idle_since[node] = batch.time
                if delay > 0:
                    self.starting[node] = batch.time
                    submitted.append(node)
                else:
                    free[node] = batch.time
        if submitted:
            self.events.push(batch.time + delay, Priority.TRACE, PilotUp(tuple(submitted), batch.time))
        hit: dict[str, SimJob] = {}
        for node in batch.recalled:
            if node not in idle:
                continue
            del idle[node]
            self._ended_fragments.append(batch.time - self._idle_since.pop(node, batch.time))
            if node in free:
                del free[node]
                continue
            if node in self.starting:  # recalled before its pilot ran
                del self.starting[node]
                continue
            job = self.owner.pop(node)
            if job.id not in hit:
                self._advance(job, batch.time)  # account the interval before the node leaves
                hit[job.id] = job
            job.nodes.remove(node)
        for job in hit.values():
            self._recalled(job, batch.time)

    def _pilots_up(self, ev: PilotUp) -> bool:
        """The pilots submitted at ``ev.since`` run: their nodes still idle since then become usable."""
        up = False
        for node in ev.nodes:
            if self.starting.get(node) == ev.since:
                del self.starting[node]
                self.free[node] = self._idle_since[node]
                up = True
        return up

    def _recalled(self, job: SimJob, t: float) -> None:
        """Nodes left ``job`` without notice: pay the down pause and shrink, or stop below its min."""
        job.last_interrupted = t
        if len(job.nodes) < job.spec.min_nodes:
            self._release_all(job)  # it cannot run below its min; the policy re-queues it
            self._roll_back(job)
            self.stops += 1
        else:
            self.rescales += 1
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
        self._release_all(job)
        _remove(self.admitted, job)
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
            self._release_all(job)
            _remove(self.admitted, job)
            self._capacity = None
        else:
            _remove(self.queue, job)
        job.state = SimJobState.CANCELLED
        job.monitor = None
        return True

    def _release_all(self, job: SimJob) -> None:
        for node in job.nodes:
            del self.owner[node]
            self.free[node] = self._idle_since[node]
        job.nodes = []
        job.rate = 0.0
        job.version += 1

    def _pause(self, job: SimJob, t: float, cost: float) -> None:
        if not self._free_pause:
            job.paused_until = max(job.paused_until, t + cost)

    def _changed(self, job: SimJob, t: float) -> None:
        job.version += 1
        n = len(job.nodes)
        job.rate = throughput_at(job.spec.scaling, n)
        job.history.append((t, job.progress, n, job.paused_until))
        if job.monitor is not None:
            job.monitor.change(t, job.last_n, n, max(t, job.paused_until))
        job.last_n = n
        self._dirty.add(job.id)

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
        # the policy sees every submitted job, as the daemon's does (its waiting reasons included), up
        # to QUEUE_VIEW_CAP: a job file with thousands of arrivals at once would cost that much per decision
        return self.queue[: max(QUEUE_VIEW_CAP, want + sum(1 for j in self.queue if j.admitted_at is not None))]

    def _view(self, t: float, queued: list[SimJob]) -> View:
        shown = self.admitted + queued
        room = sum(j.spec.max_nodes - len(j.nodes) for j in shown)
        n_free = len(self.free)
        if room >= n_free:
            free, since = tuple(self.free), dict(self.free)
        else:
            free = tuple(islice(self.free, room))
            since = {n: self.free[n] for n in free}
        ended, self._ended_fragments = tuple(self._ended_fragments), []
        return View(now=t, free_nodes=free, n_free=n_free, jobs=tuple(map(_job_view, shown)),
                    idle_since=since, ended_fragments=ended)

    def _evidence(self, t: float) -> dict[str, JobEvidence]:
        return {j.id: j.monitor.evidence(t) for j in self.admitted if j.monitor is not None}

    def _decide(self, t: float) -> None:
        queued = self._queue_window(t)
        decision_ms = 0.0
        if self.admitted or queued:
            view = self._view(t, queued)
            t0 = time.perf_counter()
            decision = self.policy.decide(view, self._evidence(t))
            decision_ms = (time.perf_counter() - t0) * 1000.0
            self.decision_ms.append(decision_ms)
            self.solver_calls += decision.solved
            if self._keep:
                self.decisions.append(decision)
            self._apply_decision(decision, view, t)
            self._push_wakeups(decision, t)
        self._schedule_completions(t)
        n_idle = len(self.idle)
        self.rows.append(DecisionRow(
            time=t,
            idle_nodes=n_idle,
            used_nodes=n_idle - len(self.free),
            running_jobs=sum(1 for j in self.admitted if j.nodes),
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
            self._release_all(job)
            self._roll_back(job)
            job.state = SimJobState.QUEUED
            self._changed(job, t)  # its history and monitor record the stop
            self.queue.insert(0, job)
        for job_id in decision.admitted:
            job = by_id[job_id]
            if job.state is SimJobState.QUEUED:
                _remove(self.queue, job)
                job.state = SimJobState.ADMITTED
                job.last_update = t
                if job.admitted_at is None:
                    job.admitted_at = t
        self.admitted = [by_id[j] for j in decision.admitted]
        self._capacity = None
        self._profiling = set(decision.profiling)
        self._apply_plan(decision.assignment, t)
        self._note_beliefs(view, decision)

    def _note_events(self, decision: Decision, t: float) -> None:
        counts = self.event_counts
        for ev in decision.events:
            counts[ev.kind.value] = counts.get(ev.kind.value, 0) + 1
            if ev.kind is EventKind.PREEMPTED:
                self.jobs[ev.job].preemptions += 1
                self.preemptions += 1
            elif ev.kind is EventKind.PROFILE_START:
                self._profile_started[ev.job] = t
            elif ev.kind in (EventKind.PROFILE_DONE, EventKind.PROFILE_ABORTED):
                started = self._profile_started.pop(ev.job, t)
                self.profile_seconds.append(t - started)
                self.profile_counts.append(len(ev.detail.get("measured", {})))  # type: ignore[arg-type]
                self.capped_steps += len(ev.detail.get("capped", ()))  # type: ignore[arg-type]
            elif ev.kind is EventKind.LENT:
                self.lent_nodes += int(ev.detail.get("nodes", 0))  # type: ignore[arg-type]
            elif ev.kind is EventKind.RETURNED:
                self.returned_nodes += int(ev.detail.get("nodes", 0))  # type: ignore[arg-type]
        for job_id, reason in decision.waiting.items():
            if reason.startswith("waiting to be profiled"):
                self.profile_waits.add(job_id)

    def _note_beliefs(self, view: View, decision: Decision) -> None:
        """scalability_error_pct: |believed - true| / true at every (job, count) the allocator chose,
        with the belief the policy held when it first chose that count."""
        if self.pcfg.allocation.value != "milp" or not decision.solved:
            return
        views: dict[str, JobView] | None = None  # made when a count is new (rarely, after the first decisions)
        for job_id, nodes in decision.assignment.items():
            n = len(nodes)
            key = (job_id, n)
            if n <= 0 or key in self._belief_errors or job_id in decision.profiling:
                continue
            if views is None:
                views = {j.id: j for j in view.jobs}
            if job_id not in views:
                continue
            true = throughput_at(self.jobs[job_id].spec.scaling, n)
            believed = throughput_at(self.policy.believed_curve(views[job_id]), n)
            self._belief_errors[key] = abs(believed - true) / true * 100.0 if true > 0 else 0.0

    def _apply_plan(self, assignment: Mapping[str, tuple[str, ...]], t: float) -> bool:
        """Apply a node map; True if any job's nodes changed."""
        name = self.sim_policy.name
        growing: list[tuple[SimJob, tuple[str, ...]]] = []
        changed = False
        for job in list(self.admitted):
            new = tuple(assignment.get(job.id, ()))
            old = job.nodes
            if len(new) == len(old):
                seen = job.view_cache  # its nodes sorted, as the policy saw them (same version: same nodes)
                if (seen is not None and seen[0][0] == job.version and new == seen[1].nodes) or set(new) == set(old):
                    continue
            self._check_counts(name, job, new)
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

    @staticmethod
    def _check_counts(name: str, job: SimJob, new: tuple[str, ...]) -> None:
        n = len(new)
        if len(set(new)) != n:
            raise PolicyError(f"policy {name}: job {job.id} is given a node twice")
        if n and not (job.spec.min_nodes <= n <= job.spec.max_nodes):
            raise PolicyError(
                f"policy {name}: job {job.id} given {n} nodes, outside "
                f"{job.spec.min_nodes}..{job.spec.max_nodes}"
            )

    def _shrink(self, job: SimJob, new: tuple[str, ...], t: float) -> None:
        keep = set(new)
        for node in job.nodes:
            if node not in keep:
                del self.owner[node]
                self.free[node] = self._idle_since[node]
        job.nodes = list(new)
        job.last_interrupted = t
        if new:
            self.rescales += 1
            self._step_rescales += 1
            self._pause(job, t, job.spec.down_cost_s)
        else:
            self._roll_back(job)
            self.stops += 1
        self._changed(job, t)

    def _grow(self, name: str, job: SimJob, new: tuple[str, ...], t: float) -> None:
        have = set(job.nodes)
        extra = [node for node in new if node not in have]
        for node in extra:
            if node not in self.free:
                holder = self.owner.get(node)
                why = f"held by job {holder.id}" if holder else "not a held idle node"
                raise PolicyError(f"policy {name}: job {job.id} given node {node!r}, {why}")
        for node in extra:
            del self.free[node]
            self.owner[node] = job
        started = not job.nodes
        job.nodes = list(job.nodes) + extra
        if job.id in self._profiling:
            job.profiled = True
            job.profiling_scale_ups += 1
        if started:
            self.starts += 1
        else:
            self.rescales += 1
            self._step_rescales += 1
        job.last_interrupted = t
        if not started or self.config.charge_start:
            self._pause(job, t, job.spec.up_cost_s)
        if started:
            self._start(job, t)
        self._changed(job, t)

    def _start(self, job: SimJob, t: float) -> None:
        """A start from zero nodes: a cold start the first time, a restart (from the last commit) after."""
        cost = self.cal.restart_s if job.runs else self.cal.cold_start_s
        if job.runs:
            self.restarts += 1
        else:
            self.cold_starts += 1
        job.runs += 1
        if cost > 0:  # charged even for the oracle: free rescales, not free starts
            job.paused_until = max(job.paused_until, t + cost)
        self.start_paused_node_seconds += len(job.nodes) * max(0.0, job.paused_until - t)
        job.run_since = max(t, job.paused_until)
        job.committed = job.progress

    def _schedule_completions(self, t: float) -> None:
        for job_id in sorted(self._dirty):  # a set of str: sorted, or ties depend on PYTHONHASHSEED
            job = self.jobs[job_id]
            if job.state is not SimJobState.ADMITTED or not job.nodes or job.rate <= 0:
                continue
            remaining = job.spec.samples - job.progress
            done_at = max(t, job.paused_until) + remaining / job.rate
            self.events.push(done_at, Priority.COMPLETION, Completion(job.id, job.version))
        self._dirty.clear()

    # ------------------------------------------------------------ results

    def _result(self, wall: float, cpu: float) -> SimResult:
        jobs = list(self.jobs.values())
        completed = [j for j in jobs if j.state is SimJobState.DONE]
        makespan = None
        if self.workload.finite and self._stream_done and not self.queue and not self.admitted:
            if all(j.finished_at is not None for j in jobs) and completed:
                makespan = max(j.finished_at for j in completed) - self.start  # type: ignore[type-var]
        ms = sorted(self.decision_ms)
        idle = self.idle_node_seconds
        paused = sum(j.paused_node_seconds for j in jobs)
        productive = self.used_node_seconds - paused
        cfg = self.pcfg
        summary = {
            "policy": self.sim_policy.name,
            "workload": self.workload.name,
            "scaling_source": self.workload.scaling_source,
            "synthetic_scaling": self.workload.synthetic,
            "trace": self.timeline.source,
            "nodes_total": len(self.timeline.nodes),
            "start": self.start,
            "end": self.end,
            "span_seconds": self.end - self.start,
            "horizon_s": cfg.tfwd_s,
            # what ran (issue 18: presets never silently win over an override)
            "admission": cfg.admission.value,
            "max_running": cfg.max_running,
            "admission_cap": cfg.admission_cap,
            "objective": cfg.objective.value,
            "calibration": self.cal.name,
            "calibration_values": self.cal.as_dict(),
            "policy_config": cfg.as_dict(),
            "idle_node_seconds": idle,
            "used_node_seconds": self.used_node_seconds,
            "used_fraction": self.used_node_seconds / idle if idle > 0 else 0.0,
            "held_node_seconds": self.held_node_seconds,
            "held_fraction": self.held_node_seconds / idle if idle > 0 else 0.0,
            "paused_node_seconds": paused,
            "productive_node_seconds": productive,
            "trained_node_seconds": productive,  # held by a job and not paused (the real replay's "trained")
            "productive_fraction": productive / idle if idle > 0 else 0.0,
            "samples_processed": sum(j.progress for j in jobs),
            # model-neutral work: each job's samples over its own 1-node rate (node-seconds at 1 node)
            "work_node_seconds": sum(j.progress / j.one_node_rate for j in jobs if j.one_node_rate > 0),
            "lost_work_node_seconds": sum(j.lost_samples / j.one_node_rate for j in jobs if j.one_node_rate > 0),
            "cold_starts": self.cold_starts,
            "restarts": self.restarts,
            "start_paused_node_seconds": self.start_paused_node_seconds,
            "jobs_submitted": len(jobs),
            "jobs_completed": len(completed),
            "makespan_seconds": makespan,
            "rescales": self.rescales,
            "starts": self.starts,
            "stops": self.stops,
            "preemptions": self.preemptions,
            "decisions": len(self.rows),
            "policy_calls": len(self.decision_ms),
            "solver_calls": self.solver_calls,
            "decision_ms_p50": _percentile(ms, 0.50),
            "decision_ms_p99": _percentile(ms, 0.99),
            "wall_seconds": wall,
            "cpu_seconds": cpu,
        }
        summary.update(_bound_summary(jobs, idle, summary["work_node_seconds"], self.workload.finite))
        summary.update(_profiling_summary(jobs, self.used_node_seconds))
        summary.update(self._split_summary())
        summary.update(_completion_summary(jobs, self.end))
        errs = self._belief_errors
        n = len(self.profile_seconds)
        summary.update({
            "scalability_error_pct": sum(errs.values()) / len(errs) if errs else None,
            "profiles_done": self.event_counts.get("profile_done", 0),
            "profiles_aborted": self.event_counts.get("profile_aborted", 0),
            "profile_waits": len(self.profile_waits),
            "profile_seconds_mean": sum(self.profile_seconds) / n if n else None,
            "profile_counts_mean": sum(self.profile_counts) / n if n else None,
            "profile_capped_steps": self.capped_steps,
            "profile_lent_nodes": self.lent_nodes,
            "profile_returned_nodes": self.returned_nodes,
            "refinements": self.event_counts.get("refined", 0),
        })
        return SimResult(summary, self.rows, jobs, self.start, self.end, self.decisions)


    def _split_summary(self) -> dict:
        """Constrained / unconstrained periods apart (see :meth:`_integrate`)."""
        out: dict[str, float] = {}
        for k, part in enumerate(("constrained", "unconstrained")):
            out[f"{part}_seconds"] = self.split_seconds[k]
            out[f"idle_node_seconds_{part}"] = self.split_idle[k]
            out[f"used_node_seconds_{part}"] = self.split_used[k]
            out[f"work_node_seconds_{part}"] = self.split_work[k]
        idle = self.idle_node_seconds
        out["excess_idle_node_seconds"] = self.excess_node_seconds
        out["excess_idle_fraction"] = self.excess_node_seconds / idle if idle > 0 else 0.0
        return out


def _completion_summary(jobs: list[SimJob], end: float) -> dict:
    """Job completion times (submission to finish, completed jobs) and waits (submission to first
    nodes; a job that never ran waits until the end of the replay), and who waits: the mean wait of
    the quarter of jobs with the lowest 1-node rate (the slowest models) against the fastest quarter,
    and the model whose jobs wait longest on average."""
    jct = sorted(j.finished_at - j.submitted_at for j in jobs if j.finished_at is not None)
    waits = [(j.one_node_rate, _wait(j, end), j.spec.model) for j in jobs]
    by_rate = sorted(waits, key=lambda w: w[0])
    q = max(1, len(by_rate) // 4) if by_rate else 0
    per_model: dict[str, list[float]] = {}
    for _, w, model in waits:
        per_model.setdefault(model, []).append(w)
    starved = max(per_model.items(), key=lambda kv: (sum(kv[1]) / len(kv[1]), kv[0]), default=None)
    wait_values = sorted(w for _, w, _ in waits)
    return {
        "jct_mean_seconds": sum(jct) / len(jct) if jct else None,
        "jct_p95_seconds": _percentile(jct, 0.95) if jct else None,
        "wait_mean_seconds": sum(wait_values) / len(wait_values) if wait_values else None,
        "wait_p95_seconds": _percentile(wait_values, 0.95) if wait_values else None,
        "wait_slowest_quarter_seconds": sum(w for _, w, _ in by_rate[:q]) / q if q else None,
        "wait_fastest_quarter_seconds": sum(w for _, w, _ in by_rate[-q:]) / q if q else None,
        "wait_by_model_seconds": {m: sum(ws) / len(ws) for m, ws in sorted(per_model.items())},
        "longest_waiting_model": starved[0] if starved else None,
        "longest_waiting_model_seconds": sum(starved[1]) / len(starved[1]) if starved else None,
    }


def _bound_summary(jobs: list[SimJob], idle: float, work: float, finite: bool) -> dict:
    """The work no policy can exceed: min(offered work, idle node-seconds x the best work per node-second
    any job's curve reaches), and this run's gap to it. An endless stream's offered work is unbounded
    (a saturation case): the bound is then the idle term alone."""
    offered = sum(j.spec.samples / j.one_node_rate for j in jobs if j.one_node_rate > 0)
    eff = max((_best_efficiency(j) for j in jobs), default=0.0)
    bound = min(offered, idle * eff) if finite else idle * eff
    return {
        "offered_work_node_seconds": offered if finite else None,
        "work_share_of_offered": work / offered if finite and offered > 0 else None,
        "best_efficiency": eff,
        "bound_work_node_seconds": bound,
        "gap_to_bound_pct": 100.0 * (1.0 - work / bound) if bound > 0 else None,
    }


def _best_efficiency(job: SimJob) -> float:
    """max over the job's curve points up to its max, and its max, of rate(n) / (n rate(1)): rate(n) / n
    of a piecewise-linear curve (through the origin below its first point) peaks at one of them."""
    r1 = job.one_node_rate
    if r1 <= 0:
        return 0.0
    top = job.spec.max_nodes  # the rate at its max too: it may lie between two points
    pts = [(n, v) for n, v in job.spec.scaling.items() if n <= top] + [(top, throughput_at(job.spec.scaling, top))]
    return max(v / (n * r1) for n, v in pts)


def _wait(job: SimJob, end: float) -> float:
    for t, _, n, _ in job.history:
        if n > 0:
            return t - job.submitted_at
    return end - job.submitted_at


def _profiling_summary(jobs: list[SimJob], used_node_seconds: float) -> dict:
    """Profiling accounting over the jobs that profiled (zeros for a policy that never profiles)."""
    profiled = [j for j in jobs if j.profiled]
    node_s = sum(j.profiling_node_seconds for j in profiled)
    ups = [j.profiling_scale_ups for j in profiled]
    return {
        "profiled_jobs": len(profiled),
        "profiling_node_seconds": node_s,
        "profiling_paused_node_seconds": sum(j.profiling_paused_node_seconds for j in profiled),
        "profiling_lost_samples": sum(j.profiling_lost_samples for j in profiled),
        "profiling_fraction": node_s / used_node_seconds if used_node_seconds > 0 else 0.0,
        "profiling_scale_ups": sum(ups),
        "profiling_scale_ups_max_per_job": max(ups, default=0),
        "profiling_scale_ups_min_per_job": min(ups, default=0),
    }


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


def _remove(jobs: list[SimJob], job: SimJob) -> None:
    """``jobs.remove(job)``, by identity: list.remove compares ``job`` with each job before it, and
    SimJob's dataclass ``==`` compares every field."""
    for i, other in enumerate(jobs):
        if other is job:
            del jobs[i]
            return
    raise ValueError(f"job {job.id} is not in the list")


def _job_view(job: SimJob) -> JobView:
    """The job as the policy sees it, nodes in canonical order; rebuilt only when the job changed
    (a queued job's view is the same decision after decision)."""
    spec = job.spec
    key = (job.version, len(job.nodes), job.last_interrupted, job.progress)
    hit = job.view_cache
    if hit is not None and hit[0] == key:
        return hit[1]
    work_left = spec.samples - job.progress
    if not work_left > 0.0:  # max(0.0, ...) without its call: every running job, every decision
        work_left = 0.0
    if hit is not None and hit[0][:3] == key[:3]:
        view = _progressed(hit[1], work_left)  # a running job: only its progress moved
    else:
        # the nodes change only with the version: the same sorted tuple while they do not
        nodes = hit[1].nodes if hit is not None and hit[0][:2] == key[:2] else tuple(sorted(job.nodes))
        view = JobView(
            id=job.id,
            min_nodes=spec.min_nodes,
            max_nodes=spec.max_nodes,
            nodes=nodes,
            order=job.order,
            last_interrupted=job.last_interrupted,
            scaling=job.user_curve,
            profile=False,
            work_left=work_left,
        )
    job.view_cache = (key, view)
    return view


def _progressed(view: JobView, work_left: float) -> JobView:
    """``view`` with ``work_left`` in place of its own (every running job's view changes so at every
    decision)."""
    return replace(view, work_left=work_left)
