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
* **Gated profiling** (``profiling = "gated"``, the default): a job the user did not ask to profile
  is profiled only when it pays (:meth:`Policy._profile_pays`): its curve is still a prior, nodes
  are scarce for the admitted jobs (they could absorb more than there is), the job's remaining
  work is not short, and the expected gain (``profile_gain_fraction`` x the prior's spread at the
  count it is expected to get x its remaining work) exceeds the profile's cost (the scale-up
  pause, the step-down pauses and the nodes held above that count while it profiles). A gated
  profile takes free nodes only (never a lender), ends at the count the job is expected to get
  (not at its min), and never blocks the queue: a job that cannot be profiled now runs and
  learns passively.
* **Adaptive admission** (``admission = "adaptive"``, the default): Pjmax is a floor. While the
  held and free nodes exceed what the admitted jobs can absorb (:meth:`Policy.absorbs`: a job's
  max, or the knee of its believed curve, ``admission_knee``) by at least a queued job's min, that job is admitted
  too (FCFS, up to ``admission_cap`` jobs in all). When nodes go,
  the newest jobs admitted beyond Pjmax give way first: a job whose min no longer fits beside
  what the others can absorb is **suspended** (its nodes freed, its progress kept, the front of
  the queue, so it is resumed first when nodes return).
* **Budgets and deadlines**: a job that has used its ``budget_node_hours`` is stopped (an
  ``over_budget`` event and ``Decision.stop``) and never admitted again; a running job with a
  budget is given no more nodes than its remaining budget pays for over the horizon, and the
  decision asks to be called again before the budget runs out. A job whose deadline can still be
  met at its max, but not at its present count, has its rate weighted by ``deadline_weight``.
