"""Allocation policies: a small object turns the simulator's view into a Plan.

Every policy answers with an :class:`allocator.Plan` whose node maps never make
a job both gain and lose nodes. The MILP policies build a
:class:`allocator.Problem` and call :func:`allocator.solve`; they differ only in
the scalability they feed it:

* ``malletrain`` (:mod:`simulator.jpa_policy`): what the job profiling advisor
  measured, refined online while jobs run;
* ``freetrain``: a user-supplied curve (:func:`believed_curve`; by default the
  mean of the workload's model curves);
* ``milp-true``: the true curves ("FreeTrain with a perfect user");
* ``oracle``: the true curves and free rescales (an upper bound).

``greedy`` and ``equal`` pick node counts themselves and turn them into node
maps with the allocator's own no-migration helper
(:func:`allocator.solve.assign_nodes`).

To add a policy, register a factory ``(PolicyContext) -> Policy`` in :data:`POLICIES`.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Protocol, runtime_checkable

from allocator import Job, Plan, Problem, solve, throughput_at
from allocator.solve import assign_nodes
from profiler import curve_error_pct

Curve = Mapping[int, float]


@dataclass(frozen=True)
class JobView:
    """An admitted (or queued) job as a policy sees it.

    ``true_scaling`` is what the simulator uses for progress; a fair policy
    reads ``believed_scaling`` (the user's or the profiler's curve) only.
    """

    id: str
    name: str
    model: str
    min_nodes: int
    max_nodes: int
    true_scaling: Curve
    believed_scaling: Curve
    nodes: tuple[str, ...]
    progress: float  # samples done
    samples: float  # samples to train in total
    up_cost_s: float
    down_cost_s: float
    paused_until: float
    last_interrupted: float | None  # last time it was rescaled, recalled or stopped
    submitted_at: float

    @property
    def current(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class SimView:
    """The state a policy decides on.

    ``jobs`` are the admitted jobs (at most Pjmax), in admission order.
    ``free_nodes`` are held idle nodes no job uses, capped at what the
    admitted jobs could still take (``sum(max - current)``) so a 4,000-node
    idle pool costs nothing per decision; ``n_free`` is the uncapped count.
    """

    now: float
    free_nodes: tuple[str, ...]
    n_free: int
    jobs: tuple[JobView, ...]
    queue: tuple[JobView, ...]
    horizon_s: float


@runtime_checkable
class Policy(Protocol):
    name: str
    free_rescales: bool  # True: the simulator charges no rescale pause (oracle)
    # True: decide() depends on the view (job ids, node counts, free-node count) and
    # ``pins`` only, so the simulator may skip re-asking an identical no-op problem.
    # A policy that learns (observe) or keeps state must say False.
    stateless: bool

    def decide(self, view: SimView) -> Plan: ...

    def observe(self, job_id: str, nodes: int, samples: float, seconds: float) -> None:
        """Called after each interval a job ran: ``samples`` done on ``nodes`` in ``seconds``."""

    # Optional hooks the simulator calls when a policy has them (see simulator.jpa_policy):
    #   admit(job: JobView, view: SimView) -> bool     may a queued job take a slot now? (False: it waits)
    #   after_apply(view: SimView) -> None            the state right after a plan was applied
    #   wakeups() -> Iterable[float]                  times to decide again at (profiling steps)
    #   is_profiling(job_id: str) -> bool             for the profiling accounting of summary.json
    #   stats() -> dict                               extra summary.json keys


@dataclass(frozen=True)
class PolicyContext:
    """What a policy factory may know about the run: the workload's model curves (a user can
    know the models' names, not which job is which), the seed, and the freetrain error model."""

    curves: Mapping[str, Curve] = field(default_factory=dict)
    seed: int = 0
    freetrain_model: str = "mean"


