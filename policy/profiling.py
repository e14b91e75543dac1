"""Profiling rules of the policy (the module doc of :mod:`policy.decide` states them): which jobs are profiled, at
which counts, from which nodes, when a gated profile pays, and how a profile advances and ends."""

from __future__ import annotations

import math
from typing import Callable, Mapping

from curves import throughput_at
from policy.beliefs import FIRST_INTER_NODE, PriorSpread
from policy.config import PolicyConfig, Profiling
from policy.model import NO_EVIDENCE, EventKind, Evidence, JobView
from policy.round import Round
from policy.state import Debt, PolicyState
from profiler.jpa import (Done, ProfilePlan, ProfileSession, ProfilingRequest, RunningJob, StepDown, Wait,
                          choose_sources, default_counts)

CurveOf = Callable[[JobView], Mapping[int, float]]


def profile_counts(kind: str, lo: int, hi: int) -> tuple[int, ...] | None:
    """The counts a profile visits (None: the JPA's default, min + powers of two + max)."""
    if kind == "sparse":
        mid = 2 ** round(math.log2(math.sqrt(lo * hi)))
        return tuple(sorted({lo, min(hi, max(lo, mid)), hi}))
    if kind == "top":
        return tuple(sorted({max(lo, hi // 4), max(lo, hi // 2), hi}))
    return None


def needs_profile(cfg: PolicyConfig, st: PolicyState, job: JobView) -> bool:
    """Profiled the JPA's way (may borrow, blocks the queue until it can be sourced)."""
    mode = cfg.profiling
    wants = mode is Profiling.ALWAYS or (mode in (Profiling.REQUESTED, Profiling.GATED) and job.profile)
    return wants and job.id not in st.profiled and not st.measured.get(job.id)


def expected_count(r: Round, job: JobView, n_jobs: int) -> int:
    """The count ``job`` is expected to get among ``n_jobs`` admitted jobs: an even share, within its range."""
    share = r.total_nodes // max(1, n_jobs)
    return max(job.min_nodes, min(job.max_nodes, share))


def profile_pays(cfg: PolicyConfig, st: PolicyState, r: Round, job: JobView, free_avail: int, curve_of: CurveOf
                 ) -> int | None:
    """Gated profiling: the count a profile of ``job`` should end at, or None when it does not pay."""
    if cfg.profiling is not Profiling.GATED or job.profile or job.id in st.profiled or st.measured.get(job.id):
        return None
    admitted = [r.jobs[j] for j in st.admitted]
    absorb = sum(j.max_nodes for j in admitted) + job.max_nodes
    if absorb <= r.total_nodes:
        return None  # nodes are not scarce: every job gets its max whatever its curve
    end = expected_count(r, job, len(admitted) + 1)
    if end >= job.max_nodes or free_avail <= end:
        return None  # nothing to choose between, or the free pool cannot serve the profile
    curve = curve_of(job)
    rate_end = throughput_at(curve, end)
    if rate_end <= 0:
        return None
    work_left = job.work_left
    if work_left is not None and work_left / throughput_at(curve, job.max_nodes) < cfg.profile_min_work_s:
        return None  # a short job: not worth a profile
    spread = prior_spread(r.population.spread if r.population else None, end, curve)
    top = min(job.max_nodes, free_avail)
    steps = len([c for c in default_counts(job.min_nodes, job.max_nodes) if end < c <= top]) + 1
    step_s = min(cfg.profile_time_cap_s, 60.0)
    per_node = rate_end / end
    cost = (cfg.default_up_cost_s + steps * cfg.default_down_cost_s) * throughput_at(curve, top) \
        + (top - end) * per_node * steps * step_s / 2.0
    horizon = work_left / rate_end if work_left is not None else cfg.horizon_max_s
    gain = cfg.profile_gain_fraction * spread * rate_end * horizon
    return end if gain > cost else None


UNVERIFIED_SPREAD = 0.25
"""How far a shape no measurement verified is assumed to be off at least (relative): the six Pollux
models' efficiencies at 4-16 nodes span 0.2-0.85, so a prior (the population mean, a linear guess)
is wrong by this much or more for most jobs."""


PROBE_TOP = 4  # an upward probe of a job at its min goes to at most max(this, 2 x its count) nodes


def probe_counts(cfg: PolicyConfig, st: PolicyState, job: JobView, curve: Mapping[int, float], up_s: float,
                 down_s: float, free: int, spread: PriorSpread | None) -> tuple[int, ...] | None:
    """A probe of a running job measured at one count only, in the advisor's inverse order, or None when it does
    not pay: **down** to its min on its own nodes (its 1-node rate values every node it holds, and passive
    learning may never measure it), or **up** from its min once onto free nodes (never a lender) and back, never
    to :data:`policy.beliefs.FIRST_INTER_NODE` alone (one node to two shows the allreduce's drop and nothing past
    it). It pays when ``profile_gain_fraction`` x the prior's spread there (at least :data:`UNVERIFIED_SPREAD`)
    x the rate x the time left exceeds the pauses and a step's time on the nodes between the two counts."""
    if cfg.profiling is not Profiling.GATED or not cfg.learn or job.profile:
        return None
    if job.id in st.profiles or job.id in st.profiled or job.count < job.min_nodes or job.count == 0:
        return None
    pts = {n for n, v in st.measured.get(job.id, {}).items() if v > 0}
    if job.count not in pts:
        return None  # its own count is not measured yet: passive learning first
    if job.count > job.min_nodes:
        if job.min_nodes in pts:
            return None  # its base is measured
        counts = (job.count, job.min_nodes)
    elif pts != {job.count}:
        return None  # measured above its min already
    else:
        top = min(job.max_nodes, job.count + free, max(PROBE_TOP, 2 * job.count))
        if top <= job.count or top == FIRST_INTER_NODE:
            return None  # no room; or from one node to two only, which shows no scaling past the drop there
        counts = (top, job.count)
    rate = throughput_at(curve, job.count)
    if rate <= 0:
        return None
    hi, lo = counts
    step_s = min(cfg.profile_time_cap_s, 60.0)
    cost = (up_s + down_s) * rate + (throughput_at(curve, hi) / hi) * (hi - lo) * step_s
    horizon = job.work_left / rate if job.work_left is not None else cfg.horizon_max_s
    spread_at = max(UNVERIFIED_SPREAD, prior_spread(spread, max(counts), curve))
    gain = cfg.profile_gain_fraction * spread_at * rate * horizon
    return counts if gain > cost else None


def below_counts(count: int, lo: int) -> tuple[int, ...]:
    """The counts a probe below ``count`` visits, descending: three quarters and half of it (at least ``lo``): far
    enough to see a curve that peaks below a job's max (Pollux's ncf: 8 nodes beat 12), near enough to cost a step."""
    return tuple(sorted({c for c in ((3 * count) // 4, count // 2) if lo <= c < count}, reverse=True))


def probe_below(cfg: PolicyConfig, st: PolicyState, job: JobView, curve: Mapping[int, float], up_s: float,
                down_s: float, spread: PriorSpread | None) -> tuple[int, ...] | None:
    """A probe below the count a running job holds at its believed best (nodes not scarce), down to
    :func:`below_counts` on its own nodes, or None when it does not pay (as :func:`probe_counts`, the cost the
    pauses and the rate lost at each step). Nothing else measures a job below its count when nodes are plentiful,
    so a curve that falls past some count would hold it there for good; probed once, one that peaks is stopped
    at its peak."""
    if cfg.profiling is not Profiling.GATED or not cfg.learn or job.profile:
        return None
    if job.id in st.profiles or job.id in st.profiled or job.count <= job.min_nodes:
        return None
    if job.count < believed_best(curve, job.max_nodes):
        return None  # held below what it would take (a job alone, short of nodes): fewer cannot help
    pts = {n for n, v in st.measured.get(job.id, {}).items() if v > 0}
    if job.count not in pts:
        return None  # its own count is not measured yet: passive learning first
    below = below_counts(job.count, job.min_nodes)
    if not below or any(below[0] <= n < job.count for n in pts):
        return None  # measured just below its count already: the belief knows which side is faster
    rate = throughput_at(curve, job.count)
    if rate <= 0:
        return None
    step_s = min(cfg.profile_time_cap_s, 60.0)
    cost = (up_s + len(below) * down_s) * rate + sum(max(0.0, rate - throughput_at(curve, c)) for c in below) * step_s
    horizon = job.work_left / rate if job.work_left is not None else cfg.horizon_max_s
    spread_at = max(UNVERIFIED_SPREAD, prior_spread(spread, job.count, curve))
    gain = cfg.profile_gain_fraction * spread_at * rate * horizon
    return (job.count, *below) if gain > cost else None


def believed_best(curve: Mapping[int, float], max_nodes: int) -> int:
    """The count up to ``max_nodes`` at which ``curve`` (linear between its points) is fastest, the smallest of
    equals."""
    counts = sorted({n for n in curve if 1 <= n <= max_nodes} | {max_nodes})
    return max(counts, key=lambda n: (throughput_at(curve, n), -n))


def start_probe(cfg: PolicyConfig, st: PolicyState, r: Round, job: JobView, counts: tuple[int, ...]) -> int:
    """Start ``job``'s probe at ``counts[0]``; returns the free nodes it takes."""
    from_free = max(0, counts[0] - job.count)
    plan = ProfilePlan(job.id, counts, from_free, None, 0)
    st.profiles[job.id] = ProfileSession(plan, r.now, rel_ci=cfg.profile_rel_ci, time_cap_s=cfg.profile_time_cap_s)
    r.note(EventKind.PROFILE_START, job.id, counts=list(counts), lender=None, borrowed=0, probe=True)
    return from_free


def prior_spread(spread: PriorSpread | None, n: int, curve: Mapping[int, float]) -> float:
    """How unsure the prior is at ``n``: the relative spread (p90 - p10 over the median) of the population's
    efficiencies there, else how far the believed curve is from linear."""
    pooled = spread.at(n) if spread is not None else None
    if pooled is not None:
        return pooled
    lo = min(curve)
    linear = throughput_at(curve, lo) / lo * n
    return max(0.0, 1.0 - throughput_at(curve, n) / linear) if linear > 0 else 0.0


def reserved(st: PolicyState) -> int:
    """Nodes released by profiles in progress, up to what they borrowed: held back for the lenders."""
    total = 0
    for borrower, debt in st.debts.items():
        s = st.profiles.get(borrower)
        if s is not None:
            total += min(debt.nodes, s.plan.top - s.count)
    return total


def source_profile(cfg: PolicyConfig, st: PolicyState, r: Round, job: JobView, free_avail: int,
                   borrowed: dict[str, int], end: int | None = None) -> ProfilePlan | Wait:
    """Start ``job``'s profile; ``end`` (gated): free nodes only, stepping down to ``end``."""
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
    r.note(EventKind.PROFILE_START, job.id, counts=list(res.counts_desc), lender=res.lender, borrowed=res.borrowed)
    if res.lender is not None and res.borrowed > 0:
        st.debts[job.id] = Debt(res.lender, res.borrowed)
        st.lent_at[res.lender] = r.now
        borrowed[res.lender] = borrowed.get(res.lender, 0) + res.borrowed
        r.lender_used = True
        r.note(EventKind.LENT, res.lender, nodes=res.borrowed, borrower=job.id)
    return res


def advance_profiles(st: PolicyState, r: Round, evidence: Evidence, again: bool = False) -> None:
    """Step every profile on its evidence; end those that lost their nodes or are done."""
    for job_id, session in list(st.profiles.items()):
        job = r.jobs[job_id]
        if st.assigned.get(job_id) == session.count and job.count < session.count:
            end_profile(st, r, job_id, None, "lost nodes during the profile", again)
            continue
        action = session.next_action(r.now, evidence.get(job_id, NO_EVIDENCE))
        if isinstance(action, StepDown):
            r.note(EventKind.PROFILE_STEP, job_id, count=action.count, previous=action.from_nodes)
        elif isinstance(action, Done):
            end_profile(st, r, job_id, action, "done")


def end_profile(st: PolicyState, r: Round, job_id: str, done: Done | None, reason: str, again: bool = False) -> None:
    """End ``job_id``'s profile: its points enter its curve, its lender is owed its nodes back. A profile is done
    once; with ``again``, one :func:`cut_short_unmeasured` is not: the job may be probed once more."""
    session = st.profiles.pop(job_id)
    r.profile_ended.add(job_id)
    if again and cut_short_unmeasured(session, done) and job_id not in st.cut_short:
        st.cut_short.add(job_id)
    else:
        st.profiled.add(job_id)
    measured = session.measured
    if measured:
        st.measured.setdefault(job_id, {}).update(measured)
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


def cut_short_unmeasured(session: ProfileSession, done: Done | None) -> bool:
    """Whether a profile that took no lender's nodes was cut short before it measured the last count it went for:
    the first such does not count as done (else the job keeps an unverified, linear-believed shape for good and
    holds nodes better-scaling jobs would use), the job probed once more where it pays (once: each try costs)."""
    plan = session.plan
    return done is None and plan.lender is None and plan.counts_desc[-1] not in session.measured
