"""The one place decisions are made: ``Policy.decide(view, evidence) -> Decision``.

The daemon (real clock) and the simulator (simulated clock) both call this; neither holds a rule
of its own about admission, profiling, lending, curves or costs. Each rule is settled once, here:

* **Admission: FCFS with Pjmax and batch admission** (MalleTrain §3.2). Up to ``max_running`` jobs
  hold a slot; all free slots are filled in one decision, in queue order. A job that cannot start
  (its profile cannot be sourced) waits at the head and **blocks the jobs behind it**: FCFS, as
  the chapter says, so a big job is not starved by small ones slipping past. A profiling job holds
  a slot like any other. A job a recall takes below its ``min_nodes`` is stopped by its driver;
  the policy then takes its slot away and puts it at the **front** of the queue with its progress
  (it is re-admitted first).
* **Profiling** (the JPA, :mod:`profiler.jpa`; MalleTrain §3.3), for the jobs
  ``PolicyConfig.profiling`` selects, once per job: a profile cut short by a recall keeps what it
  measured and is never restarted (a second profile would cost a second scale-up and a second
  lender interruption; passive learning measures the rest). Nodes come from free ones first, then
  from **one** lender, the least recently interrupted (lending counts as an interruption), which
  keeps at least ``max(min_nodes, 1)`` nodes: **a job is never stopped** to profile another.
  **Never two interruptions at once**: at most one lender per decision, and a job that is owed
  nodes lends no more. The job starts at its largest count (its one scale-up) and steps down;
  each step ends when its estimate is stable or after ``profile_time_cap_s``.
* **The lender gets its nodes back**: while the profile runs, the nodes its steps release are held
  back (up to what was borrowed) and the lender may shrink but not grow; when the profile ends
  the lender takes them back at once.
* **Curves and costs**: :mod:`policy.beliefs`.
* **Allocation**: the exact allocator over the admitted jobs that are not pinned by a profile,
  with horizon ``tfwd_s`` (or the greedy / equal baselines).

A decision whose inputs equal those of the last decision that changed nothing is answered
"no change" without running the allocator (the answer would be the same).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

from allocator import Job, Problem, solve
from policy import beliefs
from policy.allocation import apply_pins, equal_counts, greedy_counts, node_map
from policy.config import Allocation, PolicyConfig, PolicyConfigError, Profiling
from policy.model import (
    NO_EVIDENCE,
    Decision,
    EventKind,
    Evidence,
    JobEvidence,
    JobView,
    PolicyEvent,
    PolicyInputError,
    View,
)
from policy.state import POPULATION_KEEP, Debt, PolicyState
from profiler.jpa import Done, ProfileSession, ProfilingRequest, RunningJob, StepDown, Wait, choose_sources
from profiler.scalability import Scalability


def _sparse_counts(lo: int, hi: int) -> tuple[int, ...]:
    mid = 2 ** round(math.log2(math.sqrt(lo * hi)))
    return tuple(sorted({lo, min(hi, max(lo, mid)), hi}))


def _top_counts(lo: int, hi: int) -> tuple[int, ...]:
    return tuple(sorted({max(lo, hi // 4), max(lo, hi // 2), hi}))


def profile_counts(kind: str, lo: int, hi: int) -> tuple[int, ...] | None:
    """The counts a profile visits (None: the JPA's default, min + powers of two + max)."""
    if kind == "sparse":
        return _sparse_counts(lo, hi)
    if kind == "top":
        return _top_counts(lo, hi)
    return None


class _Round:
    """Scratch of one decision."""

    def __init__(self, view: View) -> None:
        self.now = view.now
        self.jobs: dict[str, JobView] = {}
        # node order is canonical (sorted names), so a decision never depends on how a driver
        # happens to list nodes: which nodes a shrinking job or a lender gives up, which free
        # nodes a growing job takes
        self.free = sorted(view.free_nodes)
        seen: set[str] = set(self.free)
        if len(seen) != len(self.free):
            raise PolicyInputError("a free node is listed twice in the view")
        for j in view.jobs:
            if j.id in self.jobs:
                raise PolicyInputError(f"job {j.id} is listed twice in the view")
            if seen.intersection(j.nodes) or len(set(j.nodes)) != len(j.nodes):
                raise PolicyInputError(f"job {j.id}: a node is listed twice in the view (free or another job's)")
            seen.update(j.nodes)
            nodes = tuple(sorted(j.nodes))
            self.jobs[j.id] = j if nodes == j.nodes else replace(j, nodes=nodes)
        self.events: list[PolicyEvent] = []
        self.returning: dict[str, int] = {}
        self.released: list[str] = []  # nodes of jobs stopped under their min, free from now on
        self.lender_used = False

    def note(self, kind: EventKind, job: str, **detail: object) -> None:
        self.events.append(PolicyEvent(kind, job, detail))


class Policy:
    """Holds the config and the :class:`PolicyState`; see the module doc for the rules."""

    def __init__(self, config: PolicyConfig | None = None, state: PolicyState | None = None) -> None:
        self.config = config if config is not None else PolicyConfig()
        if self.config.allocation is not Allocation.MILP and self.config.profiling is not Profiling.NEVER:
            raise PolicyConfigError("policy.profiling needs allocation = \"milp\" (the baselines do not profile)")
        self.state = state if state is not None else PolicyState()
        # caches (rebuilt on demand; never part of the state)
        self._versions: dict[str, int] = {}
        self._curves: dict[str, tuple[tuple, dict[int, float]]] = {}
        self._alloc_jobs: dict[str, tuple[tuple, Job]] = {}
        self._noop_key: tuple | None = None

    # ------------------------------------------------------------------ the decision

    def decide(self, view: View, evidence: Evidence) -> Decision:
        r = _Round(view)
        self._forget_departed(r)
        self._learn(r, evidence)
        self._preemptions(r)
        self._advance_profiles(r, evidence)
        waiting = self._admit(r, view)
        return self._allocate(r, view, evidence, waiting)

    # ------------------------------------------------------------------ bookkeeping

    def _forget_departed(self, r: _Round) -> None:
        st, jobs = self.state, r.jobs
        st.admitted = [j for j in st.admitted if j in jobs]
        st.queue_front = [j for j in st.queue_front if j in jobs and j not in st.admitted]
        st.assigned = {k: v for k, v in st.assigned.items() if k in jobs}
        st.profiles = {k: s for k, s in st.profiles.items() if k in jobs}
        st.debts = {b: d for b, d in st.debts.items() if b in jobs and d.lender in jobs}
        st.lent_at = {k: v for k, v in st.lent_at.items() if k in jobs}
        st.profiled = {j for j in st.profiled if j in jobs}
        for job_id in [k for k in st.measured if k not in jobs]:
            pts = st.measured.pop(job_id)
            if pts:
                n = min(pts)
                st.population.append(pts[n] / n)
            self._versions.pop(job_id, None)
            self._curves.pop(job_id, None)
            self._alloc_jobs.pop(job_id, None)
        del st.population[:-POPULATION_KEEP]

    def _bump(self, job_id: str) -> None:
        self._versions[job_id] = self._versions.get(job_id, 0) + 1

    def _learn(self, r: _Round, evidence: Evidence) -> None:
        if not self.config.learn:
            return
        st = self.state
        for job_id, ev in evidence.items():
            job = r.jobs.get(job_id)
            if job is None or job_id in st.profiles or not ev.rates:
                continue
            new = beliefs.accept(ev, st.measured.get(job_id, {}), job, self.config)
            if new:
                st.measured.setdefault(job_id, {}).update(new)
                self._bump(job_id)
                r.note(EventKind.REFINED, job_id, points={str(n): v for n, v in sorted(new.items())})

    def _preemptions(self, r: _Round) -> None:
        """An admitted job the driver had to stop (a recall took it below its min) loses its slot."""
        st = self.state
        for job_id in list(st.admitted):
            job = r.jobs[job_id]
            if job.count >= job.min_nodes or st.assigned.get(job_id, 0) < job.min_nodes:
                continue
            st.admitted.remove(job_id)
            st.queue_front.append(job_id)
            st.assigned.pop(job_id, None)
            r.released.extend(job.nodes)
            if job_id in st.profiles:
                self._end_profile(r, job_id, None, "preempted")
            r.note(EventKind.PREEMPTED, job_id, nodes=job.count)

    # ------------------------------------------------------------------ profiling

    def _advance_profiles(self, r: _Round, evidence: Evidence) -> None:
        st = self.state
        for job_id, session in list(st.profiles.items()):
            job = r.jobs[job_id]
            if st.assigned.get(job_id) == session.count and job.count < session.count:
                self._end_profile(r, job_id, None, "lost nodes during the profile")
                continue
            action = session.next_action(r.now, evidence.get(job_id, NO_EVIDENCE))
            if isinstance(action, StepDown):
                r.note(EventKind.PROFILE_STEP, job_id, count=action.count, previous=action.from_nodes)
            elif isinstance(action, Done):
                self._end_profile(r, job_id, action, "done")

    def _end_profile(self, r: _Round, job_id: str, done: Done | None, reason: str) -> None:
        st = self.state
        session = st.profiles.pop(job_id)
        st.profiled.add(job_id)
        measured = session.measured
        if measured:
            st.measured.setdefault(job_id, {}).update(measured)
            self._bump(job_id)
        debt = st.debts.pop(job_id, None)
        if debt is not None and debt.lender in r.jobs:
            r.returning[debt.lender] = r.returning.get(debt.lender, 0) + debt.nodes
            r.note(EventKind.RETURNED, debt.lender, nodes=debt.nodes, borrower=job_id)
        detail: dict[str, object] = {"measured": {str(n): v for n, v in sorted(measured.items())}, "reason": reason}
        if done is not None:
            detail.update(capped=list(done.capped), missing=list(done.missing))
            r.note(EventKind.PROFILE_DONE, job_id, **detail)
        else:
            r.note(EventKind.PROFILE_ABORTED, job_id, **detail)

    def _needs_profile(self, job: JobView) -> bool:
        mode = self.config.profiling
        wants = mode is Profiling.ALWAYS or (mode is Profiling.REQUESTED and job.profile)
        st = self.state
        return wants and job.id not in st.profiled and not st.measured.get(job.id)

    def _reserved(self) -> int:
        """Nodes released by profiles in progress, up to what they borrowed: held back for the lenders."""
        total = 0
        for borrower, debt in self.state.debts.items():
            s = self.state.profiles.get(borrower)
            if s is not None:
                total += min(debt.nodes, s.plan.top - s.count)
        return total

    # ------------------------------------------------------------------ admission

    def _admit(self, r: _Round, view: View) -> dict[str, str]:
        st, cfg = self.state, self.config
        admitted = set(st.admitted)
        front = [j for j in st.queue_front if j not in admitted]
        rest = sorted((j for j in r.jobs.values() if j.id not in admitted and j.id not in set(front)),
                      key=lambda j: (j.order, j.id))
        queue = front + [j.id for j in rest]
        slots = cfg.max_running or math.inf
        free_avail = max(0, view.free_count + len(r.released) - self._reserved())
        borrowed: dict[str, int] = {}
        waiting: dict[str, str] = {}
        blocked_by: str | None = None
        for job_id in queue:
            if blocked_by is not None:
                waiting[job_id] = f"behind {blocked_by} in the FCFS queue"
                continue
            if len(st.admitted) >= slots:
                waiting[job_id] = f"all {cfg.max_running} slots are taken (max_running)"
                continue
            job = r.jobs[job_id]
            if self._needs_profile(job):
                res = self._source_profile(r, job, free_avail, borrowed)
                if isinstance(res, Wait):
                    waiting[job_id] = f"waiting to be profiled: {res.reason}"
                    blocked_by = job_id
                    continue
                free_avail -= res.from_free
            st.admitted.append(job_id)
            if job_id in st.queue_front:
                st.queue_front.remove(job_id)
            r.note(EventKind.ADMITTED, job_id)
        return waiting

    def _source_profile(self, r: _Round, job: JobView, free_avail: int, borrowed: dict[str, int]):
        st, cfg = self.state, self.config
        owed = {d.lender for d in st.debts.values()}
        running: list[RunningJob] = []
        if not r.lender_used:
            for job_id in st.admitted:
                j = r.jobs[job_id]
                if j.count == 0 or job_id in owed or job_id in r.returning:
                    continue
                last = max(j.last_interrupted if j.last_interrupted is not None else -math.inf,
                           st.lent_at.get(job_id, -math.inf))
                running.append(RunningJob(job_id, max(0, j.count - borrowed.get(job_id, 0)), j.min_nodes,
                                          last, profiling=job_id in st.profiles))
        request = ProfilingRequest(job.id, job.min_nodes, job.max_nodes,
                                   profile_counts(cfg.profile_counts, job.min_nodes, job.max_nodes))
        res = choose_sources(request, free_avail, running)
        if isinstance(res, Wait):
            return res
        st.profiles[job.id] = ProfileSession(res, r.now, rel_ci=cfg.profile_rel_ci, time_cap_s=cfg.profile_time_cap_s)
        r.note(EventKind.PROFILE_START, job.id, counts=list(res.counts_desc), lender=res.lender,
               borrowed=res.borrowed)
        if res.lender is not None and res.borrowed > 0:
            st.debts[job.id] = Debt(res.lender, res.borrowed)
            st.lent_at[res.lender] = r.now
            borrowed[res.lender] = borrowed.get(res.lender, 0) + res.borrowed
            r.lender_used = True
            r.note(EventKind.LENT, res.lender, nodes=res.borrowed, borrower=job.id)
        return res

    # ------------------------------------------------------------------ allocation

    def _allocate(self, r: _Round, view: View, evidence: Evidence, waiting: dict[str, str]) -> Decision:
        st, cfg = self.state, self.config
        admitted = [r.jobs[j] for j in st.admitted]
        # a job below its min cannot run: its nodes count as free (drivers stop it anyway)
        admitted = [j if j.count >= j.min_nodes else _without_nodes(j, r) for j in admitted]
        free = r.free + sorted(r.released)
        pins = {job_id: s.count for job_id, s in st.profiles.items()}
        fixed: dict[str, tuple[str, ...]] = {}
        lender_nodes: dict[str, tuple[str, ...]] = {}
        if pins:
            lenders_for = {b: d.lender for b, d in st.debts.items() if b in pins}
            pinned = apply_pins(admitted, free, pins, lenders_for)
            fixed, lender_nodes, free = dict(pinned.fixed), dict(pinned.lenders), pinned.free
        repaid: dict[str, tuple[str, ...]] = {}
        for lender, k in r.returning.items():
            if lender in lender_nodes or lender not in st.admitted:
                continue
            lj = r.jobs[lender]
            own = lj.nodes if lj.count >= lj.min_nodes else ()  # below its min its nodes are free already
            give = free[: max(0, min(k, lj.max_nodes - len(own)))]
            if len(own) + len(give) < lj.min_nodes:
                continue  # too few to run on (a recall stopped it): the allocator places it like any job
            del free[: len(give)]
            # the repaid nodes are the lender's again from now on; the allocator then plans it like
            # any job in this same decision (so the decision after a repayment changes nothing)
            repaid[lender] = tuple(own) + tuple(give)
        reserve = min(len(free), self._reserved())
        if reserve:
            free = free[: len(free) - reserve]
        key = self._problem_key(admitted, free, evidence, pins, r)
        if key == self._noop_key:
            assignment = {j.id: j.nodes for j in admitted}
            return self._finish(r, assignment, waiting, 0.0, 0.0, "unchanged", solved=False)
        if cfg.allocation is Allocation.MILP:
            assignment, objective, seconds, method = self._solve(admitted, free, fixed, lender_nodes, repaid,
                                                                 evidence)
        else:
            counts_fn = greedy_counts if cfg.allocation is Allocation.GREEDY else equal_counts
            counts = counts_fn(admitted, min(view.free_count, len(free)))
            assignment, objective, seconds, method = node_map(admitted, free, counts), 0.0, 0.0, cfg.allocation.value
        unchanged = all(set(assignment.get(j.id, ())) == set(j.nodes) for j in admitted)
        self._noop_key = key if unchanged else None
        return self._finish(r, assignment, waiting, objective, seconds, method, solved=True)

    def _solve(self, admitted: list[JobView], free: list[str], fixed: dict[str, tuple[str, ...]],
               lender_nodes: dict[str, tuple[str, ...]], repaid: dict[str, tuple[str, ...]], evidence: Evidence):
        """``lender_nodes``: what lenders keep in this decision; ``repaid``: lenders' nodes after repayment."""
        st, cfg = self.state, self.config
        owed = {d.lender for d in st.debts.values()}
        others = [evidence[j.id] for j in admitted if j.id in evidence]
        guess = None
        jobs: list[Job] = []
        for j in admitted:
            if j.id in fixed:
                continue
            nodes = lender_nodes.get(j.id, repaid.get(j.id, j.nodes))
            capped = j.id in lender_nodes or j.id in owed  # a lender may shrink, not grow, while owed
            if capped and not nodes:
                fixed[j.id] = ()
                continue
            if guess is None:
                guess = beliefs.guess_per_node(st.measured.values(), st.population)
            curve = self._curve(j, guess)
            up, down = beliefs.rescale_costs(evidence.get(j.id), others, cfg)
            lo, hi = (min(j.min_nodes, len(nodes)), len(nodes)) if capped else (j.min_nodes, j.max_nodes)
            jobs.append(self._alloc_job(j, lo, hi, curve, tuple(nodes), up, down))
        plan = solve(Problem(tuple(jobs), tuple(free), cfg.tfwd_s), method=cfg.method)
        assignment = dict(plan.assignment)
        assignment.update(fixed)
        return assignment, plan.objective, plan.solve_seconds, plan.method

    def _curve(self, job: JobView, guess: float) -> dict[int, float]:
        st = self.state
        uses_guess = not job.scaling and self.config.prior is None and not st.measured.get(job.id)
        key = (self._versions.get(job.id, 0), job.min_nodes, job.max_nodes, guess if uses_guess else None)
        hit = self._curves.get(job.id)
        if hit is not None and hit[0] == key:
            return hit[1]
        scal = self.scalability(job, guess)
        curve = beliefs.allocator_curve(job, scal)
        self._curves[job.id] = (key, curve)
        return curve

    def believed_curve(self, job: JobView) -> dict[int, float]:
        """The curve the allocator is given for ``job`` now (cached while nothing changes)."""
        return self._curve(job, beliefs.guess_per_node(self.state.measured.values(), self.state.population))

    def scalability(self, job: JobView, guess: float | None = None) -> Scalability:
        """What the policy believes about ``job`` now."""
        st = self.state
        if guess is None:
            guess = beliefs.guess_per_node(st.measured.values(), st.population)
        return beliefs.scalability(job, st.measured.get(job.id, {}), self.config.prior_curve, guess)

    def _alloc_job(self, j: JobView, lo: int, hi: int, curve: dict[int, float], nodes: tuple[str, ...],
                   up: float, down: float) -> Job:
        key = (lo, hi, id(curve), nodes, up, down)
        hit = self._alloc_jobs.get(j.id)
        if hit is not None and hit[0] == key:
            return hit[1]
        built = Job(j.id, lo, hi, curve, nodes, up, down)
        self._alloc_jobs[j.id] = (key, built)
        return built

    def _problem_key(self, admitted: list[JobView], free: list[str], evidence: Evidence,
                     pins: Mapping[str, int], r: _Round) -> tuple:
        room = sum(j.max_nodes - j.count for j in admitted)
        costs = tuple((e.costs.n_up, e.costs.n_down) if (e := evidence.get(j.id)) is not None and e.costs else None
                      for j in admitted)
        versions = tuple(self._versions.get(j.id, 0) for j in admitted)
        return (tuple((j.id, j.count) for j in admitted), min(room, len(free)), versions, costs,
                tuple(sorted(pins.items())), tuple(sorted(r.returning.items())),
                tuple(sorted((b, d.lender, d.nodes) for b, d in self.state.debts.items())),
                r.released != [])

    def _finish(self, r: _Round, assignment: Mapping[str, tuple[str, ...]], waiting: dict[str, str],
                objective: float, seconds: float, method: str, solved: bool) -> Decision:
        st = self.state
        full = {job_id: tuple(assignment.get(job_id, ())) for job_id in st.admitted}
        st.assigned = {job_id: len(nodes) for job_id, nodes in full.items()}
        deadlines = [s.step_deadline for s in st.profiles.values()]
        return Decision(
            now=r.now, assignment=full, admitted=tuple(st.admitted), waiting=waiting,
            profiling={job_id: s.count for job_id, s in st.profiles.items()}, events=tuple(r.events),
            wake_at=min(deadlines) if deadlines else None, watch=tuple(st.profiles),
            objective=objective, solve_seconds=seconds, method=method, solved=solved,
        )


def _without_nodes(job: JobView, r: _Round) -> JobView:
    # a job preempted in this round (and re-admitted from the queue front) was released already
    r.released.extend(n for n in job.nodes if n not in r.released)
    return JobView(job.id, job.min_nodes, job.max_nodes, (), job.order, job.last_interrupted, job.scaling, job.profile)


def evidence_from(rates: Mapping[int, object], rescale_events: object = None) -> JobEvidence:
    """Evidence from a throughput estimator's ``estimates()`` and a list of rescale events (both drivers)."""
    from profiler.estimators import summarize_rescales

    costs = summarize_rescales(rescale_events) if rescale_events else None  # type: ignore[arg-type]
    return JobEvidence(dict(rates), costs)  # type: ignore[arg-type]