class BasePolicy:
    """Shared parts: a no-op ``observe``, and node-count pins.

    ``pins[job_id] = n`` forces that job to run on exactly ``n`` nodes (its own
    first, then free ones, then nodes borrowed from the running job holding
    the most); a profiler uses this to measure a job at chosen counts.
    """

    name = "base"
    free_rescales = False
    stateless = True

    def __init__(self) -> None:
        self.pins: dict[str, int] = {}
        # scalability_error_pct: |believed - true| / true for every (job, count) the allocator
        # chose, taken from the belief it held when it first chose that count
        self._belief_errors: dict[tuple[str, int], float] = {}

    def observe(self, job_id: str, nodes: int, samples: float, seconds: float) -> None:
        return None

    def decide(self, view: SimView) -> Plan:  # pragma: no cover - abstract
        raise NotImplementedError

    def note_beliefs(self, plan: Plan, jobs: Iterable[Job], views: Mapping[str, JobView]) -> None:
        """Remember the believed rate of each job at the count the allocator gave it."""
        for job in jobs:
            n = len(plan.assignment.get(job.id, ()))
            key = (job.id, n)
            if n <= 0 or key in self._belief_errors:
                continue
            view = views[job.id]
            self._belief_errors[key] = curve_error_pct({n: throughput_at(job.scaling, n)}, view.true_scaling, (n,))

    def stats(self) -> dict:
        errs = self._belief_errors
        return {"scalability_error_pct": sum(errs.values()) / len(errs) if errs else None}

    def job_for(self, view_job: JobView, nodes: tuple[str, ...] | None = None) -> Job:
        """The allocator's Job for a view job (believed scaling, real costs)."""
        return Job(
            id=view_job.id,
            min_nodes=view_job.min_nodes,
            max_nodes=view_job.max_nodes,
            scaling=view_job.believed_scaling,
            nodes=view_job.nodes if nodes is None else nodes,
            up_cost_s=view_job.up_cost_s,
            down_cost_s=view_job.down_cost_s,
        )


@dataclass
class _Pinned:
    fixed: dict[str, tuple[str, ...]] = field(default_factory=dict)  # pinned jobs' node maps
    lenders: dict[str, tuple[str, ...]] = field(default_factory=dict)  # jobs that lent nodes
    free: list[str] = field(default_factory=list)


def apply_pins(view: SimView, pins: Mapping[str, int], lenders: Mapping[str, str] | None = None) -> _Pinned:
    """Place pinned jobs first; lenders keep what is left and may only shrink further.

    A pinned job short of free nodes borrows from ``lenders[job_id]`` if given, else from the
    running job holding the most.
    """
    out = _Pinned(free=list(view.free_nodes))
    holdings = {j.id: j.nodes for j in view.jobs}
    by_id = {j.id: j for j in view.jobs}
    for job_id, want in pins.items():
        job = by_id.get(job_id)
        if job is None:
            continue
        want = max(0, min(want, job.max_nodes))
        own = holdings[job_id]
        if want <= len(own):
            out.fixed[job_id] = own[:want]
            out.free.extend(own[want:])
            continue
        need = want - len(own)
        extra = out.free[:need]
        del out.free[:need]
        need -= len(extra)
        if need > 0:
            named = lenders.get(job_id) if lenders else None
            lender = by_id.get(named) if named is not None else max(
                (j for j in view.jobs if j.id not in pins and j.id != job_id),
                key=lambda j: len(holdings[j.id]),
                default=None,
            )
            if lender is not None and holdings[lender.id]:
                keep = holdings[lender.id]
                take = min(need, len(keep))
                extra += list(keep[len(keep) - take:])
                holdings[lender.id] = keep[: len(keep) - take]
                out.lenders[lender.id] = holdings[lender.id]
        out.fixed[job_id] = own + tuple(extra)
    return out


