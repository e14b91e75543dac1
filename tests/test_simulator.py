"""Simulator accounting on hand-built traces whose answers are computed by hand."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator import Plan, throughput_at
from simulator import (
    EventQueue,
    JobSpec,
    PolicyError,
    Priority,
    SimClock,
    SimConfig,
    Simulator,
    Workload,
    make_policy,
)
from simulator.policies import GreedyPolicy, MilpPolicy, SimView, equal_split
from traces.model import IdleTimeline

LINEAR = {1: 10.0, 2: 20.0, 4: 40.0}


def timeline(
    nodes: Sequence[str],
    initial: Sequence[str],
    changes: Sequence[tuple[float, str, bool]] = (),
    end: float = 300.0,
    start: float = 0.0,
) -> IdleTimeline:
    index = {n: i for i, n in enumerate(nodes)}
    return IdleTimeline(
        source="hand-built",
        format="test",
        nodes=tuple(nodes),
        start=start,
        end=end,
        initial_idle=frozenset(initial),
        times=np.array([c[0] for c in changes], dtype=np.float64),
        node_ids=np.array([index[c[1]] for c in changes], dtype=np.int32),
        idle=np.array([c[2] for c in changes], dtype=bool),
    )


def job(name: str = "a", samples: float = 1e12, arrival: float = 0.0, **kw) -> JobSpec:
    kw.setdefault("scaling", LINEAR)
    kw.setdefault("up_cost_s", 5.0)
    kw.setdefault("down_cost_s", 3.0)
    kw.setdefault("max_nodes", 4)
    return JobSpec(name=name, model="m", samples=samples, arrival_s=arrival, **kw)


def workload(*specs: JobSpec) -> Workload:
    return Workload("hand", "test", timed=list(specs), finite=True)


def run(tl: IdleTimeline, specs: Sequence[JobSpec], policy="greedy", **cfg):
    pol = make_policy(policy) if isinstance(policy, str) else policy
    return Simulator(tl, workload(*specs), pol, SimConfig(**cfg)).run()


def replay_progress(history, spec: JobSpec, end: float) -> float:
    """Independent integral of true throughput minus pauses over a job's change log."""
    done = 0.0
    for (t0, _, n, paused), nxt in zip(history, list(history[1:]) + [(end, 0.0, 0, 0.0)]):
        work = max(0.0, nxt[0] - max(t0, paused))
        done += throughput_at(spec.scaling, n) * work
    return min(done, spec.samples)


# ------------------------------------------------------------------ clock and heap


def test_event_queue_orders_ties_by_priority_then_insertion():
    q: EventQueue[str] = EventQueue()
    q.push(5.0, Priority.ARRIVAL, "arrival")
    q.push(5.0, Priority.TRACE, "trace-1")
    q.push(1.0, Priority.END, "early")
    q.push(5.0, Priority.TRACE, "trace-2")
    q.push(5.0, Priority.COMPLETION, "done")
    assert [q.pop()[2] for _ in range(len(q))] == ["early", "done", "trace-1", "trace-2", "arrival"]


def test_clock_never_goes_back():
    clock = SimClock(10.0)
    clock.advance_to(12.5)
    assert clock.now() == 12.5
    with pytest.raises(ValueError, match="back"):
        clock.advance_to(3.0)


# ------------------------------------------------------------------ hand-computed runs


def three_node_trace() -> IdleTimeline:
    # 2 nodes at 0; a third arrives at 100; node a is recalled at 200; end at 300
    return timeline("abc", "ab", [(100.0, "c", True), (200.0, "a", False)], end=300.0)


def test_progress_is_throughput_integral_minus_pauses():
    res = run(three_node_trace(), [job()], "greedy")
    s = res.summary
    # 0-100: 2 nodes at 20/s; 100: grow to 3 (30/s) pausing 5 s; 200: shrink to 2, pausing 3 s
    assert s["samples_processed"] == pytest.approx(20 * 100 + 30 * 95 + 20 * 97)
    assert s["used_node_seconds"] == pytest.approx(2 * 100 + 3 * 100 + 2 * 100)
    assert s["idle_node_seconds"] == pytest.approx(700.0)
    assert s["paused_node_seconds"] == pytest.approx(3 * 5 + 2 * 3)
    assert (s["rescales"], s["preemptions"], s["starts"]) == (2, 0, 1)
    assert s["decisions"] == 3


