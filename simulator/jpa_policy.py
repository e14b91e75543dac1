"""``malletrain``: the exact allocator fed by the job profiling advisor (JPA), refined online.

A new job is not told its scalability; it is profiled in simulated time with
the profiler's own rules (:mod:`profiler.jpa`, imported, never copied):

* **Admission.** When a queued job would take a Pjmax slot, :func:`profiler.choose_sources`
  decides where its profiling nodes come from. On :class:`profiler.Wait` the job stays at the
  head of the FCFS queue (it holds no slot, and the jobs behind it wait too) and is asked again
  at the next decision.
* **One scale-up.** The job starts at the plan's largest count (free nodes first, then nodes
  borrowed from exactly one lender, which shrinks and pays its down cost) and then steps down
  through the other counts (each step a scale-down pause). Nodes released by a step go back to
  the pool, except up to the borrowed count, which is held back for the lender.
* **Steps end in simulated time.** Each step's throughput comes from the job's TRUE curve,
  observed as step records (:mod:`simulator.monitor`, 3% noise) fed to a real
  :class:`profiler.ThroughputEstimator`; the :class:`profiler.ProfileSession` ends the step when
  the estimate is stable (relative CI <= 5%) or after its time cap (300 s). The time of that
  record is pushed on the event heap (``wakeups``).
* **Done.** The borrowed nodes go back to the lender (it grows back, paying its up cost) and
  the job joins the allocator with the profiled :class:`profiler.Scalability`; the lender may
  not grow in between.
* **Refinement.** Afterwards, every interval a job runs at least ``refine_min_s`` (60 s) of
  work at a node count not measured yet yields a stable estimate from that run's records and
  refines its Scalability (``Scalability.refine``); the allocator gets
  ``Scalability.scaling_for(min, max, counts)`` at the default profiling counts and every
  measured count (linear in between, as ``allocator.throughput_at`` reads any curve).
* **Interruptions.** A profile whose job is recalled below its current count or preempted
  stops with what was measured (``profiles_aborted``). A job is profiled once: one with nothing
  measured is assumed to scale like the mean of the workload's curves until online refinement
  measures it (so every profiled job has exactly one scale-up while profiling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

from allocator import Job, Plan, Problem, solve, throughput_at
from profiler import (
    Done,
    ProfilePlan,
    ProfileSession,
    ProfilingRequest,
    RunningJob,
    Scalability,
    StepDown,
    ThroughputEstimator,
    Wait,
    choose_sources,
    default_counts,
)
from simulator.monitor import RECORD_NOISE, StepFeed, measured_rate, run_until_stable
from simulator.policies import Curve, JobView, MilpPolicy, PolicyContext, SimView, apply_pins, mean_curve

def _sparse_counts(lo: int, hi: int) -> tuple[int, ...]:
    """min, the power of two nearest the geometric mean, max (1, 8, 64 for 1..64)."""
    mid = 2 ** round(math.log2(math.sqrt(lo * hi)))
    return tuple(sorted({lo, min(hi, max(lo, mid)), hi}))


def _top_counts(lo: int, hi: int) -> tuple[int, ...]:
    """max/4, max/2, max (16, 32, 64 for 1..64), clipped at min."""
    return tuple(sorted({max(lo, hi // 4), max(lo, hi // 2), hi}))


# which counts a profile visits: the JPA's default (min, powers of two, max), or fewer
COUNT_SETS: dict[str, Callable[[int, int], tuple[int, ...] | None]] = {
    "default": lambda lo, hi: None,
    "sparse": _sparse_counts,
    "top": _top_counts,
}

REFINE_MIN_S = 60.0
PROFILE_REL_CI = 0.05
PROFILE_TIME_CAP_S = 300.0


@dataclass
class _Profile:
    """One job's profile in progress."""

    plan: ProfilePlan
    session: ProfileSession
    estimator: ThroughputEstimator
    started_at: float
    ordered_at: float  # when the current count was ordered (the session's time cap counts from it)
    feed_pending: bool = True  # the count was just ordered: its records start once the plan is applied
    wake: float = math.inf  # when the current step ends (stable, or the cap)
    broken: bool = False  # the job is not at the count the profile expects


@dataclass(frozen=True)
class _Debt:
    lender: str
    nodes: int


