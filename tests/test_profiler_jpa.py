"""The job profiling advisor's rules: sources, one scale-up, inverse order, holding, waiting."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiler.estimators import Estimate, ThroughputEstimator
from profiler.jpa import (
    Done,
    Hold,
    ProfilePlan,
    ProfileSession,
    ProfilingError,
    ProfilingRequest,
    RunningJob,
    StepDown,
    StepKind,
    Wait,
    choose_sources,
    default_counts,
    profile_cost,
)
from profiler.records import Record
from profiler.scalability import ScalingModel, Source


def req(job_id: str = "new", lo: int = 1, hi: int = 64, counts: tuple[int, ...] | None = None) -> ProfilingRequest:
    return ProfilingRequest(job_id, lo, hi, counts)


# --- counts ---------------------------------------------------------------------------------


def test_default_counts_are_powers_of_two_within_the_range() -> None:
    assert default_counts(1, 64) == (1, 2, 4, 8, 16, 32, 64)
    assert default_counts(3, 48) == (3, 4, 8, 16, 32, 48)
    assert default_counts(4, 4) == (4,)
    with pytest.raises(ProfilingError, match="bad node range"):
        default_counts(0, 4)


def test_request_validates_and_sorts_counts() -> None:
    assert req(counts=(8, 2, 8, 4)).targets() == (2, 4, 8)
    with pytest.raises(ProfilingError, match="job new: count 128 outside"):
        req(counts=(2, 128))
    with pytest.raises(ProfilingError, match="job x: bad node range"):
        ProfilingRequest("x", 5, 2)


# --- sources ----------------------------------------------------------------------------------


def test_free_nodes_first_no_lender_needed() -> None:
    running = [RunningJob("a", 30, 1, 0.0)]
    plan = choose_sources(req(), 64, running)
    assert isinstance(plan, ProfilePlan)
    assert plan.counts_desc == (64, 32, 16, 8, 4, 2, 1)
    assert (plan.from_free, plan.lender, plan.borrowed) == (64, None, 0)


def test_free_nodes_partial_then_one_lender_for_the_rest() -> None:
    plan = choose_sources(req(), 10, [RunningJob("a", 60, 2, 5.0)])
    assert isinstance(plan, ProfilePlan)
    assert plan.top == 64 and plan.from_free == 10
    assert (plan.lender, plan.borrowed) == ("a", 54)


def test_never_two_lenders_even_if_together_they_reach_further() -> None:
    running = [RunningJob("a", 21, 1, 0.0), RunningJob("b", 21, 1, 1.0)]
    plan = choose_sources(req(), 8, running)
    assert isinstance(plan, ProfilePlan)
    # one lender: 8 free + 20 lendable = 28 -> 16; both together would have reached 32
    assert plan.top == 16 and plan.lender == "a" and plan.borrowed == 8
    assert plan.counts_desc == (16, 8, 4, 2, 1)


def test_never_takes_a_lender_to_zero_or_below_its_minimum() -> None:
    assert RunningJob("a", 4, 0, 0.0).lendable == 3
    assert RunningJob("a", 1, 1, 0.0).lendable == 0
    assert RunningJob("a", 8, 6, 0.0).lendable == 2
    assert RunningJob("a", 3, 6, 0.0).lendable == 0
    # a lone one-node job cannot lend: the new job waits rather than stopping it
    result = choose_sources(req(), 1, [RunningJob("solo", 1, 1, 0.0)])
    assert isinstance(result, Wait)
    plan = choose_sources(req(hi=8), 0, [RunningJob("a", 8, 6, 0.0)])
    assert isinstance(plan, ProfilePlan) and plan.borrowed == 2 and plan.counts_desc == (2, 1)


def test_lender_is_least_recently_interrupted() -> None:
    running = [
        RunningJob("recent", 64, 1, 900.0),
        RunningJob("oldest", 64, 1, 100.0),
        RunningJob("middle", 64, 1, 500.0),
    ]
    plan = choose_sources(req(), 4, running)
    assert isinstance(plan, ProfilePlan) and plan.lender == "oldest" and plan.borrowed == 60
    # a tie on last_interrupted goes to the smaller job id
    tie = [RunningJob("b", 64, 1, 100.0), RunningJob("a", 64, 1, 100.0)]
    assert choose_sources(req(), 4, tie).lender == "a"  # type: ignore[union-attr]


def test_reach_comes_before_lru() -> None:
    running = [RunningJob("old_small", 5, 1, 0.0), RunningJob("new_big", 64, 1, 10.0)]
    plan = choose_sources(req(), 4, running)
    assert isinstance(plan, ProfilePlan) and plan.lender == "new_big" and plan.top == 64
    # when both reach the largest count, LRU decides
    plan = choose_sources(req(hi=8), 4, running)
    assert isinstance(plan, ProfilePlan) and plan.lender == "old_small" and plan.borrowed == 4


def test_profiling_jobs_do_not_lend() -> None:
    running = [RunningJob("p", 64, 1, 0.0, profiling=True)]
    assert isinstance(choose_sources(req(), 1, running), Wait)
    assert RunningJob("p", 64, 1, 0.0, profiling=True).lendable == 0


def test_waits_when_fewer_than_two_counts_can_be_sourced() -> None:
    result = choose_sources(req(), 1, [])
    assert isinstance(result, Wait) and result.reachable == (1,) and "needs 2" in result.reason
    assert isinstance(choose_sources(req(), 0, []), Wait)
    assert isinstance(choose_sources(req(lo=8), 7, [RunningJob("a", 1, 1, 0.0)]), Wait)
    assert isinstance(choose_sources(req(lo=8, hi=16), 8, []), Wait)  # only 8 of (8, 16)
    # one count asked for: one is enough
    plan = choose_sources(req(lo=4, hi=4), 4, [])
    assert isinstance(plan, ProfilePlan) and plan.counts_desc == (4,)


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ProfilingError, match="job new asks to be profiled but is listed as running"):
        choose_sources(req(), 4, [RunningJob("new", 4, 1, 0.0)])
    with pytest.raises(ProfilingError, match="listed twice"):
        choose_sources(req(), 4, [RunningJob("a", 4, 1, 0.0), RunningJob("a", 4, 1, 0.0)])
    with pytest.raises(ProfilingError, match="free_nodes is negative"):
        choose_sources(req(), -1, [])


def test_plan_steps_scale_up_once_then_only_down() -> None:
    plan = choose_sources(req(), 64, [])
    assert isinstance(plan, ProfilePlan)
    steps = plan.steps()
    assert [s.kind for s in steps].count(StepKind.UP) == 1
    assert steps[0].kind is StepKind.UP and (steps[0].from_nodes, steps[0].to_nodes) == (0, 64)
    for s in steps[1:]:
        assert s.kind is StepKind.DOWN and s.to_nodes < s.from_nodes
    assert [s.to_nodes for s in steps] == [64, 32, 16, 8, 4, 2, 1]


running_st = st.lists(
    st.builds(
        RunningJob,
        job_id=st.sampled_from("abcdefgh"),
        nodes=st.integers(0, 80),
        min_nodes=st.integers(0, 10),
        last_interrupted=st.floats(0, 1000),
        profiling=st.booleans(),
    ),
    max_size=6,
    unique_by=lambda r: r.job_id,
)


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 16), st.integers(0, 64), st.integers(0, 80), running_st)
def test_property_source_rules(lo: int, span: int, free: int, running: list[RunningJob]) -> None:
    request = req(lo=lo, hi=lo + span)
    targets = request.targets()
    result = choose_sources(request, free, running)
    by_id = {r.job_id: r for r in running}
    best_single = max([0] + [r.lendable for r in running])
    if isinstance(result, Wait):
        assert len([c for c in targets if c <= free + best_single]) < min(2, len(targets))
        return
    top = result.top
    assert list(result.counts_desc) == sorted(result.counts_desc, reverse=True)
    assert set(result.counts_desc) == {c for c in targets if c <= top}
    assert result.from_free + result.borrowed == top
    assert result.from_free <= free
    if result.lender is None:
        assert result.borrowed == 0
    else:
        lender = by_id[result.lender]
        assert 1 <= result.borrowed <= lender.lendable
        assert lender.nodes - result.borrowed >= max(lender.min_nodes, 1)  # never to zero / below min
        assert not lender.profiling
        assert result.from_free == free  # free nodes are used up first
        # LRU among the lenders that reach the same top count
        same_reach = [r for r in running if r.lendable > 0 and free + r.lendable >= top]
        assert lender.last_interrupted == min(r.last_interrupted for r in same_reach)
    # the top is the highest count any single source could reach
    assert top == max(c for c in targets if c <= free + best_single)


# --- the session ----------------------------------------------------------------------------


def drive(
    session: ProfileSession,
    truth: ScalingModel,
    noise: float,
    seed: int = 1,
    start: float = 0.0,
    up_s: float = 18.0,
    down_s: float = 12.0,
    max_records: int = 50_000,
) -> tuple[list[object], float]:
    """Run a fake job: per-node batch 32, step time from ``truth``, rescale pauses, the session deciding."""
    rng = random.Random(seed)
    est = ThroughputEstimator()
    actions: list[object] = []
    t, ws, pause = start, session.count, up_s
    for _ in range(max_records):
        samples = 32 * ws
        t += pause + samples / truth.predict(ws) * rng.uniform(1 - noise, 1 + noise)
        pause = 0.0
        est.add(Record(samples, t, ws))
        action = session.next_action(t, est)
        if isinstance(action, Hold):
            assert action.count == ws
            continue
        actions.append(action)
        if isinstance(action, Done):
            return actions, t
        assert isinstance(action, StepDown) and action.from_nodes == ws
        ws, pause = action.count, down_s
    raise AssertionError("profile never finished")


TRUTH = ScalingModel(a=1e-6, b=3e-4, c=1.2e-5)


def test_session_profiles_in_inverse_order_and_returns_borrowed_nodes() -> None:
    plan = choose_sources(req(hi=32), 12, [RunningJob("lender", 40, 2, 0.0)])
    assert isinstance(plan, ProfilePlan) and plan.lender == "lender" and plan.borrowed == 20
    session = ProfileSession(plan, started_at=0.0, time_cap_s=600.0)
    actions, _ = drive(session, TRUTH, noise=0.03)
    downs = [a for a in actions if isinstance(a, StepDown)]
    assert [a.count for a in downs] == [16, 8, 4, 2, 1]
    assert all(a.released > 0 for a in downs)
    done = actions[-1]
    assert isinstance(done, Done)
    assert (done.return_nodes_to, done.borrowed, done.final_count) == ("lender", 20, 1)
    assert done.capped == () and done.missing == ()
    assert done.scalability is not None and done.scalability.source is Source.PROFILED
    for n, rate in done.scalability.measured.items():
        assert rate == pytest.approx(TRUTH.predict(n), rel=0.03)
    assert sorted(done.scalability.measured) == [1, 2, 4, 8, 16, 32]
    # idempotent after Done
    assert session.next_action(1e9, ThroughputEstimator()) is done


def test_session_holds_until_stable() -> None:
    plan = ProfilePlan("j", (4, 2), 4, None, 0)
    session = ProfileSession(plan, started_at=100.0, time_cap_s=50.0)
    est = ThroughputEstimator()
    t = 100.0
    for i in range(7):  # anchor + 2 warm-up + 4 steps: one short of min_steps
        t += 1.0
        est.add(Record(400, t, 4))
        assert session.next_action(t, est) == Hold(4, 150.0)
    t += 1.0
    est.add(Record(400, t, 4))
    assert session.next_action(t, est) == StepDown(4, 2)
    assert session.count == 2 and session.measured == {4: pytest.approx(400.0)}


def test_session_moves_on_at_the_time_cap_when_never_stable() -> None:
    plan = ProfilePlan("j", (8, 4, 2), 8, None, 0)
    session = ProfileSession(plan, started_at=0.0, time_cap_s=40.0)
    actions, end = drive(session, TRUTH, noise=0.7, seed=5)
    done = actions[-1]
    assert isinstance(done, Done)
    assert done.capped == (8, 4, 2)
    assert done.scalability is not None and sorted(done.scalability.measured) == [2, 4, 8]
    assert end >= 3 * 40.0


class NoSteps:
    """An estimator that never saw a step (a job that hangs)."""

    def estimate(self, world_size: int) -> Estimate | None:
        return None

    def stable(self, world_size: int, rel_ci: float = 0.05) -> bool:
        return False


def test_session_with_no_measurement_reports_missing_and_keeps_the_prior() -> None:
    plan = ProfilePlan("j", (4, 2), 4, "a", 3)
    bare = ProfileSession(plan, started_at=0.0, time_cap_s=10.0)
    assert bare.next_action(5.0, NoSteps()) == Hold(4, 10.0)
    assert bare.next_action(10.0, NoSteps()) == StepDown(4, 2)
    assert bare.next_action(15.0, NoSteps()) == Hold(2, 20.0)
    done = bare.next_action(20.0, NoSteps())
    assert isinstance(done, Done) and done.missing == (4, 2) and done.scalability is None
    assert done.return_nodes_to == "a" and done.borrowed == 3
    with_prior = ProfileSession(plan, started_at=0.0, time_cap_s=10.0, prior={1: 10.0, 4: 35.0})
    with_prior.next_action(10.0, NoSteps())
    done = with_prior.next_action(20.0, NoSteps())
    assert isinstance(done, Done) and done.scalability is not None
    assert done.scalability.source is Source.USER


def test_session_rejects_bad_knobs() -> None:
    plan = ProfilePlan("j9", (4, 2), 4, None, 0)
    with pytest.raises(ProfilingError, match="j9: rel_ci"):
        ProfileSession(plan, 0.0, rel_ci=0.0)
    with pytest.raises(ProfilingError, match="j9: time_cap_s"):
        ProfileSession(plan, 0.0, time_cap_s=float("inf"))


# --- inverse vs ascending -------------------------------------------------------------------


def test_profile_cost_inverse_needs_one_scale_up() -> None:
    counts = default_counts(1, 64)
    inv = profile_cost("inverse", counts, up_cost_s=18.0, down_cost_s=12.0, hold_s=60.0)
    asc = profile_cost("ascending", counts, up_cost_s=18.0, down_cost_s=12.0, hold_s=60.0)
    assert (inv.scale_ups, inv.scale_downs) == (1, 6)
    assert (asc.scale_ups, asc.scale_downs) == (7, 0)
    assert inv.seconds == 7 * 60 + 18 + 6 * 12
    assert asc.seconds == 7 * 60 + 7 * 18
    assert inv.seconds < asc.seconds and inv.node_seconds == 64 * inv.seconds
    with pytest.raises(ProfilingError, match="order"):
        profile_cost("random", counts, 1, 1, 1)  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 256), min_size=1, max_size=10), st.floats(0, 60), st.floats(0, 60), st.floats(0, 600))
def test_property_inverse_order_scales_up_once(counts: list[int], up: float, down: float, hold: float) -> None:
    k = len(set(counts))
    inv = profile_cost("inverse", counts, up, down, hold)
    asc = profile_cost("ascending", counts, up, down, hold)
    assert (inv.scale_ups, inv.scale_downs) == (1, k - 1)
    assert (asc.scale_ups, asc.scale_downs) == (k, 0)
    # each scale-up after the first becomes a scale-down
    assert inv.seconds - asc.seconds == pytest.approx((k - 1) * (down - up), abs=1e-6)