def test_oracle_rescales_for_free():
    res = run(three_node_trace(), [job()], "oracle")
    assert res.summary["samples_processed"] == pytest.approx(20 * 100 + 30 * 100 + 20 * 100)
    assert res.summary["paused_node_seconds"] == 0.0


def test_charge_start_makes_a_start_pay_the_up_cost():
    res = run(three_node_trace(), [job()], "greedy", charge_start=True)
    assert res.summary["samples_processed"] == pytest.approx(20 * 95 + 30 * 95 + 20 * 97)


def test_min_interval_defers_decisions_but_not_recalls():
    tl = timeline("abc", "ab", [(30.0, "c", True), (70.0, "a", False)], end=300.0)
    res = run(tl, [job()], "greedy", min_interval_s=60.0)
    s = res.summary
    # the third node waits until the decision at 60; the recall at 70 shrinks the job at once
    assert [r.time for r in res.rows] == [0.0, 60.0, 120.0]
    assert s["samples_processed"] == pytest.approx(20 * 60 + 30 * 5 + 20 * 227)
    assert s["used_node_seconds"] == pytest.approx(2 * 60 + 3 * 10 + 2 * 230)
    assert s["idle_node_seconds"] == pytest.approx(2 * 30 + 3 * 40 + 2 * 230)


def test_completion_frees_nodes_and_stale_completion_is_ignored():
    # 1000 samples at 20/s would end at 50; a third node at 20 (pause 5 s) moves it to 45
    tl = timeline("abc", "ab", [(20.0, "c", True)], end=300.0)
    res = run(tl, [job(samples=1000.0)], "greedy")
    (j,) = res.jobs
    assert j.finished_at == pytest.approx(20 + 5 + 600 / 30)
    s = res.summary
    assert s["jobs_completed"] == 1 and s["samples_processed"] == pytest.approx(1000.0)
    assert s["makespan_seconds"] == pytest.approx(45.0)
    assert s["used_node_seconds"] == pytest.approx(2 * 20 + 3 * 25)


def test_recall_below_min_stops_job_and_it_returns_first():
    # min 2 nodes; node a is recalled at 50 and comes back at 150
    tl = timeline("ab", "ab", [(50.0, "a", False), (150.0, "a", True)], end=300.0)
    first = job("first", min_nodes=2, max_nodes=2)
    second = job("second", min_nodes=2, max_nodes=2)
    res = run(tl, [first, second], "greedy", max_running=1)
    a, b = res.jobs
    assert res.summary["preemptions"] == 1
    assert a.spec.name == "first" and b.progress == 0.0  # the preempted job went back in front
    assert a.progress == pytest.approx(20 * 50 + 20 * 150)  # kept its progress; restart is free
    assert res.summary["used_node_seconds"] == pytest.approx(2 * 50 + 2 * 150)


def test_recalled_node_of_a_free_pool_costs_nothing():
    tl = timeline("abcd", "abcd", [(100.0, "d", False)], end=200.0)
    res = run(tl, [job(max_nodes=2)], "greedy")
    assert res.summary["rescales"] == 0
    assert res.summary["samples_processed"] == pytest.approx(20 * 200)
    assert res.summary["used_node_seconds"] == pytest.approx(400.0)
    assert res.summary["idle_node_seconds"] == pytest.approx(4 * 100 + 3 * 100)


def test_batch_of_arrivals_fills_free_slots_at_once():
    tl = timeline("abcdef", "abcdef", end=100.0)
    specs = [job(f"j{i}", arrival=10.0, max_nodes=2) for i in range(4)]
    res = run(tl, specs, "greedy", max_running=3)
    at_10 = [r for r in res.rows if r.time == 10.0]
    assert len(at_10) == 1  # one decision for the whole batch
    assert at_10[0].running_jobs == 3 and at_10[0].queued_jobs == 1
    assert all(r.running_jobs <= 3 for r in res.rows)


def test_fcfs_finite_workload_makespan():
    tl = timeline("ab", "ab", end=1000.0)
    specs = [job(f"j{i}", samples=400.0, max_nodes=2) for i in range(3)]
    res = run(tl, specs, "greedy", max_running=1)
    finished = [j.finished_at for j in res.jobs]
    assert finished == pytest.approx([20.0, 40.0, 60.0])
    assert res.summary["makespan_seconds"] == pytest.approx(60.0)


def test_unfinished_finite_workload_has_no_makespan():
    tl = timeline("ab", "ab", end=10.0)
    res = run(tl, [job(samples=1e6)], "greedy")
    assert res.summary["makespan_seconds"] is None
    assert res.summary["jobs_completed"] == 0