class MilpPolicy(BasePolicy):
    """The exact allocator on each job's ``believed_scaling`` (the true curve unless a job file
    says otherwise): registered as ``milp-true``, FreeTrain with a perfect user."""

    name = "milp-true"

    def __init__(self, method: str = "auto") -> None:
        super().__init__()
        self.method = method
        # memo of built allocator Jobs: id -> (nodes, believed curve, Job); a pure cache
        self._jobs: dict[str, tuple[tuple[str, ...], Curve, Job]] = {}

    def problem_job(self, job: JobView, nodes: tuple[str, ...]) -> Job:
        return self.job_for(job, nodes)

    def curve_for(self, job: JobView) -> Curve:
        """The curve the allocator is given for ``job`` (the same object while it is unchanged)."""
        return job.believed_scaling

    def _cached_job(self, job: JobView, nodes: tuple[str, ...]) -> Job:
        hit = self._jobs.get(job.id)
        curve = self.curve_for(job)
        if hit is not None and hit[0] == nodes and hit[1] is curve:
            return hit[2]
        built = self.problem_job(job, nodes)
        self._jobs[job.id] = (nodes, curve, built)
        return built

    def decide(self, view: SimView) -> Plan:
        pinned = apply_pins(view, self.pins) if self.pins else None
        jobs: list[Job] = []
        for j in view.jobs:
            if pinned is not None and j.id in pinned.fixed:
                continue
            if pinned is not None and j.id in pinned.lenders:
                lent = pinned.lenders[j.id]
                if not lent:
                    continue
                job = self.problem_job(j, lent)
                # a lender may shrink further but not grow back in the same decision
                jobs.append(Job(job.id, min(job.min_nodes, len(lent)), len(lent), job.scaling,
                                lent, job.up_cost_s, job.down_cost_s))
                continue
            jobs.append(self._cached_job(j, j.nodes))
        if len(self._jobs) > 2 * len(view.jobs) + 16:
            live = {j.id for j in view.jobs}
            self._jobs = {k: v for k, v in self._jobs.items() if k in live}
        free = tuple(pinned.free) if pinned is not None else view.free_nodes
        plan = solve(Problem(tuple(jobs), free, view.horizon_s), method=self.method)
        self.note_beliefs(plan, jobs, {j.id: j for j in view.jobs})
        if pinned is None:
            return plan
        assignment = dict(plan.assignment)
        assignment.update(pinned.fixed)
        for job_id, lent in pinned.lenders.items():
            assignment.setdefault(job_id, lent)
        counts = {k: len(v) for k, v in assignment.items()}
        return Plan(assignment, plan.objective, plan.solve_seconds, plan.method, counts)


class FreeTrainPolicy(MilpPolicy):
    """FreeTrain: the exact allocator on a user-supplied curve (see :func:`believed_curve`).

    A job whose spec carries its own ``believed_scaling`` (a job file) keeps it.
    """

    name = "freetrain"

    def __init__(self, context: PolicyContext = PolicyContext(), method: str = "auto") -> None:
        super().__init__(method)
        self.model = parse_error_model(context.freetrain_model)
        self.context = context
        self._mean = mean_curve(context.curves) if context.curves else None
        if self.model.kind == "mean" and self._mean is None:
            raise ValueError("freetrain model 'mean' needs the workload's model curves (PolicyContext.curves)")
        self._believed: dict[str, Curve] = {}

    def curve_for(self, job: JobView) -> Curve:
        curve = self._believed.get(job.id)
        if curve is None:
            if job.believed_scaling is not job.true_scaling:
                curve = job.believed_scaling  # the job file gave one: that is the user's curve
            else:
                curve = believed_curve(self.model, job, self._mean, self.context.seed)
            self._believed[job.id] = curve
        return curve

    def problem_job(self, job: JobView, nodes: tuple[str, ...]) -> Job:
        return Job(job.id, job.min_nodes, job.max_nodes, self.curve_for(job), nodes, job.up_cost_s, job.down_cost_s)


@dataclass(frozen=True)
class ErrorModel:
    """How far a user's curve is from the truth: ``mean``, ``linear`` or ``noise`` (``pct`` %)."""

    kind: str
    pct: float = 0.0

    @property
    def label(self) -> str:
        return f"noise:{self.pct:g}" if self.kind == "noise" else self.kind


def parse_error_model(text: str) -> ErrorModel:
    """``mean`` | ``linear`` | ``noise:X`` (X in %, 0 <= X < 100)."""
    t = text.strip().lower()
    if t in ("mean", "linear"):
        return ErrorModel(t)
    if t.startswith("noise:"):
        try:
            pct = float(t.split(":", 1)[1])
        except ValueError:
            pct = -1.0
        if 0.0 <= pct < 100.0:
            return ErrorModel("noise", pct)
    raise ValueError(f"freetrain model {text!r}: use mean, linear or noise:X with 0 <= X < 100 (percent)")


def mean_curve(curves: Mapping[str, Curve]) -> dict[int, float]:
    """Point-wise mean of ``curves`` over the union of their node counts (piecewise-linear between points)."""
    counts = sorted({n for c in curves.values() for n in c})
    k = len(curves)
    return {n: sum(throughput_at(c, n) for c in curves.values()) / k for n in counts}