class MalleTrainPolicy(MilpPolicy):
    """See the module doc."""

    name = "malletrain"
    stateless = False

    def __init__(
        self,
        context: PolicyContext = PolicyContext(),
        method: str = "auto",
        rel_ci: float = PROFILE_REL_CI,
        time_cap_s: float = PROFILE_TIME_CAP_S,
        record_noise: float = RECORD_NOISE,
        refine_min_s: float = REFINE_MIN_S,
        count_set: str = "default",
    ) -> None:
        super().__init__(method)
        if count_set not in COUNT_SETS:
            raise ValueError(f"count_set {count_set!r}: choose one of {', '.join(COUNT_SETS)}")
        self.count_set = count_set
        self.context = context
        self.rel_ci = rel_ci
        self.time_cap_s = time_cap_s
        self.noise = record_noise
        self.refine_min_s = refine_min_s
        self._fallback = mean_curve(context.curves) if context.curves else None
        self.scal: dict[str, Scalability] = {}
        self.profiles: dict[str, _Profile] = {}
        self.debts: dict[str, _Debt] = {}  # borrower -> what it owes its lender
        self._true: dict[str, Curve] = {}
        self._curves: dict[str, tuple[Scalability, dict[int, float]]] = {}
        self._refined: set[tuple[str, int]] = set()
        self.profiled_once: set[str] = set()
        # a problem identical to one answered with "no change" (no profile running, no curve
        # changed since) gets the same answer without a solve, as the simulator does for
        # stateless policies
        self._belief_version = 0
        self._noop_key: tuple | None = None
        self._round_t: float | None = None
        self._round_free = 0
        self._round_borrow: dict[str, int] = {}
        # statistics for summary.json
        self.waited: set[str] = set()
        self.profiles_done = 0
        self.profiles_aborted = 0
        self.profile_seconds: list[float] = []
        self.counts_profiled: list[int] = []
        self.capped_steps = 0
        self.refinements = 0
        self.lent_nodes = 0
        self.returned_nodes = 0

    # ------------------------------------------------------------ hooks

    def is_profiling(self, job_id: str) -> bool:
        return job_id in self.profiles

    def wakeups(self) -> Iterable[float]:
        return [p.wake for p in self.profiles.values() if p.wake < math.inf]

    def admit(self, job: JobView, view: SimView) -> bool:
        """A job takes a slot if it was profiled before, or if the JPA can source its profile now."""
        self._true[job.id] = job.true_scaling
        if job.id in self.scal or job.id in self.profiled_once:
            return True  # profiled before (or its profile was cut short): no second profile
        if self._round_t != view.now:
            self._round_t, self._round_free, self._round_borrow = view.now, 0, {}
        running = tuple(
            RunningJob(
                j.id,
                max(0, j.current - self._round_borrow.get(j.id, 0)),
                j.min_nodes,
                j.last_interrupted if j.last_interrupted is not None else -math.inf,
                profiling=j.id in self.profiles,
            )
            for j in view.jobs
        )
        request = ProfilingRequest(job.id, job.min_nodes, job.max_nodes,
                                   COUNT_SETS[self.count_set](job.min_nodes, job.max_nodes))
        res = choose_sources(request, max(0, view.n_free - self._round_free), running)
        if isinstance(res, Wait):
            self.waited.add(job.id)
            return False
        self._round_free += res.from_free
        if res.lender is not None and res.borrowed > 0:
            self._round_borrow[res.lender] = self._round_borrow.get(res.lender, 0) + res.borrowed
            self.debts[job.id] = _Debt(res.lender, res.borrowed)
            self.lent_nodes += res.borrowed
        session = ProfileSession(res, view.now, rel_ci=self.rel_ci, time_cap_s=self.time_cap_s)
        self.profiled_once.add(job.id)
        self.profiles[job.id] = _Profile(res, session, ThroughputEstimator(), view.now, view.now)
        return True

    def after_apply(self, view: SimView) -> None:
        """Start the records of every step just ordered, and find when it ends."""
        by_id = {j.id: j for j in view.jobs}
        for job_id, p in self.profiles.items():
            if not p.feed_pending:
                continue
            p.feed_pending = False
            j = by_id.get(job_id)
            if j is None or j.current != p.session.count:
                p.broken, p.wake = True, view.now + 1.0
                continue
            resume = max(view.now, j.paused_until)
            deadline = p.ordered_at + self.time_cap_s
            feed = StepFeed(job_id, j.true_scaling, j.current, resume, seed=self.context.seed, noise=self.noise)
            at = run_until_stable(feed, p.estimator, deadline, self.rel_ci)
            p.wake = at if at is not None else deadline

    def observe(self, job_id: str, nodes: int, samples: float, seconds: float) -> None:
        """Online refinement: a long enough run at an unmeasured count refines the job's curve."""
        if job_id in self.profiles or (job_id, nodes) in self._refined:
            return
        scal = self.scal.get(job_id)
        true = self._true.get(job_id)
        if scal is None or true is None:
            return
        if nodes in scal.measured:
            self._refined.add((job_id, nodes))
            return
        rate = throughput_at(true, nodes)
        if rate <= 0 or samples / rate < self.refine_min_s:
            return
        self._refined.add((job_id, nodes))
        measured = measured_rate(job_id, true, nodes, samples / rate, self.context.seed, self.noise, self.rel_ci)
        if measured is not None:
            self.scal[job_id] = scal.refine(nodes, measured)
            self._belief_version += 1
            self.refinements += 1

    # ------------------------------------------------------------ decisions

    def curve_for(self, job: JobView) -> Curve:
        scal = self.scal.get(job.id)
        if scal is None:
            scal = self.scal[job.id] = self._fallback_scalability(job)
            self._belief_version += 1
        hit = self._curves.get(job.id)
        if hit is not None and hit[0] is scal:
            return hit[1]
        # the profiled counts, every measured one and the model at the default counts between:
        # the allocator interpolates linearly in between (a 64-point curve costs 10x more to tabulate)
        wanted = set(default_counts(job.min_nodes, job.max_nodes)) | {
            n for n in scal.measured if job.min_nodes <= n <= job.max_nodes}
        curve = scal.scaling_for(job.min_nodes, job.max_nodes, counts=wanted)
        self._curves[job.id] = (scal, curve)
        return curve

    def problem_job(self, job: JobView, nodes: tuple[str, ...]) -> Job:
        return Job(job.id, job.min_nodes, job.max_nodes, self.curve_for(job), nodes, job.up_cost_s, job.down_cost_s)

    def _fallback_scalability(self, job: JobView) -> Scalability:
        if self._fallback is not None:
            return Scalability.from_user(self._fallback)
        return Scalability.from_user({job.min_nodes: float(job.min_nodes)})  # no information: all alike

    def decide(self, view: SimView) -> Plan:
        now = view.now
        by_id = {j.id: j for j in view.jobs}
        returning = self._advance_profiles(now, by_id)
        key = self._problem_key(view) if not returning else None
        if key is not None and key == self._noop_key:
            return _no_change(view)
        pins = {job_id: p.session.count for job_id, p in self.profiles.items()}
        lenders = {b: d.lender for b, d in self.debts.items() if b in pins and by_id[b].current == 0}
        pinned = apply_pins(view, pins, lenders)
        free = list(pinned.free)
        fixed = dict(pinned.fixed)
        for lender, k in returning.items():
            if lender in pinned.lenders:
                continue  # it lends to a new profile in this very decision: it cannot also grow
            own = by_id[lender].nodes
            give = free[: max(0, min(k, by_id[lender].max_nodes - len(own)))]
            del free[: len(give)]
            fixed[lender] = tuple(own) + tuple(give)
            self.returned_nodes += len(give)
        reserve = min(len(free), self._reserved())
        if reserve:
            free = free[: len(free) - reserve]
        in_debt = {d.lender for d in self.debts.values()}
        jobs: list[Job] = []
        for j in view.jobs:
            if j.id in fixed:
                continue
            nodes = tuple(pinned.lenders.get(j.id, j.nodes))
            if j.id in pinned.lenders or j.id in in_debt:
                if not nodes:
                    fixed[j.id] = ()
                    continue
                base = self.problem_job(j, nodes)  # a lender may shrink but not grow while it is owed nodes
                jobs.append(Job(j.id, min(j.min_nodes, len(nodes)), len(nodes), base.scaling, nodes,
                                j.up_cost_s, j.down_cost_s))
            else:
                jobs.append(self._cached_job(j, nodes))
        plan = solve(Problem(tuple(jobs), tuple(free), view.horizon_s), method=self.method)
        self.note_beliefs(plan, jobs, by_id)
        if len(self._jobs) > 2 * len(view.jobs) + 16:
            self._jobs = {k: v for k, v in self._jobs.items() if k in by_id}
            self._curves = {k: v for k, v in self._curves.items() if k in by_id}
        assignment = dict(plan.assignment)
        assignment.update(fixed)
        counts = {k: len(v) for k, v in assignment.items()}
        unchanged = all(set(assignment.get(j.id, ())) == set(j.nodes) for j in view.jobs)
        self._noop_key = key if unchanged else None
        return Plan(assignment, plan.objective, plan.solve_seconds, plan.method, counts)

    def _problem_key(self, view: SimView) -> tuple:
        room = sum(j.max_nodes - j.current for j in view.jobs)
        profiles = tuple((job_id, p.session.count, p.feed_pending) for job_id, p in self.profiles.items())
        return (tuple((j.id, j.current) for j in view.jobs), min(room, view.n_free), self._belief_version,
                profiles, tuple(self.debts.items()))

    def _reserved(self) -> int:
        """Nodes released by profiles in progress, up to what they borrowed: held back for the lenders."""
        total = 0
        for borrower, debt in self.debts.items():
            p = self.profiles.get(borrower)
            if p is not None:
                total += min(debt.nodes, p.plan.top - p.session.count)
        return total

    def _advance_profiles(self, now: float, by_id: dict[str, JobView]) -> dict[str, int]:
        """Step every profile whose step has ended; returns lender -> nodes to give back now."""
        returning: dict[str, int] = {}
        for job_id in list(self.profiles):
            p = self.profiles[job_id]
            j = by_id.get(job_id)
            if j is None or p.broken or (not p.feed_pending and j.current != p.session.count):
                self._finish(job_id, now, None, returning, by_id)
                continue
            if p.feed_pending or now < p.wake:
                continue
            action = p.session.next_action(now, p.estimator)
            if isinstance(action, StepDown):
                p.feed_pending, p.ordered_at, p.wake = True, now, math.inf
            elif isinstance(action, Done):
                self._finish(job_id, now, action, returning, by_id)
            else:  # Hold: the step's end moved (cannot happen with records fed up to the wake time)
                p.wake = action.deadline
        for borrower in [b for b, d in self.debts.items() if d.lender not in by_id or b not in by_id]:
            del self.debts[borrower]  # the lender or the borrower left: nothing to give back
        return returning

    def _finish(self, job_id: str, now: float, done: Done | None, returning: dict[str, int],
                by_id: dict[str, JobView]) -> None:
        p = self.profiles.pop(job_id)
        measured = p.session.measured
        if done is not None:
            self.profiles_done += 1
            self.capped_steps += len(done.capped)
            scal = done.scalability
        else:
            self.profiles_aborted += 1
            scal = Scalability.profiled(measured) if measured else None
        self.profile_seconds.append(now - p.started_at)
        self.counts_profiled.append(len(measured))
        self._belief_version += 1
        if scal is not None:
            self.scal[job_id] = scal
        elif job_id in by_id:
            self.scal[job_id] = self._fallback_scalability(by_id[job_id])
        debt = self.debts.pop(job_id, None)
        if debt is not None and debt.lender in by_id:
            returning[debt.lender] = returning.get(debt.lender, 0) + debt.nodes

    def stats(self) -> dict:
        out = super().stats()
        n = len(self.profile_seconds)
        out.update({
            "profiles_done": self.profiles_done,
            "profiles_aborted": self.profiles_aborted,
            "profile_waits": len(self.waited),
            "profile_seconds_mean": sum(self.profile_seconds) / n if n else None,
            "profile_counts_mean": sum(self.counts_profiled) / n if n else None,
            "profile_capped_steps": self.capped_steps,
            "profile_lent_nodes": self.lent_nodes,
            "profile_returned_nodes": self.returned_nodes,
            "refinements": self.refinements,
        })
        return out


def _no_change(view: SimView) -> Plan:
    assignment = {j.id: j.nodes for j in view.jobs}
    return Plan(assignment, 0.0, 0.0, "unchanged", {k: len(v) for k, v in assignment.items()})