def test_window_start_end_replays_the_state_at_start():
    tl = timeline("abc", "a", [(50.0, "b", True), (150.0, "c", True), (250.0, "a", False)], end=300.0)
    res = Simulator(tl, workload(job()), make_policy("greedy"), SimConfig(start=100.0, end=200.0)).run()
    assert res.summary["span_seconds"] == 100.0
    assert res.summary["idle_node_seconds"] == pytest.approx(tl.idle_node_seconds(100.0, 200.0))
    assert res.rows[0].idle_nodes == 2


TIMINGS = ("wall_seconds", "cpu_seconds", "decision_ms_p50", "decision_ms_p99")


def strip(s: dict, *more: str) -> dict:
    return {k: v for k, v in s.items() if k not in TIMINGS + more}


def test_same_inputs_give_identical_summaries():
    tl = three_node_trace()

    for policy in ("malletrain", "milp-true", "greedy", "equal", "oracle"):
        a = run(tl, [job("x"), job("y")], policy)
        b = run(tl, [job("x"), job("y")], policy)
        assert strip(a.summary) == strip(b.summary)


def test_skipping_identical_noop_problems_changes_nothing():
    # many recalls/arrivals of nodes beyond what the jobs can use: identical problems
    changes = [(float(10 * k), f"x{k % 4}", k % 8 < 4) for k in range(1, 40)] + [(405.0, "a", False)]
    tl = timeline(["a", "b", "c", "x0", "x1", "x2", "x3"], "abc", sorted(changes), end=500.0)
    for policy in ("milp-true", "greedy", "equal", "oracle"):  # the stateless ones
        skipping = make_policy(policy)
        asking = make_policy(policy)
        asking.stateless = False  # type: ignore[misc]
        a = run(tl, [job("x", max_nodes=2), job("y", max_nodes=1)], skipping)
        b = run(tl, [job("x", max_nodes=2), job("y", max_nodes=1)], asking)
        assert a.summary["policy_calls"] < b.summary["policy_calls"] == b.summary["decisions"]
        assert strip(a.summary, "policy_calls") == strip(b.summary, "policy_calls")


# ------------------------------------------------------------------ policy hooks and rules


class Recorder(GreedyPolicy):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, int, float, float]] = []

    def observe(self, job_id: str, nodes: int, samples: float, seconds: float) -> None:
        self.seen.append((job_id, nodes, samples, seconds))


def test_observe_hook_sees_every_interval():
    rec = Recorder()
    res = run(three_node_trace(), [job()], rec)
    assert sum(s for _, _, s, _ in rec.seen) == pytest.approx(res.summary["samples_processed"])
    assert sum(n * sec for _, n, _, sec in rec.seen) == pytest.approx(res.summary["used_node_seconds"])


class Thief(GreedyPolicy):
    name = "thief"

    def decide(self, view: SimView) -> Plan:
        if len(view.jobs) < 2 or not view.jobs[0].nodes:
            return super().decide(view)
        a, b = view.jobs[0], view.jobs[1]
        return Plan({a.id: a.nodes, b.id: (a.nodes[0],)}, 0.0, 0.0)


class Swapper(GreedyPolicy):
    name = "swapper"

    def decide(self, view: SimView) -> Plan:
        j = view.jobs[0]
        if j.nodes and view.free_nodes:
            return Plan({j.id: (view.free_nodes[0],) + j.nodes[1:]}, 0.0, 0.0)
        return super().decide(view)


def test_policy_breaking_the_rules_is_named():
    tl = timeline("abcd", "ab", [(10.0, "c", True)], end=100.0)
    with pytest.raises(PolicyError, match=r"thief.*j0000\d.*node 'a'"):
        run(tl, [job("x", max_nodes=2), job("y", max_nodes=2)], Thief())
    with pytest.raises(PolicyError, match="swapper.*both gain and lose"):
        run(tl, [job("x")], Swapper())


def jv(i: str, lo: int, hi: int, nodes: tuple[str, ...] = ()) -> "JobView":
    from simulator.policies import JobView

    return JobView(i, i, "m", lo, hi, LINEAR, LINEAR, nodes, 0.0, 1.0, 5.0, 3.0, 0.0, None, 0.0)