* **Curves and costs**: :mod:`policy.beliefs`.
* **Objective** (``objective = "work"``, the default): the allocator maximises work, each job's
  rate in 1-node equivalents (``rate(n) / rate(1)`` on its believed curve), so a job that trains
  many cheap samples does not crowd out one that trains few costly ones; ``"samples"`` maximises
  raw samples/s (the paper's).
* **Allocation**: the exact allocator over the admitted jobs that are not pinned by a profile,
  with horizon ``tfwd_s`` or, with ``horizon = "learned"``, the expected remaining idle time of
  the nodes on offer (:mod:`policy.valuation`), or the greedy / equal baselines.

A decision whose inputs equal those of the last decision that changed nothing is answered
"no change" without running the allocator (the answer would be the same).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

from allocator import Job, Problem, solve, throughput_at
from policy import beliefs
from policy.allocation import apply_pins, equal_counts, greedy_counts, node_map
from policy.config import Admission, Allocation, Horizon, Objective, PolicyConfig, PolicyConfigError, Profiling
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
from policy.state import FRAGMENTS_KEEP, POPULATION_KEEP, SHAPES_KEEP, Debt, PolicyState
from policy.valuation import FragmentModel, learned_horizon
from profiler.jpa import (Done, ProfileSession, ProfilingRequest, RunningJob, StepDown, Wait, choose_sources,
                          default_counts)
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

    def __init__(self, view: View, canonical: dict[str, tuple[JobView, JobView]], held: _HeldNodes) -> None:
        self.now = view.now
        self.jobs: dict[str, JobView] = {}
        # node order is canonical (sorted names), so a decision never depends on how a driver
        # happens to list nodes: which nodes a shrinking job or a lender gives up, which free
        # nodes a growing job takes
        self.free = sorted(view.free_nodes)
        if not held.all_once(view):
            _name_the_duplicate(view)
        for j in view.jobs:
            if j.id in self.jobs:
                raise PolicyInputError(f"job {j.id} is listed twice in the view")
            hit = canonical.get(j.id)
            if hit is None or hit[0] is not j:  # a driver that shows the same job view (or the same
                # nodes, in order) again is not sorted again
                if hit is not None and hit[1].nodes is j.nodes:
                    hit = canonical[j.id] = (j, j)
                else:
                    nodes = tuple(sorted(j.nodes))
                    hit = canonical[j.id] = (j, j if nodes == j.nodes else replace(j, nodes=nodes))
            self.jobs[j.id] = hit[1]
        self.events: list[PolicyEvent] = []
        self.returning: dict[str, int] = {}
        self.released: list[str] = []  # nodes of jobs stopped under their min, free from now on
        self.lender_used = False
        self.stop: dict[str, str] = {}  # jobs the driver must end, with the reason
        self.weights: dict[str, float] = {}  # deadline weights of this decision
        self.absorb: int | None = None  # what the admitted jobs absorb, once the suspensions summed it
        # every node the driver holds: free (the real count) plus the admitted and queued jobs' nodes
        self.total_nodes = view.free_count + sum(j.count for j in view.jobs)

    def note(self, kind: EventKind, job: str, **detail: object) -> None:
        self.events.append(PolicyEvent(kind, job, detail))


class _HeldNodes:
    """Every node the jobs of the last view held, and whose it was: a view is checked for a node
    listed twice job by job, so a job showing the same node tuple as last time costs nothing (a view
    of a thousand running nodes is mostly that)."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[str, ...]] = {}  # job -> the node tuple checked (held: never reused)
        self.owner: dict[str, str] = {}  # node -> job

    def all_once(self, view: View) -> bool:
        """True if no node is listed twice in ``view`` (free, or any job's); False forgets everything."""
        ids = {j.id for j in view.jobs}
        changed = [j for j in view.jobs if self.nodes.get(j.id) is not j.nodes]
        for job_id in [k for k in self.nodes if k not in ids] + [j.id for j in changed]:
            for node in self.nodes.pop(job_id, ()):
                del self.owner[node]
        owner = self.owner
        for j in changed:
            for node in j.nodes:
                if node in owner:  # another job's, or twice in this one's
                    return self._forget()
                owner[node] = j.id
            self.nodes[j.id] = j.nodes
        free = view.free_nodes
        if len(set(free)) != len(free) or any(node in owner for node in free):
            return self._forget()
        return True

    def _forget(self) -> bool:
        self.nodes.clear()
        self.owner.clear()
        return False


def _name_the_duplicate(view: View) -> None:
    """Raise the error naming what a view lists twice (a free node, or a node of some job)."""
    seen: set[str] = set(view.free_nodes)
    if len(seen) != len(view.free_nodes):
        raise PolicyInputError("a free node is listed twice in the view")
    ids: set[str] = set()
    for j in view.jobs:
        if j.id in ids:
            raise PolicyInputError(f"job {j.id} is listed twice in the view")
        ids.add(j.id)
        if seen.intersection(j.nodes) or len(set(j.nodes)) != len(j.nodes):
            raise PolicyInputError(f"job {j.id}: a node is listed twice in the view (free or another job's)")
        seen.update(j.nodes)


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
        self._raw: dict[str, tuple[tuple, dict[int, float]]] = {}
        self._absorbs: dict[str, tuple[dict[int, float], int]] = {}
        self._noop_key: tuple | None = None
        self._shapes_version = 0
        self._pooled: tuple[tuple, dict[int, float] | None] | None = None
        self._fragments: tuple[int, FragmentModel] | None = None
        self._fragments_version = 0
        self._guess: float | None = None  # guess_per_node within one decision (None: compute it)
        self._points_epoch = 0  # bumped whenever some job's measured points change
        self._guessed: tuple[dict, list, tuple, float] | None = None  # the last guess and what it was made of
        self._absorbs_fresh = False  # True once a decision's curves can no longer change
        self._absorbs_checked: set[str] = set()  # jobs whose absorbs() was checked since then
        self._curve_checked: set[str] = set()  # jobs whose unweighted curve was looked up since then
        self._population: tuple[tuple, list[float]] | None = None  # the population's rates > 0, sorted
        self._population_version = 0
        self._learned: dict[str, tuple[JobEvidence, int]] = {}  # evidence last learned from, at which version
        self._views: dict[str, tuple[JobView, JobView]] = {}  # a driver's job view -> it with sorted nodes
        self._held = _HeldNodes()  # the nodes of the last view, checked
        self._seen: tuple[PolicyState, dict[str, JobView]] | None = None  # the last decision's state and jobs

    # ------------------------------------------------------------------ the decision

    def decide(self, view: View, evidence: Evidence) -> Decision:
        r = _Round(view, self._views, self._held)
        self._guess = None
        try:
            self._forget_departed(r)
            self._observe_fragments(view)
            self._learn(r, evidence)
            self._preemptions(r)
            self._budgets(r)
            self._advance_profiles(r, evidence)
            self._absorbs_fresh = True  # curves stay as they are for the rest of the decision
            self._suspensions(r)
            waiting = self._admit(r, view)
            return self._allocate(r, view, evidence, waiting)
        finally:
            self._absorbs_fresh = False
            self._absorbs_checked.clear()
            self._curve_checked.clear()
            self._guess = None  # outside a decision the state may change under us: computed afresh

    def guess(self) -> float:
        """The population's per-node rate (:func:`beliefs.guess_per_node`), looked up once per decision
        (every place that changes the measured points or the population drops it) and computed again
        only when the points or the population changed since it was last computed."""
        if self._guess is None:
            st = self.state
            key = (id(st.population), len(st.population), self._population_version)
            if self._population is None or self._population[0] != key:
                self._population = (key, sorted(r for r in st.population if r > 0))
            sizes = (len(st.measured), len(st.population), self._population_version, self._points_epoch)
            last = self._guessed
            if last is None or last[0] is not st.measured or last[1] is not st.population or last[2] != sizes:
                last = self._guessed = (st.measured, st.population, sizes,
                                        beliefs.guess_per_node(st.measured.values(), st.population,
                                                               self._population[1]))
            self._guess = last[3]
        return self._guess

    # ------------------------------------------------------------------ bookkeeping

    def _forget_departed(self, r: _Round) -> None:
        st, jobs = self.state, r.jobs
        seen, self._seen = self._seen, (st, jobs)
        if seen is not None and seen[0] is st and seen[1].keys() <= jobs.keys():
            return  # no job left since the last decision of this state (which names only its jobs)
        st.admitted = [j for j in st.admitted if j in jobs]
        st.queue_front = [j for j in st.queue_front if j in jobs and j not in st.admitted]
        st.assigned = {k: v for k, v in st.assigned.items() if k in jobs}
        st.profiles = {k: s for k, s in st.profiles.items() if k in jobs}
        st.debts = {b: d for b, d in st.debts.items() if b in jobs and d.lender in jobs}
        st.lent_at = {k: v for k, v in st.lent_at.items() if k in jobs}
        st.profiled = {j for j in st.profiled if j in jobs}
        st.over_budget = {j for j in st.over_budget if j in jobs}
        pop = st.population
        for job_id in [k for k in st.measured if k not in jobs]:
            pts = st.measured.pop(job_id)
            if pts:
                n = min(pts)
                pop.append(pts[n] / n)
                self._population_version += 1  # guess() sorts it again
                shape = beliefs.shape_of(pts)
                if shape is not None:
                    st.shapes.append(shape)
                    del st.shapes[:-SHAPES_KEEP]
                    self._shapes_version += 1
            self._versions.pop(job_id, None)
            self._curves.pop(job_id, None)
            self._raw.pop(job_id, None)
            self._absorbs.pop(job_id, None)
            self._alloc_jobs.pop(job_id, None)
            self._learned.pop(job_id, None)
        del pop[:-POPULATION_KEEP]
        self._guess = None
        for cache in (self._curves, self._raw, self._absorbs, self._alloc_jobs, self._learned, self._views):
            if len(cache) > 2 * len(jobs) + 64:  # jobs that left without a measured point
                for k in [k for k in cache if k not in jobs]:
                    del cache[k]

    def _observe_fragments(self, view: View) -> None:
        if view.ended_fragments:
            frags = self.state.fragments
            frags.extend(float(x) for x in view.ended_fragments if x >= 0 and math.isfinite(x))
            del frags[:-FRAGMENTS_KEEP]
            self._fragments_version += 1

    def fragment_model(self) -> FragmentModel:
        hit = self._fragments
        if hit is None or hit[0] != self._fragments_version:
            hit = (self._fragments_version, FragmentModel(self.state.fragments))
            self._fragments = hit
        return hit[1]

    def _budgets(self, r: _Round) -> None:
        """A job that has used its budget is stopped and never admitted again."""
        st = self.state
        for job in r.jobs.values():
            if job.budget_node_hours is None or job.id in st.over_budget:
                continue
            if job.used_node_hours >= job.budget_node_hours:
                st.over_budget.add(job.id)
                if job.id in st.admitted:
                    st.admitted.remove(job.id)
                    st.assigned.pop(job.id, None)
                    if job.id in st.profiles:
                        self._end_profile(r, job.id, None, "over budget")
                if job.id in st.queue_front:
                    st.queue_front.remove(job.id)
                r.released.extend(n for n in job.nodes if n not in r.released)
                r.note(EventKind.OVER_BUDGET, job.id, used_node_hours=job.used_node_hours,
                       budget_node_hours=job.budget_node_hours)
        for job_id in st.over_budget:
            r.stop[job_id] = "over its budget_node_hours"

    def _suspensions(self, r: _Round) -> None:
        """Adaptive admission: the newest jobs admitted beyond Pjmax give way first when nodes go."""
        st, cfg = self.state, self.config
        if cfg.admission is not Admission.ADAPTIVE or not cfg.max_running or len(st.admitted) <= cfg.max_running:
            return  # no job beyond Pjmax to give way
        absorb = sum(self.absorbs(r.jobs[j]) for j in st.admitted)
        for job_id in reversed(st.admitted[cfg.max_running:]):
            job = r.jobs[job_id]
            others = absorb - self.absorbs(job)
            if job_id in st.profiles or r.total_nodes - others >= job.min_nodes:
                break
            st.admitted.remove(job_id)
            st.queue_front.insert(0, job_id)
            st.assigned.pop(job_id, None)
            r.released.extend(n for n in job.nodes if n not in r.released)
            absorb = others
            r.note(EventKind.SUSPENDED, job_id, nodes=job.count)
        r.absorb = absorb

    def absorbs(self, job: JobView) -> int:
        """The nodes ``job`` can put to use: its max, or the count past which its believed curve gains
        less than ``admission_knee`` of its per-node rate at its min for each further node (a job
        past its knee wastes nodes another job would use better)."""
        hit = self._absorbs.get(job.id)
        if hit is not None and job.id in self._absorbs_checked:
            return hit[1]  # checked in this decision, past learning and profiles: its curve is the same
        curve = self.believed_curve(job)
        if self._absorbs_fresh:
            self._absorbs_checked.add(job.id)
        if hit is not None and hit[0] is curve:
            return hit[1]
        counts = sorted(n for n in curve if job.min_nodes <= n <= job.max_nodes)
        value = job.max_nodes
        knee = self.config.admission_knee
        if knee > 0 and len(counts) >= 2 and curve[counts[0]] > 0:
            floor = knee * curve[counts[0]] / counts[0]
            for a, b in zip(counts, counts[1:]):
                if (curve[b] - curve[a]) / (b - a) < floor:
                    value = a
                    break
        self._absorbs[job.id] = (curve, value)
        return value

    def _bump(self, job_id: str) -> None:
        self._versions[job_id] = self._versions.get(job_id, 0) + 1
        self._points_epoch += 1
        self._guess = None  # its measured points changed

    def _learn(self, r: _Round, evidence: Evidence) -> None:
        if not self.config.learn:
            return
        st = self.state
        for job_id, ev in evidence.items():
            job = r.jobs.get(job_id)
            if job is None or job_id in st.profiles or not ev.rates:
                continue
            seen = self._learned.get(job_id)
            if seen is not None and seen[0] is ev and seen[1] == self._versions.get(job_id, 0):
                continue  # the same evidence against the same points: nothing new (a driver's monitor
                # hands the same object again while no record arrived)
            new = beliefs.accept(ev, st.measured.get(job_id, {}), job, self.config)
            if new:
                st.measured.setdefault(job_id, {}).update(new)
                self._bump(job_id)
                r.note(EventKind.REFINED, job_id, points={str(n): v for n, v in sorted(new.items())})
            self._learned[job_id] = (ev, self._versions.get(job_id, 0))

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
        """Profiled the JPA's way (may borrow, blocks the queue until it can be sourced)."""
        mode = self.config.profiling
        wants = mode is Profiling.ALWAYS or (mode in (Profiling.REQUESTED, Profiling.GATED) and job.profile)
        st = self.state
        return wants and job.id not in st.profiled and not st.measured.get(job.id)

    def expected_count(self, r: _Round, job: JobView, n_jobs: int) -> int:
        """The count the allocator is expected to give ``job`` among ``n_jobs`` admitted jobs: an even
        share of every held node, within its range."""
        share = r.total_nodes // max(1, n_jobs)
        return max(job.min_nodes, min(job.max_nodes, share))

    def _profile_pays(self, r: _Round, job: JobView, free_avail: int) -> int | None:
        """Gated profiling: the count a profile of ``job`` should end at, or None when it does not pay."""
        st, cfg = self.state, self.config
        if cfg.profiling is not Profiling.GATED or job.profile or job.id in st.profiled or st.measured.get(job.id):
            return None
        admitted = [r.jobs[j] for j in st.admitted]
        absorb = sum(j.max_nodes for j in admitted) + job.max_nodes
        if absorb <= r.total_nodes:
            return None  # nodes are not scarce: every job gets its max whatever its curve
        end = self.expected_count(r, job, len(admitted) + 1)
        if end >= job.max_nodes or free_avail <= end:
            return None  # nothing to choose between, or the free pool cannot serve the profile
        curve = self.believed_curve(job)
        rate_end = throughput_at(curve, end)
        if rate_end <= 0:
            return None
        work_left = job.work_left
        if work_left is not None and work_left / throughput_at(curve, job.max_nodes) < cfg.profile_min_work_s:
            return None  # a short job: not worth a profile
        spread = self._prior_spread(end, curve)
        top = min(job.max_nodes, free_avail)
        steps = len([c for c in default_counts(job.min_nodes, job.max_nodes) if end < c <= top]) + 1
        step_s = min(cfg.profile_time_cap_s, 60.0)
        per_node = rate_end / end
        cost = (cfg.default_up_cost_s + steps * cfg.default_down_cost_s) * throughput_at(curve, top) \
            + (top - end) * per_node * steps * step_s / 2.0
        horizon = work_left / rate_end if work_left is not None else cfg.horizon_max_s
        gain = cfg.profile_gain_fraction * spread * rate_end * horizon
        return end if gain > cost else None

    def _prior_spread(self, n: int, curve: Mapping[int, float]) -> float:
        """How unsure the prior is at ``n``: the relative spread (p90 - p10 over the median) of the
        population's efficiencies there, else how far the believed curve is from linear."""
        effs = sorted(e for sh in self.state.shapes if (e := beliefs._efficiency_at(sh, n)) is not None)
        if len(effs) >= beliefs.MIN_SHAPES:
            mid = effs[len(effs) // 2]
            return (effs[int(0.9 * (len(effs) - 1))] - effs[int(0.1 * (len(effs) - 1))]) / mid if mid > 0 else 0.0
        lo = min(curve)
        linear = throughput_at(curve, lo) / lo * n
        return max(0.0, 1.0 - throughput_at(curve, n) / linear) if linear > 0 else 0.0

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
        placed = admitted.union(front)
        rest = sorted((j for j in r.jobs.values() if j.id not in placed), key=lambda j: (j.order, j.id))
        queue = front + [j.id for j in rest]
        slots = cfg.max_running or math.inf
        adaptive = cfg.admission is Admission.ADAPTIVE and cfg.max_running > 0
        cap = cfg.admission_cap or math.inf
        absorb: int | None = None  # what the admitted jobs absorb; summed when a job beyond Pjmax is weighed
        free_avail = max(0, view.free_count + len(r.released) - self._reserved())
        borrowed: dict[str, int] = {}
        waiting: dict[str, str] = {}
        blocked_by: str | None = None
        extra_closed = False
        for job_id in queue:
            if job_id in st.over_budget:
                waiting[job_id] = "over its budget_node_hours"
                continue
            if blocked_by is not None:
                waiting[job_id] = f"behind {blocked_by} in the FCFS queue"
                continue
            job = r.jobs[job_id]
            extra = len(st.admitted) >= slots
            if extra:
                if absorb is None:  # summed by the suspensions already, if they weighed any job
                    absorb = r.absorb
                    if absorb is None:
                        absorb = sum(self.absorbs(r.jobs[j]) for j in st.admitted) if adaptive else 0
                surplus = r.total_nodes - self._reserved() - absorb
                if extra_closed or not adaptive or len(st.admitted) >= cap or surplus < job.min_nodes:
                    waiting[job_id] = f"all {cfg.max_running} slots are taken (max_running)"
                    extra_closed = True  # FCFS beyond Pjmax too: no smaller job slips past
                    continue
            if not extra and self._needs_profile(job):
                res = self._source_profile(r, job, free_avail, borrowed)
                if isinstance(res, Wait):
                    waiting[job_id] = f"waiting to be profiled: {res.reason}"
                    blocked_by = job_id
                    continue
                free_avail -= res.from_free
            elif not extra and (end := self._profile_pays(r, job, free_avail)) is not None:
                res = self._source_profile(r, job, free_avail, borrowed, end=end)
                if not isinstance(res, Wait):
                    free_avail -= res.from_free
            if adaptive and absorb is not None:
                absorb += self.absorbs(job)
            st.admitted.append(job_id)
            if job_id in st.queue_front:
                st.queue_front.remove(job_id)
            r.note(EventKind.ADMITTED, job_id)
        return waiting

    def _source_profile(self, r: _Round, job: JobView, free_avail: int, borrowed: dict[str, int],
                        end: int | None = None):
        """Start ``job``'s profile; ``end`` (gated): free nodes only, stepping down to ``end``."""
        st, cfg = self.state, self.config
        owed = {d.lender for d in st.debts.values()}
        running: list[RunningJob] = []
        if not r.lender_used and end is None:
            for job_id in st.admitted:
                j = r.jobs[job_id]
                if j.count == 0 or job_id in owed or job_id in r.returning:
                    continue
                last = max(j.last_interrupted if j.last_interrupted is not None else -math.inf,
                           st.lent_at.get(job_id, -math.inf))
                running.append(RunningJob(job_id, max(0, j.count - borrowed.get(job_id, 0)), j.min_nodes,
                                          last, profiling=job_id in st.profiles))
        counts = profile_counts(cfg.profile_counts, job.min_nodes, job.max_nodes)
        if end is not None:
            base = counts if counts is not None else default_counts(job.min_nodes, job.max_nodes)
            counts = tuple(sorted({c for c in base if c > end} | {end}))
        request = ProfilingRequest(job.id, job.min_nodes, job.max_nodes, counts)
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
        horizon = self._horizon(view, free, admitted)
        r.weights = self._deadline_weights(admitted, r.now)
        # the inputs of the last decision that changed nothing, if it did (the solve below changes none
        # of them, so its key is made after it, and only then)
        key = None
        if self._noop_key is not None:
            key = self._problem_key(admitted, free, evidence, pins, r, horizon)
            if key == self._noop_key:
                assignment = {j.id: j.nodes for j in admitted}
                return self._finish(r, assignment, waiting, 0.0, 0.0, "unchanged", solved=False, horizon=horizon)
        if cfg.allocation is Allocation.MILP:
            assignment, objective, seconds, method = self._solve(admitted, free, fixed, lender_nodes, repaid,
                                                                 evidence, horizon, r)
        else:
            counts_fn = greedy_counts if cfg.allocation is Allocation.GREEDY else equal_counts
            counts = counts_fn(admitted, min(view.free_count, len(free)))
            assignment, objective, seconds, method = node_map(admitted, free, counts), 0.0, 0.0, cfg.allocation.value
        unchanged = all(_same_nodes(assignment.get(j.id, ()), j.nodes) for j in admitted)
        if unchanged and key is None:
            key = self._problem_key(admitted, free, evidence, pins, r, horizon)
        self._noop_key = key if unchanged else None
        return self._finish(r, assignment, waiting, objective, seconds, method, solved=True, horizon=horizon)

    def _horizon(self, view: View, free: list[str], admitted: list[JobView]) -> float:
        cfg = self.config
        if cfg.horizon is Horizon.TFWD:
            return cfg.tfwd_s
        nodes = free if free else [n for j in admitted for n in j.nodes]
        return learned_horizon(nodes, view.now, view.idle_since, view.recall_at, self.fragment_model(),
                               cfg.horizon_min_s, cfg.horizon_max_s, cfg.tfwd_s)

    def _deadline_weights(self, admitted: list[JobView], now: float) -> dict[str, float]:
        """``deadline_weight`` for each job whose deadline can be met at its max but not at its count."""
        w = self.config.deadline_weight
        out: dict[str, float] = {}
        if w == 1.0:
            return out
        for j in admitted:
            if j.deadline is None or j.work_left is None:
                continue
            curve = self.believed_curve(j)
            left = j.deadline - now
            fast = throughput_at(curve, j.max_nodes)
            now_rate = throughput_at(curve, j.count) if j.count else 0.0
            if fast > 0 and j.work_left <= fast * left and (now_rate <= 0 or j.work_left > now_rate * left):
                out[j.id] = w
        return out

    def _solve(self, admitted: list[JobView], free: list[str], fixed: dict[str, tuple[str, ...]],
               lender_nodes: dict[str, tuple[str, ...]], repaid: dict[str, tuple[str, ...]], evidence: Evidence,
               horizon: float, r: _Round):
        """``lender_nodes``: what lenders keep in this decision; ``repaid``: lenders' nodes after repayment."""
        st, cfg = self.state, self.config
        owed = {d.lender for d in st.debts.values()}
        others = [evidence[j.id] for j in admitted if j.id in evidence]
        guess = None
        pooled_costs = beliefs.pooled_rescale_costs(others, cfg)  # once, not once per job
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
                guess = self.guess()
            curve = self._curve(j, guess, r.weights.get(j.id, 1.0))
            up, down = beliefs.rescale_costs(evidence.get(j.id), others, cfg, pooled_costs)
            lo, hi = (min(j.min_nodes, len(nodes)), len(nodes)) if capped else (j.min_nodes, j.max_nodes)
            if j.budget_node_hours is not None:  # no more nodes than the rest of the budget pays for
                left_s = max(0.0, j.budget_node_hours - j.used_node_hours) * 3600.0
                hi = max(lo, min(hi, int(left_s // horizon)))
            jobs.append(self._alloc_job(j, lo, hi, curve, tuple(nodes), up, down))
        # the jobs can grow by at most their room, and a growing job takes the first free nodes: the
        # rest of a large idle pool changes no plan, only what the problem costs to build and check
        room = sum(max(0, j.max_nodes - j.current) for j in jobs)
        # nodes_checked: every node list here comes from the view _Round checked, split without repeats
        plan = solve(Problem(tuple(jobs), tuple(free[:room]), horizon, nodes_checked=True), method=cfg.method)
        assignment = dict(plan.assignment)
        assignment.update(fixed)
        return assignment, plan.objective, plan.solve_seconds, plan.method

    def _curve(self, job: JobView, guess: float, weight: float = 1.0) -> dict[int, float]:
        settled = self._absorbs_fresh and weight == 1.0
        if settled and job.id in self._curve_checked:
            return self._curves[job.id][1]  # looked up in this decision, past anything that changes it
        st = self.state
        uses_pool = not job.scaling and self.config.prior is None
        uses_guess = uses_pool and not st.measured.get(job.id)
        key = (self._versions.get(job.id, 0), job.min_nodes, job.max_nodes, guess if uses_guess else None,
               self._shapes_version if uses_pool else None, weight)
        hit = self._curves.get(job.id)
        if settled:
            self._curve_checked.add(job.id)
        else:
            self._curve_checked.discard(job.id)  # the entry below is for another weight
        if hit is not None and hit[0] == key:
            return hit[1]
        raw = beliefs.allocator_curve(job, self.scalability(job, guess))
        curve = raw
        if self.config.objective is Objective.WORK:  # in 1-node equivalents: rate(n) / rate(1)
            one = throughput_at(raw, 1)
            curve = {n: v / one for n, v in raw.items()} if one > 0 else raw
        if weight != 1.0:
            curve = {n: v * weight for n, v in curve.items()}
        self._curves[job.id] = (key, curve)
        self._raw[job.id] = (key[:5], raw)
        return curve

    def pooled_prior(self, guess: float) -> dict[int, float] | None:
        """The population prior pooled from the shapes of the jobs that finished (cached)."""
        key = (self._shapes_version, len(self.state.shapes), guess)
        if self._pooled is None or self._pooled[0] != key:
            self._pooled = (key, beliefs.pooled_prior(self.state.shapes, guess))
        return self._pooled[1]

    def believed_curve(self, job: JobView) -> dict[int, float]:
        """What the policy believes ``job`` trains at each count (samples/s; cached while nothing changes).
        The allocator is given this curve, in 1-node equivalents with ``objective = "work"``."""
        guess = self._guess  # (looked up once per decision: spare the call)
        self._curve(job, guess if guess is not None else self.guess())
        return self._raw[job.id][1]

    def scalability(self, job: JobView, guess: float | None = None) -> Scalability:
        """What the policy believes about ``job`` now."""
        st = self.state
        if guess is None:
            guess = self.guess()
        pooled = self.pooled_prior(guess) if not job.scaling and self.config.prior is None else None
        return beliefs.scalability(job, st.measured.get(job.id, {}), self.config.prior_curve, guess, pooled)

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
                     pins: Mapping[str, int], r: _Round, horizon: float) -> tuple:
        """What a decision's plan depends on, beyond the state: equal keys, equal plans."""
        room = sum(j.max_nodes - j.count for j in admitted)
        costs = tuple((e.costs.n_up, e.costs.n_down) if (e := evidence.get(j.id)) is not None and e.costs else None
                      for j in admitted)
        versions = tuple(self._versions.get(j.id, 0) for j in admitted)
        return (tuple((j.id, j.count) for j in admitted), min(room, len(free)), versions, costs,
                tuple(sorted(pins.items())), tuple(sorted(r.returning.items())),
                tuple(sorted((b, d.lender, d.nodes) for b, d in self.state.debts.items())),
                r.released != [], horizon, tuple(sorted(r.weights.items())))

    def _finish(self, r: _Round, assignment: Mapping[str, tuple[str, ...]], waiting: dict[str, str],
                objective: float, seconds: float, method: str, solved: bool, horizon: float = 0.0) -> Decision:
        st = self.state
        full = {job_id: tuple(assignment.get(job_id, ())) for job_id in st.admitted}
        st.assigned = {job_id: len(nodes) for job_id, nodes in full.items()}
        deadlines = [s.step_deadline for s in st.profiles.values()]
        for job_id, nodes in full.items():  # decide again when a budget runs out
            j = r.jobs[job_id]
            if j.budget_node_hours is not None and nodes:
                left_s = max(0.0, j.budget_node_hours - j.used_node_hours) * 3600.0
                deadlines.append(r.now + left_s / len(nodes))
        return Decision(
            now=r.now, assignment=full, admitted=tuple(st.admitted), waiting=waiting,
            profiling={job_id: s.count for job_id, s in st.profiles.items()}, events=tuple(r.events),
            wake_at=min(deadlines) if deadlines else None, watch=tuple(st.profiles),
            objective=objective, solve_seconds=seconds, method=method, solved=solved,
            stop=dict(r.stop), horizon_s=horizon,
        )


def _same_nodes(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    return a is b or (len(a) == len(b) and (a == b or set(a) == set(b)))


def _without_nodes(job: JobView, r: _Round) -> JobView:
    # a job preempted in this round (and re-admitted from the queue front) was released already
    r.released.extend(n for n in job.nodes if n not in r.released)
    return replace(job, nodes=())


def evidence_from(rates: Mapping[int, object], rescale_events: object = None) -> JobEvidence:
    """Evidence from a throughput estimator's ``estimates()`` and the rescale events seen (both
    drivers): a list of them, or a :class:`profiler.estimators.RescaleSummary` kept as they came."""
    from profiler.estimators import RescaleSummary, summarize_rescales

    if not rescale_events:
        costs = None
    elif isinstance(rescale_events, RescaleSummary):
        costs = rescale_events.costs()
    else:
        costs = summarize_rescales(rescale_events)  # type: ignore[arg-type]
    return JobEvidence(dict(rates), costs)  # type: ignore[arg-type]
