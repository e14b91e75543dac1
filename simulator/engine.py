"""Discrete-event replay of an idle-node timeline with elastic training jobs.

Events (nodes become idle, nodes recalled, jobs arrive, jobs complete) sit on a
heap ordered by ``(time, priority, seq)``. All events at one timestamp are
applied together, then the policy decides once. A job's progress is its TRUE
throughput over time minus rescale pauses; a recalled node leaves its job at
once (the job pays its scale-down pause and shrinks; below its min it stops and
returns to the front of the queue, keeping its progress).
"""

from __future__ import annotations

import enum
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

from allocator import Plan, throughput_at
from simulator.clock import EventQueue, Priority, SimClock
from simulator.policies import JobView, Policy, SimView
from simulator.workload import JobSpec, Workload
from traces.model import EventBatch, IdleTimeline


class PolicyError(RuntimeError):
    """A plan that breaks the simulator's rules; the message names policy, job and node."""


class JobState(enum.Enum):
    QUEUED = "queued"  # waiting for a slot (FCFS)
    ADMITTED = "admitted"  # holds one of the Pjmax slots; may hold 0 nodes
    DONE = "done"  # trained all its samples


@dataclass
class SimJob:
    id: str
    spec: JobSpec
    submitted_at: float
    state: JobState = JobState.QUEUED
    nodes: list[str] = field(default_factory=list)
    progress: float = 0.0
    paused_until: float = -math.inf
    last_update: float = 0.0
    rate: float = 0.0  # true samples/s at len(nodes)
    version: int = 0  # bumped on every change; stale completion events are ignored
    finished_at: float | None = None
    last_interrupted: float | None = None
    preemptions: int = 0
    rescales: int = 0
    paused_seconds: float = 0.0  # time it held nodes but made no progress
    paused_node_seconds: float = 0.0
    node_seconds: float = 0.0
    # profiling accounting (a policy with ``is_profiling``): every node-second the job holds
    # while its profile runs, the part of it lost to rescale pauses, the samples those pauses
    # cost, and the scale-ups it went through while profiling (inverse order: exactly 1)
    profiled: bool = False
    profiling_node_seconds: float = 0.0
    profiling_paused_node_seconds: float = 0.0
    profiling_lost_samples: float = 0.0
    profiling_scale_ups: int = 0
    # (time, samples done, nodes held from then on, paused until) at every change
    history: list[tuple[float, float, int, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Completion:
    job_id: str
    version: int


@dataclass(frozen=True)
class Arrival:
    spec: JobSpec


@dataclass(frozen=True)
class Decide:
    """A deferred decision (``min_interval_s`` > 0)."""


@dataclass(frozen=True)
class End:
    pass


@dataclass(frozen=True)
class Wake:
    """A time a policy asked to decide again at (``Policy.wakeups``), e.g. a profiling step's end."""


# Tfwd, the horizon over which the allocator weighs a rescale's pause against
# its gain. Decisions on the Summit week come every ~46 s on average, and an
# allocation usually outlives a few of them (most events touch a few nodes).
# Replaying that week with the NAS stream and Pjmax 10, 120 s trained the most
# samples of 30/60/120/300/900 s (232.2/234.1/234.6/234.2/232.7 G samples).
DEFAULT_TFWD_S = 120.0


@dataclass(frozen=True)
class SimConfig:
    max_running: int = 10  # Pjmax
    horizon_s: float = DEFAULT_TFWD_S  # Tfwd given to the allocator
    start: float | None = None  # replay window (defaults: the trace's span)
    end: float | None = None
    # The allocator's cost model charges nothing for starting a job from zero
    # nodes; the simulator follows it unless told to charge the up cost.
    charge_start: bool = False
    # Ask the policy at most once per this many seconds (0: at every timestamp with
    # a change). Node changes still apply at their exact time: a recalled node
    # leaves its job at once; new idle nodes wait in the pool for the next decision.
    min_interval_s: float = 0.0

    def __post_init__(self) -> None:
        if self.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {self.max_running}")
        if not (self.horizon_s > 0):
            raise ValueError(f"horizon (Tfwd) must be > 0 s, got {self.horizon_s}")
        if not (self.min_interval_s >= 0):
            raise ValueError(f"min_interval_s must be >= 0 s, got {self.min_interval_s}")


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


@dataclass
class SimResult:
    summary: dict
    rows: list[DecisionRow]
    jobs: list[SimJob]
    start: float
    end: float


class Simulator:
    """Replays ``timeline`` over ``[start, end]`` with ``workload`` under ``policy``."""

    def __init__(
        self,
        timeline: IdleTimeline,
        workload: Workload,
        policy: Policy,
        config: SimConfig = SimConfig(),
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.timeline = timeline
        self.workload = workload
        self.policy = policy
        self.config = config
        self.start = timeline.start if config.start is None else float(config.start)
        self.end = timeline.end if config.end is None else float(config.end)
        if not self.start < self.end:
            raise ValueError(f"empty replay window: start {self.start} >= end {self.end}")
        self.clock = SimClock(self.start)
        self.events: EventQueue[object] = EventQueue()
        self._progress = progress
        self._free_pause = bool(getattr(policy, "free_rescales", False))
        # node state: ordered dicts used as sets so iteration order is deterministic
        self.idle: dict[str, None] = {}
        self.free: dict[str, None] = {}
        self.owner: dict[str, SimJob] = {}
        self.jobs: dict[str, SimJob] = {}
        self.admitted: list[SimJob] = []
        self.queue: deque[SimJob] = deque()
        self._stream_done = False
        self._batches: Iterator[EventBatch] | None = None
        # accounting
        self._last_t = self.start
        self.idle_node_seconds = 0.0
        self.used_node_seconds = 0.0
        self.rescales = 0
        self.starts = 0
        self.stops = 0
        self.preemptions = 0
        self.rows: list[DecisionRow] = []
        self.decision_ms: list[float] = []
        self._dirty: set[str] = set()
        self._step_rescales = 0
        # a policy that says it is stateless (its plan depends on the view only) is not
        # asked again about a problem identical to one it answered with "change nothing"
        self._stateless = bool(getattr(policy, "stateless", False))
        self._noop_key: tuple | None = None
        self.skipped = 0
        self._pending = False  # a change waits for a decision
        self._next_decision_at = -math.inf
        self._decide_scheduled = False
        # optional policy hooks (see simulator.policies.Policy)
        self._admit_hook = getattr(policy, "admit", None)
        self._after_hook = getattr(policy, "after_apply", None)
        self._wakeups_hook = getattr(policy, "wakeups", None)
        self._profiling_hook = getattr(policy, "is_profiling", None)
        self._wakes: set[float] = set()

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
        while len(self.events) and self.events.peek_time() == t:
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
        dt = t - self._last_t
        if dt > 0:
            n_idle = len(self.idle)
            self.idle_node_seconds += n_idle * dt
            self.used_node_seconds += (n_idle - len(self.free)) * dt
            self._last_t = t

    def _advance_jobs(self, t: float) -> None:
        for job in self.admitted:
            self._advance(job, t)

    def _advance(self, job: SimJob, t: float) -> None:
        dt = t - job.last_update
        if dt <= 0:
            return
        n = len(job.nodes)
        if n:
            work = max(0.0, t - max(job.last_update, job.paused_until))
            samples = job.rate * work
            job.progress = min(job.spec.samples, job.progress + samples)
            job.paused_seconds += dt - work
            job.paused_node_seconds += n * (dt - work)
            job.node_seconds += n * dt
            if self._profiling_hook is not None and self._profiling_hook(job.id):
                job.profiling_node_seconds += n * dt
                job.profiling_paused_node_seconds += n * (dt - work)
                job.profiling_lost_samples += job.rate * (dt - work)
            self.policy.observe(job.id, n, samples, dt)
        job.last_update = t

    # ------------------------------------------------------------ events

    def _new_job(self, spec: JobSpec, t: float) -> SimJob:
        job = SimJob(id=f"j{len(self.jobs):05d}", spec=spec, submitted_at=t, last_update=t)
        self.jobs[job.id] = job
        return job

    def _apply_batch(self, batch: EventBatch) -> None:
        idle, free = self.idle, self.free
        for node in batch.became_idle:
            if node not in idle:
                idle[node] = None
                free[node] = None
        hit: dict[str, SimJob] = {}
        for node in batch.recalled:
            if node not in idle:
                continue
            del idle[node]
            if node in free:
                del free[node]
                continue
            job = self.owner.pop(node)
            if job.id not in hit:
                self._advance(job, batch.time)  # account the interval before the node leaves
                hit[job.id] = job
            job.nodes.remove(node)
        for job in hit.values():
            self._recalled(job, batch.time)

    def _recalled(self, job: SimJob, t: float) -> None:
        """Nodes left ``job`` without notice: pay the down pause and shrink, or stop."""
        job.last_interrupted = t
        if len(job.nodes) < job.spec.min_nodes:
            self._release_all(job)
            job.state = JobState.QUEUED
            self.admitted.remove(job)
            self.queue.appendleft(job)
            job.preemptions += 1
            self.preemptions += 1
        else:
            self.rescales += 1
            self._step_rescales += 1
            self._pause(job, t, job.spec.down_cost_s)
        self._changed(job, t)

    def _complete(self, ev: Completion, t: float) -> bool:
        job = self.jobs[ev.job_id]
        if job.version != ev.version or job.state is not JobState.ADMITTED:
            return False
        self._advance(job, t)
        job.progress = job.spec.samples
        job.finished_at = t
        job.state = JobState.DONE
        self._release_all(job)
        self.admitted.remove(job)
        job.history.append((t, job.progress, 0, job.paused_until))
        return True

    def _release_all(self, job: SimJob) -> None:
        for node in job.nodes:
            del self.owner[node]
            self.free[node] = None
        job.nodes = []
        job.rate = 0.0
        job.version += 1

    def _pause(self, job: SimJob, t: float, cost: float) -> None:
        if not self._free_pause:
            job.paused_until = max(job.paused_until, t + cost)

    def _changed(self, job: SimJob, t: float) -> None:
        job.version += 1
        job.rate = throughput_at(job.spec.scaling, len(job.nodes))
        job.history.append((t, job.progress, len(job.nodes), job.paused_until))
        self._dirty.add(job.id)

    # ------------------------------------------------------------ decisions

    def _admit(self, t: float) -> None:
        while len(self.admitted) < self.config.max_running:
            if self.queue:
                job = self.queue.popleft()
            elif not self._stream_done:
                spec = self.workload.draw()
                if spec is None:
                    self._stream_done = True
                    continue
                job = self._new_job(spec, t)
            else:
                return
            if self._admit_hook is not None and not self._admit_hook(_job_view(job), self._view(t)):
                self.queue.appendleft(job)  # FCFS: it waits at the head, and so do the jobs behind it
                return
            job.state = JobState.ADMITTED
            job.last_update = t
            self.admitted.append(job)

    def _view(self, t: float) -> SimView:
        room = sum(j.spec.max_nodes - len(j.nodes) for j in self.admitted)
        n_free = len(self.free)
        if room >= n_free:
            free = tuple(self.free)
        else:
            it = iter(self.free)
            free = tuple(next(it) for _ in range(room))
        return SimView(
            now=t,
            free_nodes=free,
            n_free=n_free,
            jobs=tuple(_job_view(j) for j in self.admitted),
            queue=tuple(_job_view(j) for j in self.queue),
            horizon_s=self.config.horizon_s,
        )

    def _decide(self, t: float) -> None:
        self._admit(t)
        decision_ms = 0.0
        key = self._problem_key() if self._stateless else None
        if key is not None and key == self._noop_key:
            # same problem as a decision that changed nothing: a stateless policy
            # would answer the same no-op, so it is not asked again
            self.skipped += 1
        elif self.admitted:
            view = self._view(t)
            t0 = time.perf_counter()
            plan = self.policy.decide(view)
            decision_ms = (time.perf_counter() - t0) * 1000.0
            self.decision_ms.append(decision_ms)
            changed = self._apply_plan(plan, t)
            self._noop_key = None if changed else key
            if self._after_hook is not None:
                self._after_hook(self._view(t))
        if self._wakeups_hook is not None:
            self._push_wakeups(t)
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
        ))
        self._step_rescales = 0
        if self._progress is not None:
            self._progress((t - self.start) / (self.end - self.start))

    def _push_wakeups(self, t: float) -> None:
        for w in self._wakeups_hook():  # type: ignore[misc]
            if t < w < self.end and w not in self._wakes:
                self._wakes.add(w)
                self.events.push(w, Priority.DECIDE, Wake())

    def _problem_key(self) -> tuple:
        """What a stateless policy's answer depends on: jobs, their counts, usable free nodes, pins."""
        room = 0
        counts = []
        for j in self.admitted:
            n = len(j.nodes)
            room += j.spec.max_nodes - n
            counts.append((j.id, n))
        pins = getattr(self.policy, "pins", None)
        return (tuple(counts), min(room, len(self.free)), tuple(sorted(pins.items())) if pins else ())

    def _apply_plan(self, plan: Plan, t: float) -> bool:
        """Apply a plan; True if any job's nodes changed."""
        name = getattr(self.policy, "name", type(self.policy).__name__)
        growing: list[tuple[SimJob, tuple[str, ...]]] = []
        changed = False
        for job in list(self.admitted):
            new = tuple(plan.assignment.get(job.id, ()))
            old = job.nodes
            if len(new) == len(old) and set(new) == set(old):
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
                self.free[node] = None
        job.nodes = list(new)
        job.last_interrupted = t
        if new:
            self.rescales += 1
            self._step_rescales += 1
            self._pause(job, t, job.spec.down_cost_s)
        else:
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
        if self._profiling_hook is not None and self._profiling_hook(job.id):
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
        self._changed(job, t)

    def _schedule_completions(self, t: float) -> None:
        for job_id in sorted(self._dirty):  # a set of str: sorted, or ties depend on PYTHONHASHSEED
            job = self.jobs[job_id]
            if job.state is not JobState.ADMITTED or not job.nodes or job.rate <= 0:
                continue
            remaining = job.spec.samples - job.progress
            done_at = max(t, job.paused_until) + remaining / job.rate
            self.events.push(done_at, Priority.COMPLETION, Completion(job.id, job.version))
        self._dirty.clear()

    # ------------------------------------------------------------ results

    def _result(self, wall: float, cpu: float) -> SimResult:
        jobs = list(self.jobs.values())
        completed = [j for j in jobs if j.state is JobState.DONE]
        makespan = None
        if self.workload.finite and self._stream_done and not self.queue and not self.admitted:
            if all(j.finished_at is not None for j in jobs) and completed:
                makespan = max(j.finished_at for j in completed) - self.start  # type: ignore[type-var]
        ms = sorted(self.decision_ms)
        idle = self.idle_node_seconds
        summary = {
            "policy": getattr(self.policy, "name", type(self.policy).__name__),
            "workload": self.workload.name,
            "scaling_source": self.workload.scaling_source,
            "synthetic_scaling": self.workload.synthetic,
            "trace": self.timeline.source,
            "nodes_total": len(self.timeline.nodes),
            "start": self.start,
            "end": self.end,
            "span_seconds": self.end - self.start,
            "horizon_s": self.config.horizon_s,
            "max_running": self.config.max_running,
            "idle_node_seconds": idle,
            "used_node_seconds": self.used_node_seconds,
            "used_fraction": self.used_node_seconds / idle if idle > 0 else 0.0,
            "paused_node_seconds": sum(j.paused_node_seconds for j in jobs),
            "samples_processed": sum(j.progress for j in jobs),
            "jobs_submitted": len(jobs),
            "jobs_completed": len(completed),
            "makespan_seconds": makespan,
            "rescales": self.rescales,
            "starts": self.starts,
            "stops": self.stops,
            "preemptions": self.preemptions,
            "decisions": len(self.rows),
            "policy_calls": len(self.decision_ms),
            "decision_ms_p50": _percentile(ms, 0.50),
            "decision_ms_p99": _percentile(ms, 0.99),
            "wall_seconds": wall,
            "cpu_seconds": cpu,
        }
        summary.update(_profiling_summary(jobs, self.used_node_seconds))
        stats = getattr(self.policy, "stats", None)
        summary.update(stats() if stats is not None else {"scalability_error_pct": None})
        return SimResult(summary, self.rows, jobs, self.start, self.end)


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


def _job_view(job: SimJob) -> JobView:
    spec = job.spec
    return JobView(
        id=job.id,
        name=spec.name,
        model=spec.model,
        min_nodes=spec.min_nodes,
        max_nodes=spec.max_nodes,
        true_scaling=spec.scaling,
        believed_scaling=spec.believed,
        nodes=tuple(job.nodes),
        progress=job.progress,
        samples=spec.samples,
        up_cost_s=spec.up_cost_s,
        down_cost_s=spec.down_cost_s,
        paused_until=job.paused_until,
        last_interrupted=job.last_interrupted,
        submitted_at=job.submitted_at,
    )