def test_pinned_job_runs_on_exactly_its_pin_borrowing_from_a_runner():
    view = SimView(now=0.0, free_nodes=("e",), n_free=1,
                   jobs=(jv("big", 1, 4, ("a", "b", "c", "d")), jv("probe", 1, 4)), queue=(), horizon_s=60.0)
    policy = MilpPolicy()
    policy.pins = {"probe": 3}
    plan = policy.decide(view)
    assert plan.nodes_of("probe") == ("e", "c", "d")  # the free node, then two borrowed
    assert plan.nodes_of("big") == ("a", "b")  # the lender only shrank


def test_pinned_job_in_a_replay_keeps_its_count():
    tl = timeline("abcd", "abcd", [(100.0, "d", False)], end=200.0)
    policy = MilpPolicy()
    policy.pins = {"j00001": 1}
    res = run(tl, [job("big", max_nodes=4), job("probe", max_nodes=4)], policy)
    assert [h[2] for h in res.jobs[1].history] == [1]
    assert [h[2] for h in res.jobs[0].history] == [3, 2]


def test_equal_split_waterfills_and_respects_min():
    view = jv
    jobs = (view("a", 1, 2), view("b", 1, 64), view("c", 1, 64))
    assert equal_split(11, jobs) == {"a": 2, "b": 5, "c": 4}
    assert equal_split(3, (view("a", 2, 8), view("b", 2, 8))) == {"a": 3, "b": 0}


# ------------------------------------------------------------------ properties

node_names = [f"n{i}" for i in range(6)]


@st.composite
def small_traces(draw):
    initial = draw(st.sets(st.sampled_from(node_names)))
    # at most one change per node per time, as IdleTimeline guarantees; several nodes may share a time
    pairs = draw(st.lists(st.tuples(st.integers(1, 60).map(lambda k: k * 8), st.sampled_from(node_names)),
                          max_size=25, unique=True))
    state = {n: n in initial for n in node_names}
    changes = []
    for t, node in sorted(pairs):
        state[node] = not state[node]
        changes.append((float(t), node, state[node]))
    return timeline(node_names, sorted(initial), changes, end=500.0)


@st.composite
def small_jobs(draw):
    n = draw(st.integers(1, 4))
    specs = []
    for i in range(n):
        lo = draw(st.integers(1, 2))
        hi = draw(st.integers(lo, 4))
        specs.append(job(
            f"j{i}",
            samples=float(draw(st.integers(100, 20_000))),
            arrival=float(draw(st.integers(0, 300))),
            min_nodes=lo,
            max_nodes=hi,
            scaling={1: 10.0, 2: 18.0, 4: 30.0},
            up_cost_s=float(draw(st.integers(0, 20))),
            down_cost_s=float(draw(st.integers(0, 20))),
        ))
    return specs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tl=small_traces(), specs=small_jobs(), policy=st.sampled_from(["malletrain", "milp-true", "greedy", "equal", "oracle"]),
       pjmax=st.integers(1, 3), interval=st.sampled_from([0.0, 0.0, 25.0]))
def test_conservation_and_progress_on_random_traces(tl, specs, policy, pjmax, interval):
    res = run(tl, specs, policy, max_running=pjmax, horizon_s=60.0, min_interval_s=interval)
    s = res.summary
    assert s["idle_node_seconds"] == pytest.approx(tl.idle_node_seconds(), abs=1e-6)
    assert s["used_node_seconds"] <= s["idle_node_seconds"] + 1e-6
    assert s["used_node_seconds"] == pytest.approx(sum(j.node_seconds for j in res.jobs), abs=1e-6)
    for j in res.jobs:
        expected = replay_progress(j.history, j.spec, res.end)
        assert j.progress == pytest.approx(expected, rel=1e-9, abs=1e-6), j.id
        assert j.progress <= j.spec.samples + 1e-9
        if j.finished_at is not None:
            assert j.progress == j.spec.samples
        assert j.profiling_scale_ups == (1 if j.profiled else 0), j.id  # inverse order: one scale-up
        assert j.profiling_node_seconds <= j.node_seconds + 1e-6
    assert all(r.running_jobs <= pjmax and r.used_nodes <= r.idle_nodes for r in res.rows)
    assert s["jobs_completed"] <= s["jobs_submitted"] == len(specs) - sum(
        1 for sp in specs if sp.arrival_s >= 500.0
    )
    assert not math.isnan(s["samples_processed"])
    asking = make_policy(policy)
    asking.stateless = False  # type: ignore[misc]
    again = run(tl, specs, asking, max_running=pjmax, horizon_s=60.0, min_interval_s=interval)
    assert strip(again.summary, "policy_calls") == strip(s, "policy_calls")
