"""The one place decisions are made: ``Policy.decide(view, evidence) -> Decision``.

The daemon (real clock) and the simulator (simulated clock) both call this; neither holds a rule
of its own about admission, profiling, lending, curves or costs. Each rule is settled once, here:

* **Admission: FCFS with Pjmax and batch admission** (MalleTrain §3.2). Up to ``max_running`` jobs
  hold a slot; all free slots are filled in one decision, in queue order. A job that cannot start
  (its profile cannot be sourced) waits at the head and **blocks the jobs behind it**: FCFS, as
  the chapter says, so a big job is not starved by small ones slipping past. A profiling job holds
  a slot like any other. A job a recall takes below its ``min_nodes`` (:func:`policy.ledger.below_min`,
  the one rule; the driver's ledger frees its nodes) is stopped by its driver; the policy then takes
  its slot away and puts it at the **front** of the queue with its progress (it is re-admitted first).
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
  is profiled only when it pays (:func:`policy.profiling.profile_pays`): its curve is still a prior, nodes
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
  met at its max, but not at its present count, has its rate weighted by ``deadline_weight``; a
  job still training at its deadline is stopped (a ``past_deadline`` event and ``Decision.stop``),
  and the decision asks to be called again at the next deadline. Each stop is a
  :class:`policy.model.Stop`: its reason (:class:`policy.model.StopReason`) and figures, which the
  drivers carry out and word (:meth:`~policy.model.Stop.describe`), never parse.
* **Fair share** (``fairness = "equal"``, the default; ``"weighted"``; ``"none"``): a queued job whose
  user holds no slot is admitted beyond Pjmax and the cap, and is never the one suspended; once a user
  with admitted work has held fewer nodes than its share for ``fair_wait_s``, every job is held to its
  share of the nodes (weighted max-min between users, then between a user's jobs) until that user's
  work is done: the shares are per-job maxima handed to the exact allocator (:mod:`policy.fairness`).
* **Sweeps and arrays** (short jobs, many; ``stream_share``): :mod:`policy.sweeps`.
* **Curves and costs**: :mod:`policy.beliefs`.
* **Objective** (``objective = "work"``, the default): the allocator maximises work, each job's
  rate in 1-node equivalents (``rate(n) / rate(1)`` on its believed curve), so a job that trains
  many cheap samples does not crowd out one that trains few costly ones; ``"samples"`` maximises
  raw samples/s (the paper's).
* **Allocation**: the exact allocator over the admitted jobs that are not pinned by a profile,
  in FCFS order (submission order, whatever order they were re-admitted in: a tie goes to the older
  job, so after a clean restart, which finds every job at 0 nodes, the jobs that ran get nodes
  before one that had waited with none), with
  horizon ``tfwd_s`` or, with ``horizon = "learned"``, the expected remaining idle time of
  the nodes on offer (:mod:`policy.valuation`), or the greedy / equal baselines.

A decision whose inputs equal those of the last decision that changed nothing is answered
"no change" without running the allocator (the answer would be the same). The profiling rules are
in :mod:`policy.profiling`, the curves' in :mod:`policy.beliefs`, the budget and deadline stops' in
:mod:`policy.limits`, a decision's scratch in :mod:`policy.round`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Callable, Mapping

from allocator import Job, Problem, RowMemo, solve
from curves import throughput_at
from policy import beliefs
from policy.allocation import apply_pins, equal_counts, greedy_counts, held_to_shares, node_map
from policy.beliefs import Beliefs, Believed, Population
from policy.config import (Admission, Allocation, Fairness, Horizon, Objective, PolicyConfig, PolicyConfigError,
                           Profiling)
from policy.fairness import fair_caps
from policy.ledger import below_min
from policy.limits import stop_over_budget, stop_past_deadline
from policy.model import Decision, EventKind, Evidence, JobEvidence, JobView, View
from policy.profiling import (advance_profiles, end_profile, expected_count, needs_profile, probe_below, probe_counts,
                              profile_counts, profile_pays, reserved, source_profile, start_probe)
from policy.round import Round
from policy.sweeps import most_repaid, stream_bound, stream_full, stream_order
from policy.state import FRAGMENTS_KEEP, POPULATION_KEEP, SHAPES_KEEP, PolicyState
from policy.valuation import FragmentModel, learned_horizon
from profiler.estimators import RescaleSummary, summarize_rescales
from profiler.jpa import Wait
from profiler.scalability import Scalability

__all__ = ("Policy", "evidence_from", "profile_counts")


class Policy:
    """Holds the config and the :class:`PolicyState`; see the module doc for the rules.

    Besides the state it remembers only what is compared by value: each job's believed curve with
    what it was made of (:class:`policy.beliefs.Beliefs`), the fragment model with the fragments
    it was made of, the inputs of the last decision that changed nothing, the allocator's value rows
    (:class:`allocator.RowMemo`) and the allocator's jobs of the last problem (reused when equal).
    """

    def __init__(self, config: PolicyConfig | None = None, state: PolicyState | None = None) -> None:
        self.config = config if config is not None else PolicyConfig()
        if self.config.allocation is not Allocation.MILP and self.config.profiling is not Profiling.NEVER:
            raise PolicyConfigError("policy.profiling needs allocation = \"milp\" (the baselines do not profile)")
        self.state = state if state is not None else PolicyState()
        self.beliefs = Beliefs(self.config, self.state)
        self._fragments: tuple[tuple[float, ...], FragmentModel] | None = None
        self._noop_key: tuple[object, ...] | None = None  # the inputs of the last decision, if it changed nothing
        self._rows = RowMemo()  # the allocator's value rows of jobs valued before, keyed by value
        self._jobs: dict[str, Job] = {}  # the allocator's jobs of the last problem solved, by job id

    # ------------------------------------------------------------------ the decision

    def decide(self, view: View, evidence: Evidence) -> Decision:
        if self.beliefs.state is not self.state:  # a driver may hand the policy a restored state
            self.beliefs = Beliefs(self.config, self.state)
        r = Round(view)
        self._forget_departed(r)
        self._observe_fragments(view)
        self._learn(r, evidence)
        self._preemptions(r)
        stop_over_budget(self.state, r)
        stop_past_deadline(self.state, r)
        advance_profiles(self.state, r, evidence, again=self.config.profiling is Profiling.GATED)
        self.beliefs.weigh_levels(r.jobs.values())  # under samples, each user's levels against its own
        r.population = self.beliefs.population()  # the measured points are settled for this decision
        r.believed = {j: self.beliefs.believed(r.jobs[j], r.population) for j in self.state.admitted}
        self._suspensions(r)
        waiting = self._admit(r, view)
        self._probes(r, evidence)
        return self._allocate(r, view, evidence, waiting)

    def guess(self) -> float:
        """The population's per-node rate (:func:`beliefs.guess_per_node`)."""
        return self.beliefs.guess()

    def pooled_prior(self, guess: float) -> dict[int, float] | None:
        """The population prior pooled from the shapes of the jobs that finished."""
        return self.beliefs.pooled_prior(guess)

    def believed_curve(self, job: JobView, population: Population | None = None) -> dict[int, float]:
        """What the policy believes ``job`` trains at each count (samples/s). The allocator is given
        this curve, in 1-node equivalents with ``objective = "work"``. ``population``: a decision's
        (none: as the state stands)."""
        return self.beliefs.curves(job, population)[0]

    def scalability(self, job: JobView) -> Scalability:
        """What the policy believes about ``job`` now."""
        return self.beliefs.scalability(job)

    def absorbs(self, job: JobView, population: Population | None = None) -> int:
        """The nodes ``job`` can put to use (:func:`policy.beliefs.absorbs` on its believed curve)."""
        return self.beliefs.absorbs(job, population)

    def expected_count(self, r: Round, job: JobView, n_jobs: int) -> int:
        """The count the allocator is expected to give ``job`` (:func:`policy.profiling.expected_count`)."""
        return expected_count(r, job, n_jobs)

    def fragment_model(self) -> FragmentModel:
        """The fragment-length distribution of the idle fragments that ended (made again when they changed)."""
        frags = tuple(self.state.fragments)
        if self._fragments is None or self._fragments[0] != frags:
            self._fragments = (frags, FragmentModel(frags))
        return self._fragments[1]

    # ------------------------------------------------------------------ bookkeeping

    def _forget_departed(self, r: Round) -> None:
        st, jobs = self.state, r.jobs
        st.admitted = [j for j in st.admitted if j in jobs]
        st.queue_front = [j for j in st.queue_front if j in jobs and j not in st.admitted]
        st.assigned = {k: v for k, v in st.assigned.items() if k in jobs}
        st.profiles = {k: s for k, s in st.profiles.items() if k in jobs}
        st.debts = {b: d for b, d in st.debts.items() if b in jobs and d.lender in jobs}
        st.lent_at = {k: v for k, v in st.lent_at.items() if k in jobs}
        st.profiled, st.cut_short = {j for j in st.profiled if j in jobs}, {j for j in st.cut_short if j in jobs}
        st.over_budget = {j for j in st.over_budget if j in jobs}
        for job_id in [k for k in st.measured if k not in jobs]:
            pts = st.measured.pop(job_id)
            if pts:
                n = min(pts)
                st.population.append(pts[n] / n)
                shape = beliefs.shape_of(pts)
                if shape is not None:
                    st.shapes.append(shape)
                    del st.shapes[:-SHAPES_KEEP]
        del st.population[:-POPULATION_KEEP]
        self.beliefs.forget(jobs)

    def _observe_fragments(self, view: View) -> None:
        if view.ended_fragments:
            frags = self.state.fragments
            frags.extend(float(x) for x in view.ended_fragments if x >= 0 and math.isfinite(x))
            del frags[:-FRAGMENTS_KEEP]

    def _suspensions(self, r: Round) -> None:
        """Adaptive admission: the newest jobs admitted beyond Pjmax give way first when nodes go."""
        st, cfg = self.state, self.config
        if cfg.admission is not Admission.ADAPTIVE or not cfg.max_running or len(st.admitted) <= cfg.max_running:
            return  # no job beyond Pjmax to give way
        absorb = sum(r.believed[j].absorbs for j in st.admitted)
        for job_id in reversed(st.admitted[cfg.max_running:]):
            job = r.jobs[job_id]
            others = absorb - r.believed[job_id].absorbs
            if self._only_slot_of_user(job_id, r):
                continue  # fair share: a user's one slot never gives way to another user's jobs
            if job_id in st.profiles or r.total_nodes - others >= job.min_nodes:
                break
            st.admitted.remove(job_id)
            st.queue_front.insert(0, job_id)
            st.assigned.pop(job_id, None)
            r.release(job.nodes)
            absorb = others
            r.note(EventKind.SUSPENDED, job_id, nodes=job.count)
        r.absorb = absorb

    def _only_slot_of_user(self, job_id: str, r: Round) -> bool:
        """With fair share on, whether ``job_id`` is the one admitted job of its user."""
        if self.config.fairness is Fairness.NONE:
            return False
        user = r.jobs[job_id].user
        return sum(1 for j in self.state.admitted if r.jobs[j].user == user) == 1

    def _learn(self, r: Round, evidence: Evidence) -> None:
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
                r.note(EventKind.REFINED, job_id, points={str(n): v for n, v in sorted(new.items())})

    def _preemptions(self, r: Round) -> None:
        """An admitted job the driver had to stop (a recall took it below its min) loses its slot."""
        st = self.state
        for job_id in list(st.admitted):
            job = r.jobs[job_id]
            if not below_min(job.count, job.min_nodes) or below_min(st.assigned.get(job_id, 0), job.min_nodes):
                continue
            st.admitted.remove(job_id)
            st.queue_front.append(job_id)
            st.assigned.pop(job_id, None)
            r.release(job.nodes)
            if job_id in st.profiles:
                end_profile(st, r, job_id, None, "preempted", again=self.config.profiling is Profiling.GATED)
            r.note(EventKind.PREEMPTED, job_id, nodes=job.count)

    # ------------------------------------------------------------------ admission

    def _admit(self, r: Round, view: View) -> dict[str, str]:
        st, cfg = self.state, self.config
        admitted = set(st.admitted)
        front = [j for j in st.queue_front if j not in admitted]
        placed = admitted.union(front)
        rest = sorted((j for j in r.jobs.values() if j.id not in placed), key=lambda j: (j.order, j.id))
        bound = stream_bound(cfg.stream_share, cfg.max_running)
        streams = Counter(r.jobs[j].group for j in st.admitted if r.jobs[j].group)  # slots each stream holds
        queue = stream_order(front + [j.id for j in rest], {j: r.jobs[j].group for j in r.jobs}, streams, bound)
        slots = cfg.max_running or math.inf
        adaptive = cfg.admission is Admission.ADAPTIVE and cfg.max_running > 0
        cap = cfg.admission_cap or math.inf
        absorb: int | None = None  # what the admitted jobs absorb; summed when a job beyond Pjmax is weighed
        free_avail = max(0, view.free_count + len(r.released) - reserved(st))
        borrowed: dict[str, int] = {}
        waiting: dict[str, str] = {}
        blocked_by: str | None = None
        extra_closed = False
        slots_taken = f"all {cfg.max_running} slots are taken (max_running)"
        fair = cfg.fairness is not Fairness.NONE
        with_slot = {r.jobs[j].user for j in st.admitted}  # fair share: a user without a slot gets one
        for job_id in queue:
            stop = r.stop.get(job_id)
            if stop is not None:
                waiting[job_id] = stop.reason.text
                continue
            if blocked_by is not None:
                waiting[job_id] = f"behind {blocked_by} in the FCFS queue"
                continue
            job = r.jobs[job_id]
            streamed = bool(bound and job.group and streams.get(job.group, 0) >= bound)  # its stream's slots are full
            extra = len(st.admitted) >= slots or streamed
            if extra:
                if absorb is None:  # summed by the suspensions already, if they weighed any job
                    absorb = r.absorb
                    if absorb is None:
                        absorb = sum(r.believed[j].absorbs for j in st.admitted) if adaptive else 0
                if (not (fair and job.user not in with_slot)
                        and (extra_closed or not adaptive or len(st.admitted) >= cap
                             or r.total_nodes - reserved(st) - absorb < job.min_nodes)):  # the surplus is too small
                    waiting[job_id] = stream_full(job.group) if streamed and len(st.admitted) < slots else slots_taken
                    extra_closed = True  # FCFS beyond Pjmax too: no smaller job slips past
                    continue
            if job_id in r.profile_ended:  # a profile cut short here is tried again, if at all, at a later decision
                pass
            elif not extra and needs_profile(cfg, st, job):
                res = source_profile(cfg, st, r, job, free_avail, borrowed)
                if isinstance(res, Wait):
                    waiting[job_id] = f"waiting to be profiled: {res.reason}"
                    blocked_by = job_id
                    continue
                free_avail -= res.from_free
            elif not extra and (end := profile_pays(cfg, st, r, job, free_avail, self._curve_of(r))) is not None:
                res = source_profile(cfg, st, r, job, free_avail, borrowed, end=end)
                if not isinstance(res, Wait):
                    free_avail -= res.from_free
            r.believed[job_id] = self.beliefs.believed(job, r.population)
            if adaptive and absorb is not None:
                absorb += r.believed[job_id].absorbs
            st.admitted.append(job_id)
            with_slot.add(job.user)
            streams[job.group] += bool(job.group)
            if job_id in st.queue_front:
                st.queue_front.remove(job_id)
            r.note(EventKind.ADMITTED, job_id)
        return waiting

    def _probes(self, r: Round, evidence: Evidence) -> None:
        """Gated profiling of running jobs whose shape is unverified, where it pays: while nodes are
        scarce, up or down to the min (:func:`policy.profiling.probe_counts`); while they are not, below
        the count a job holds (:func:`policy.profiling.probe_below`: a curve may peak below it)."""
        st, cfg = self.state, self.config
        if cfg.profiling is not Profiling.GATED or not cfg.learn:
            return
        # scarce: the admitted jobs could absorb more than there is (a job alone gets every node it wants)
        scarce = len(r.jobs) >= 2 and sum(r.jobs[j].max_nodes for j in st.admitted) > r.total_nodes
        free = max(0, len(r.free) + len(r.released) - reserved(st)
                   - sum(s.plan.from_free for j, s in st.profiles.items() if r.jobs[j].count < s.count))
        others = [evidence[j] for j in st.admitted if j in evidence]
        owed = {d.lender for d in st.debts.values()}  # a lender's count is short of its own until repaid:
        spread = r.population.spread if r.population else None
        for job_id in list(st.admitted):             # a probe from it would pin it, and grow it, while owed
            job = r.jobs[job_id]
            if job.count == 0 or job_id in st.profiles or job_id in st.profiled or job_id in owed or job_id in r.profile_ended:
                continue
            up, down = beliefs.rescale_costs(evidence.get(job_id), others, cfg, self._pooled_costs(r, evidence))
            curve = r.believed[job_id].raw
            if scarce:
                counts = probe_counts(cfg, st, job, curve, up, down, free, spread)
            else:
                counts = probe_below(cfg, st, job, curve, up, down, spread)
            if counts is not None:
                free -= start_probe(cfg, st, r, job, counts)

    def _pooled_costs(self, r: Round, evidence: Evidence) -> tuple[float, float]:
        """The admitted jobs' pauses pooled (:func:`policy.beliefs.pooled_rescale_costs`), once per decision:
        the probes and the allocation read the same evidence of the same jobs (admission is done by then)."""
        if r.pooled_costs is None:
            others = [evidence[j] for j in self.state.admitted if j in evidence]
            r.pooled_costs = beliefs.pooled_rescale_costs(others, self.config)
        return r.pooled_costs

    # ------------------------------------------------------------------ allocation

    def _allocate(self, r: Round, view: View, evidence: Evidence, waiting: dict[str, str]) -> Decision:
        st, cfg = self.state, self.config
        admitted = [r.jobs[j] for j in st.admitted]
        # a job below its min cannot run: its nodes count as free (drivers stop it anyway)
        admitted = [_without_nodes(j, r) if below_min(j.count, j.min_nodes) else j for j in admitted]
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
            own = () if below_min(lj.count, lj.min_nodes) else lj.nodes  # below its min its nodes are free already
            give = free[: max(0, min(k, lj.max_nodes - len(own)))]
            if below_min(len(own) + len(give), lj.min_nodes):
                continue  # too few to run on (a recall stopped it): the allocator places it like any job
            del free[: len(give)]
            # the repaid nodes are the lender's again from now on; the allocator then plans it like
            # any job in this same decision (so the decision after a repayment changes nothing)
            repaid[lender] = tuple(own) + tuple(give)
        reserve = min(len(free), reserved(st))
        if reserve:
            free = free[: len(free) - reserve]
        horizon = self._horizon(view, free, admitted)
        demand = {j.id: r.believed[j.id].absorbs if j.id in r.believed else j.max_nodes for j in admitted}
        r.caps, r.fair_wake = fair_caps(cfg, st, admitted, demand, r.total_nodes, r.now)
        r.weights = self._deadline_weights(admitted, r.now, r.population)
        if cfg.objective is Objective.COMPLETION and not waiting:
            r.weights = completion_weights(admitted, r, r.weights)
        curves = {j.id: _weighted(r.believed[j.id].scaled, r.weights.get(j.id, 1.0)) for j in admitted}
        key = self._problem_key(admitted, free, evidence, pins, r, horizon, curves)
        if key == self._noop_key:  # the inputs of the last decision, which changed nothing: nor would this
            assignment = {j.id: j.nodes for j in admitted}
            return self._finish(r, assignment, waiting, 0.0, "unchanged", solved=False, horizon=horizon)
        if cfg.allocation is Allocation.MILP:
            assignment, objective, method = self._solve(admitted, free, fixed, lender_nodes, repaid, evidence,
                                                         horizon, curves, r.caps, r.believed, self._pooled_costs(r, evidence))
        else:  # the shares bind here too: each job's max is its share, a job whose share is none gets no node
            counts_fn = greedy_counts if cfg.allocation is Allocation.GREEDY else equal_counts
            placed, released = held_to_shares(admitted, r.caps)
            counts = {j.id: 0 for j in admitted}
            counts.update(counts_fn(placed, min(view.free_count, len(free)) + released))
            assignment, objective, method = node_map(admitted, free, counts), 0.0, cfg.allocation.value
        unchanged = all(_same_nodes(assignment.get(j.id, ()), j.nodes) for j in admitted)
        self._noop_key = key if unchanged else None
        return self._finish(r, assignment, waiting, objective, method, solved=True, horizon=horizon)

    def _horizon(self, view: View, free: list[str], admitted: list[JobView]) -> float:
        cfg = self.config
        if cfg.horizon is Horizon.TFWD:
            return cfg.tfwd_s
        nodes = free if free else [n for j in admitted for n in j.nodes]
        return learned_horizon(nodes, view.now, view.idle_since, view.recall_at, self.fragment_model(),
                               cfg.horizon_min_s, cfg.horizon_max_s, cfg.tfwd_s)

    def _deadline_weights(self, admitted: list[JobView], now: float,
                          population: Population | None = None) -> dict[str, float]:
        """``deadline_weight`` for each job whose deadline can be met at its max but not at its count."""
        w = self.config.deadline_weight
        out: dict[str, float] = {}
        if w == 1.0:
            return out
        for j in admitted:
            if j.deadline is None or j.work_left is None:
                continue
            curve = self.believed_curve(j, population)
            left = j.deadline - now
            fast = throughput_at(curve, j.max_nodes)
            now_rate = throughput_at(curve, j.count) if j.count else 0.0
            if fast > 0 and j.work_left <= fast * left and (now_rate <= 0 or j.work_left > now_rate * left):
                out[j.id] = w
        return out

    def _solve(self, admitted: list[JobView], free: list[str], fixed: dict[str, tuple[str, ...]],
               lender_nodes: dict[str, tuple[str, ...]], repaid: dict[str, tuple[str, ...]], evidence: Evidence,
               horizon: float, curves: Mapping[str, dict[int, float]], caps: Mapping[str, int],
               believed: Mapping[str, Believed],
               pooled_costs: tuple[float, float]) -> tuple[dict[str, tuple[str, ...]], float, str]:
        """``lender_nodes``: what lenders keep in this decision; ``repaid``: lenders' nodes after repayment;
        ``curves``: each job's allocator curve in this decision (``believed``: its curves); ``caps``: its fair share
        (:mod:`policy.fairness`; empty: none binds), its max in this decision; ``pooled_costs``: the jobs'
        pauses pooled (:meth:`_pooled_costs`)."""
        st, cfg = self.state, self.config
        owed = {d.lender for d in st.debts.values()}
        others = [evidence[j.id] for j in admitted if j.id in evidence]
        jobs: list[Job] = []
        for j in admitted:
            if j.id in fixed:
                continue
            nodes = lender_nodes.get(j.id, repaid.get(j.id, j.nodes))
            capped = j.id in lender_nodes or j.id in owed  # a lender may shrink, not grow, while owed
            if capped and not nodes or caps.get(j.id) == 0:  # caps 0: no fair share of its own while a user waits
                fixed[j.id] = ()
                continue
            curve = curves[j.id]
            up, down = beliefs.rescale_costs(evidence.get(j.id), others, cfg, pooled_costs)
            lo, hi = (min(j.min_nodes, len(nodes)), len(nodes)) if capped else (j.min_nodes, j.max_nodes)
            if j.budget_node_hours is not None:  # no more nodes than the rest of the budget pays for
                left_s = max(0.0, j.budget_node_hours - j.used_node_hours) * 3600.0
                hi = max(lo, min(hi, int(left_s // horizon)))
            if j.id in caps:  # fair share: no more than its share while another user waits
                hi = max(lo, min(hi, caps[j.id]))
            if j.group and j.work_left is not None and nodes:  # a stream's job near its end: no unpaid growth
                hi = max(lo, most_repaid(j.work_left, len(nodes), hi, believed[j.id].raw, up))
            jobs.append(self._problem_job(j.id, lo, hi, curve, tuple(nodes), up, down))
        # the jobs can grow by at most their room, and a growing job takes the first free nodes: the
        # rest of a large idle pool changes no plan, only what the problem costs to build and check
        room = sum(max(0, j.max_nodes - j.current) for j in jobs)
        # FCFS order, not the order of (re-)admission: the allocator gives a tie to the job before, so a
        # job that waited with no node never takes the node of an older one that a restart or a recall
        # put back through the queue front (a clean restart has every job at 0 nodes: all values tie)
        fcfs = {j.id: (j.order, j.id) for j in admitted}
        jobs.sort(key=lambda job: fcfs[job.id])
        self._jobs = {job.id: job for job in jobs}
        plan = solve(Problem(tuple(jobs), tuple(free[:room]), horizon), method=cfg.method, memo=self._rows)
        assignment = dict(plan.assignment)
        assignment.update(fixed)
        return assignment, plan.objective, plan.method

    def _problem_job(self, job_id: str, lo: int, hi: int, curve: dict[int, float], nodes: tuple[str, ...],
                     up: float, down: float) -> Job:
        """The allocator's :class:`Job`: the one of the last problem when every field is equal (made and
        checked then), else a new one."""
        last = self._jobs.get(job_id)
        if (last is not None and last.min_nodes == lo and last.max_nodes == hi and last.nodes == nodes
                and last.up_cost_s == up and last.down_cost_s == down and last.scaling == curve):
            return last
        return Job(job_id, lo, hi, curve, nodes, up, down)

    def _curve_of(self, r: Round) -> Callable[[JobView], dict[int, float]]:
        """The believed curve of a job in decision ``r``."""
        return lambda job: self.believed_curve(job, r.population)

    def _problem_key(self, admitted: list[JobView], free: list[str], evidence: Evidence,
                     pins: Mapping[str, int], r: Round, horizon: float, curves: Mapping[str, dict[int, float]]) -> tuple[object, ...]:
        """What a decision's plan depends on, beyond the state: equal keys, equal plans (compared with
        ``==``, never hashed: the allocator ``curves`` are in it as they are)."""
        room = sum(j.max_nodes - j.count for j in admitted)
        costs = tuple((e.costs.n_up, e.costs.n_down) if (e := evidence.get(j.id)) is not None and e.costs else None
                      for j in admitted)
        return (tuple((j.id, j.count) for j in admitted), min(room, len(free)), [curves[j.id] for j in admitted], costs,
                tuple(sorted(pins.items())), tuple(sorted(r.returning.items())),
                tuple(sorted((b, d.lender, d.nodes) for b, d in self.state.debts.items())),
                r.released != [], horizon, tuple(sorted(r.weights.items())), tuple(sorted(r.caps.items())))

    def _finish(self, r: Round, assignment: Mapping[str, tuple[str, ...]], waiting: dict[str, str],
                objective: float, method: str, solved: bool, horizon: float = 0.0) -> Decision:
        st = self.state
        full = {job_id: tuple(assignment.get(job_id, ())) for job_id in st.admitted}
        st.assigned = {job_id: len(nodes) for job_id, nodes in full.items()}
        deadlines = [s.step_deadline for s in st.profiles.values()]
        if r.next_deadline < math.inf:  # decide again when a job's deadline comes
            deadlines.append(r.next_deadline)
        if r.fair_wake is not None:  # decide again when a waiting user's fair_wait_s runs out
            deadlines.append(r.fair_wake)
        for job_id, nodes in full.items():  # decide again when a budget runs out
            j = r.jobs[job_id]
            if j.budget_node_hours is not None and nodes:
                left_s = max(0.0, j.budget_node_hours - j.used_node_hours) * 3600.0
                deadlines.append(r.now + left_s / len(nodes))
        return Decision(
            now=r.now, assignment=full, admitted=tuple(st.admitted), waiting=waiting,
            profiling={job_id: s.count for job_id, s in st.profiles.items()}, events=tuple(r.events),
            wake_at=min(deadlines) if deadlines else None, watch=tuple(st.profiles),
            objective=objective, method=method, solved=solved,
            stop=dict(r.stop), horizon_s=horizon,
        )


COMPLETION_WEIGHT_SPAN = 4.0  # a job's completion weight lies within 1/this .. this


def completion_weights(admitted: list[JobView], r: Round, weights: Mapping[str, float]) -> dict[str, float]:
    """``weights`` times each job's completion weight (``objective = "completion"``, every job admitted):
    the median remaining work over the job's own (in 1-node seconds on its believed curve), within
    1/:data:`COMPLETION_WEIGHT_SPAN` .. :data:`COMPLETION_WEIGHT_SPAN`; a job whose length is unknown
    weighs 1. Maximising the weighted work then sums each job's rate over its remaining work: the
    completion speed, which finishes short jobs first (shortest remaining first) as far as their
    curves allow."""
    left: dict[str, float] = {}
    for j in admitted:
        one = throughput_at(r.believed[j.id].raw, 1)
        if j.work_left is not None and j.work_left > 0 and one > 0:
            left[j.id] = j.work_left / one
    out = dict(weights)
    if len(left) < 2:
        return out
    ordered = sorted(left.values())
    median = ordered[len(ordered) // 2]
    for job_id, w in left.items():
        k = min(COMPLETION_WEIGHT_SPAN, max(1.0 / COMPLETION_WEIGHT_SPAN, median / w))
        out[job_id] = out.get(job_id, 1.0) * k
    return out


def _weighted(curve: dict[int, float], weight: float) -> dict[int, float]:
    """The allocator's ``curve`` of a job times its deadline ``weight``."""
    return curve if weight == 1.0 else {n: v * weight for n, v in curve.items()}


def _same_nodes(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """The same node set (an unchanged job's plan lists its nodes in the same order: no sets built)."""
    return a == b or (len(a) == len(b) and set(a) == set(b))


def _without_nodes(job: JobView, r: Round) -> JobView:
    # a job preempted in this round (and re-admitted from the queue front) was released already
    r.release(job.nodes)
    return replace(job, nodes=())


def evidence_from(rates: Mapping[int, object], rescale_events: object = None) -> JobEvidence:
    """Evidence from a throughput estimator's ``estimates()`` and the rescale events seen (both
    drivers): a list of them, or a :class:`profiler.estimators.RescaleSummary` kept as they came."""
    if not rescale_events:
        costs = None
    elif isinstance(rescale_events, RescaleSummary):
        costs = rescale_events.costs()
    else:
        costs = summarize_rescales(rescale_events)  # type: ignore[arg-type]
    return JobEvidence(dict(rates), costs)  # type: ignore[arg-type]