def believed_curve(model: ErrorModel, job: JobView, mean: Curve | None, seed: int) -> dict[int, float]:
    """The curve a user would give for ``job`` under ``model``.

    * ``mean``: every job scales like the mean of the workload's model curves (the user knows
      the candidate models, not which one this job is).
    * ``linear``: linear from the true rate at ``min_nodes`` (the user ran it once, small).
    * ``noise:X``: the true curve, each point times ``U(1 - X%, 1 + X%)``, seeded by
      ``(seed, job name)``.
    """
    true = job.true_scaling
    if model.kind == "mean":
        assert mean is not None
        return dict(mean)
    if model.kind == "linear":
        per_node = throughput_at(true, job.min_nodes) / job.min_nodes
        return {n: per_node * n for n in sorted(set(true) | {job.min_nodes, job.max_nodes})}
    rng = random.Random(zlib.crc32(f"{seed}:{job.name}".encode()))
    x = model.pct / 100.0
    return {n: v * rng.uniform(1.0 - x, 1.0 + x) for n, v in sorted(true.items())}


class OraclePolicy(MilpPolicy):
    """Upper bound: the exact allocator on the TRUE scalability with free rescales."""

    name = "oracle"
    free_rescales = True

    def problem_job(self, job: JobView, nodes: tuple[str, ...]) -> Job:
        return Job(job.id, job.min_nodes, job.max_nodes, job.true_scaling, nodes, 0.0, 0.0)


def _plan_from_counts(view: SimView, counts: dict[str, int], jobs: list[Job], method: str) -> Plan:
    problem = Problem(tuple(jobs), view.free_nodes, view.horizon_s)
    return Plan(assign_nodes(problem, counts), 0.0, 0.0, method, counts)


class GreedyPolicy(BasePolicy):
    """FCFS: each admitted job, in admission order, is grown to its max; nothing shrinks."""

    name = "greedy"

    def decide(self, view: SimView) -> Plan:
        avail = min(view.n_free, len(view.free_nodes))
        counts: dict[str, int] = {}
        for j in view.jobs:
            target = min(j.max_nodes, j.current + avail)
            if target < j.min_nodes:
                target = j.current
            counts[j.id] = target
            avail -= target - j.current
        return _plan_from_counts(view, counts, [self.job_for(j) for j in view.jobs], "greedy")


def equal_split(total: int, jobs: tuple[JobView, ...]) -> dict[str, int]:
    """Split ``total`` nodes evenly over the earliest jobs that can all get their min.

    Water-filling: every job gets ``total // k`` capped at its max; what is
    left goes round-robin (admission order) to jobs below their max. If a job
    would get less than its min, the latest-admitted job is dropped and the
    split retried.
    """
    for k in range(len(jobs), 0, -1):
        chosen = jobs[:k]
        counts = _water_fill(total, chosen)
        if all(counts[j.id] >= j.min_nodes for j in chosen):
            out = {j.id: 0 for j in jobs}
            out.update(counts)
            return out
    return {j.id: 0 for j in jobs}


def _water_fill(total: int, jobs: tuple[JobView, ...]) -> dict[str, int]:
    counts = {j.id: 0 for j in jobs}
    left = total
    open_jobs = [j for j in jobs]
    while left > 0 and open_jobs:
        share = max(1, left // len(open_jobs))
        still_open = []
        for j in open_jobs:
            give = min(share, j.max_nodes - counts[j.id], left)
            counts[j.id] += give
            left -= give
            if counts[j.id] < j.max_nodes:
                still_open.append(j)
            if left == 0:
                break
        open_jobs = still_open
    return counts


class EqualPolicy(BasePolicy):
    """Even split of all held nodes over the admitted jobs (rescales at every change)."""

    name = "equal"

    def decide(self, view: SimView) -> Plan:
        total = sum(j.current for j in view.jobs) + min(view.n_free, len(view.free_nodes))
        counts = equal_split(total, view.jobs)
        return _plan_from_counts(view, counts, [self.job_for(j) for j in view.jobs], "equal")


PolicyFactory = Callable[[PolicyContext], Policy]


def _malletrain(context: PolicyContext) -> Policy:
    from simulator.jpa_policy import MalleTrainPolicy

    return MalleTrainPolicy(context)


POLICIES: dict[str, PolicyFactory] = {
    "malletrain": _malletrain,
    "freetrain": FreeTrainPolicy,
    "milp-true": lambda _ctx: MilpPolicy(),
    "greedy": lambda _ctx: GreedyPolicy(),
    "equal": lambda _ctx: EqualPolicy(),
    "oracle": lambda _ctx: OraclePolicy(),
}


def make_policy(name: str, context: PolicyContext | None = None) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    return factory(context if context is not None else PolicyContext())
