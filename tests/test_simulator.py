"""Simulator accounting on hand-built traces whose answers are computed by hand."""

from __future__ import annotations

import gc
import math
from dataclasses import replace
from typing import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator import throughput_at
from policy import Decision, Evidence, Policy, PolicyConfig, View, preset
from simulator import (
    EventQueue,
    JobSpec,
    PolicyContext,
    PolicyError,
    Priority,
    SimClock,
    SimConfig,
    SimPolicy,
    Simulator,
    Workload,
    make_policy,
)
from traces.model import IdleTimeline

LINEAR = {1: 10.0, 2: 20.0, 4: 40.0}
FAST = {1: 1000.0, 2: 2000.0, 4: 4000.0}  # steps of 0.256 s: the simulated monitor measures in seconds
PRESET_NAMES = ("malletrain", "freetrain", "milp-true", "greedy", "equal", "oracle")


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
    return Workload("hand", "test", timed=list(specs), finite=True, models={s.model: s.scaling for s in specs})


def named(name: str, specs: Sequence[JobSpec] = (), **knobs) -> SimPolicy:
    """A named policy on PolicyConfig(**knobs), given the workload's model curves."""
    return make_policy(name, PolicyContext({s.model: s.scaling for s in specs}), PolicyConfig(**knobs))


def run(tl: IdleTimeline, specs: Sequence[JobSpec], policy: str | SimPolicy = "greedy",
        max_running: int = 10, tfwd_s: float = 120.0, **cfg):
    pol = named(policy, specs, max_running=max_running, tfwd_s=tfwd_s) if isinstance(policy, str) else policy
    return Simulator(tl, workload(*specs), pol, SimConfig(**cfg)).run()


class NoSkip(Policy):
    """The shared policy with its no-op key forgotten before every decision: it always solves."""

    def decide(self, view: View, evidence: Evidence) -> Decision:
        self._noop_key = None
        return super().decide(view, evidence)


def always_solving(pol: SimPolicy) -> SimPolicy:
    return replace(pol, policy=NoSkip(pol.policy.config))


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


def test_event_queue_pops_priorities_as_members():
    q: EventQueue[str] = EventQueue()
    for p in Priority:
        q.push(1.0, p, p.name)
    assert [q.pop()[1:] for _ in range(len(q))] == [(p, p.name) for p in Priority]
    assert all(type(p) is Priority for p in Priority)


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


class SeesCollector(Policy):
    """The shared policy, noting the cyclic collector's thresholds at every decision."""

    seen: list[tuple[int, int, int]] = []

    def decide(self, view: View, evidence: Evidence) -> Decision:
        SeesCollector.seen.append(gc.get_threshold())
        return super().decide(view, evidence)


def test_a_replay_collects_cycles_rarely_and_gives_the_callers_thresholds_back():
    """The replay raises the collector's first threshold (a full collection walks every live job, row and
    estimator) while it runs, and the caller's thresholds are back after it, also when it fails."""
    from simulator.engine import REPLAY_GC_THRESHOLD

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 9, 8)
        SeesCollector.seen = []
        pol = replace(named("greedy", [job()]), policy=SeesCollector(preset("greedy")))
        Simulator(three_node_trace(), workload(job()), pol, SimConfig()).run()
        assert SeesCollector.seen and all(t == (REPLAY_GC_THRESHOLD, 9, 8) for t in SeesCollector.seen)
        assert gc.get_threshold() == (700, 9, 8)

        class Fails(Policy):
            def decide(self, view: View, evidence: Evidence) -> Decision:
                raise RuntimeError("policy bug")

        with pytest.raises(Exception, match="policy bug"):
            Simulator(three_node_trace(), workload(job()), replace(pol, policy=Fails(preset("greedy"))), SimConfig()).run()
        assert gc.get_threshold() == (700, 9, 8)
    finally:
        gc.set_threshold(*before)


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


def test_constrained_and_unconstrained_periods_split_the_accounting():
    # 4 idle nodes, a job of at most 2: the pool exceeds what it can absorb until c, d are recalled at 100
    tl = timeline("abcd", "abcd", [(100.0, "c", False), (100.0, "d", False)], end=200.0)
    res = run(tl, [job(max_nodes=2)], "greedy")
    s = res.summary
    assert (s["unconstrained_seconds"], s["constrained_seconds"]) == (100.0, 100.0)
    assert (s["idle_node_seconds_unconstrained"], s["idle_node_seconds_constrained"]) == (400.0, 200.0)
    assert (s["used_node_seconds_unconstrained"], s["used_node_seconds_constrained"]) == (200.0, 200.0)
    # 2 nodes of a linear curve = 2 node-seconds of 1-node work per second
    assert s["work_node_seconds_unconstrained"] == pytest.approx(200.0)
    assert s["work_node_seconds_constrained"] == pytest.approx(200.0)
    assert s["work_node_seconds"] == pytest.approx(400.0)
    assert s["excess_idle_node_seconds"] == pytest.approx(200.0)
    assert [r.constrained for r in res.rows] == [False, True]


def test_job_completion_times_and_who_waits():
    # one slot, three jobs of 20 s each: they finish at 20, 40, 60 and wait 0, 20, 40
    tl = timeline("ab", "ab", end=1000.0)
    slow = replace(job("slow", samples=200.0, max_nodes=2, scaling={1: 5.0, 2: 10.0}), model="slow-model")
    mid = replace(job("mid", samples=400.0, max_nodes=2), model="mid-model")
    fast = replace(job("fast", samples=800.0, max_nodes=2, scaling={1: 20.0, 2: 40.0}), model="fast-model")
    res = run(tl, [mid, fast, slow], "greedy", max_running=1)
    s = res.summary
    assert s["makespan_seconds"] == pytest.approx(60.0)
    assert s["jct_mean_seconds"] == pytest.approx(40.0) and s["jct_p95_seconds"] == pytest.approx(60.0)
    assert s["wait_mean_seconds"] == pytest.approx(20.0)
    assert s["wait_slowest_quarter_seconds"] == pytest.approx(40.0)  # the slow model came last
    assert s["wait_fastest_quarter_seconds"] == pytest.approx(20.0)
    assert s["longest_waiting_model"] == "slow-model" and s["longest_waiting_model_seconds"] == pytest.approx(40.0)


def test_max_nodes_caps_every_job():
    res = run(three_node_trace(), [job()], "greedy", max_nodes=1)
    assert res.summary["used_node_seconds"] == pytest.approx(300.0)
    with pytest.raises(ValueError, match="max_nodes"):
        SimConfig(max_nodes=0)


def test_window_start_end_replays_the_state_at_start():
    tl = timeline("abc", "a", [(50.0, "b", True), (150.0, "c", True), (250.0, "a", False)], end=300.0)
    res = Simulator(tl, workload(job()), named("greedy"), SimConfig(start=100.0, end=200.0)).run()
    assert res.summary["span_seconds"] == 100.0
    assert res.summary["idle_node_seconds"] == pytest.approx(tl.idle_node_seconds(100.0, 200.0))
    assert res.rows[0].idle_nodes == 2


def test_summary_records_the_policy_config():
    res = run(three_node_trace(), [job()], "greedy", max_running=3, tfwd_s=60.0)
    s = res.summary
    assert (s["max_running"], s["horizon_s"]) == (3, 60.0)
    assert s["policy_config"] == preset("greedy", PolicyConfig(max_running=3, tfwd_s=60.0)).as_dict()


TIMINGS = ("wall_seconds", "cpu_seconds", "decision_ms_p50", "decision_ms_p99")


def strip(s: dict, *more: str) -> dict:
    return {k: v for k, v in s.items() if k not in TIMINGS + more}


def test_same_inputs_give_identical_summaries():
    tl = three_node_trace()
    for policy in PRESET_NAMES:
        a = run(tl, [job("x"), job("y")], policy)
        b = run(tl, [job("x"), job("y")], policy)
        assert strip(a.summary) == strip(b.summary), policy


def test_the_policys_noop_key_skips_solving_and_changes_nothing():
    # many recalls/arrivals of nodes beyond what the jobs can use: identical problems, which the
    # policy answers "unchanged" without running the allocator
    changes = [(float(10 * k), f"x{k % 4}", k % 8 < 4) for k in range(1, 40)] + [(405.0, "a", False)]
    tl = timeline(["a", "b", "c", "x0", "x1", "x2", "x3"], "abc", sorted(changes), end=500.0)
    specs = [job("x", max_nodes=2, scaling=FAST), job("y", max_nodes=1, scaling=FAST)]
    for policy in PRESET_NAMES:
        a = run(tl, specs, named(policy, specs))
        b = run(tl, specs, always_solving(named(policy, specs)))
        assert a.summary["policy_calls"] == a.summary["decisions"] == b.summary["policy_calls"], policy
        assert a.summary["solver_calls"] < b.summary["solver_calls"] == b.summary["policy_calls"], policy
        assert strip(a.summary, "solver_calls") == strip(b.summary, "solver_calls"), policy


# ------------------------------------------------------------------ what the policy is told


def test_evidence_comes_from_the_simulated_monitor():
    # the monitor turns step records drawn from the TRUE curve into the estimates and pauses the
    # daemon's monitor would report: rates at every count the job ran at, one pause per rescale
    tl = timeline("abc", "ab", [(100.0, "c", True), (200.0, "a", False)], end=300.0)
    # the daemon's: learns; no probe (the one below the count it holds would add a count to its history)
    pol = SimPolicy("defaults", Policy(PolicyConfig(profiling="never")), lambda spec: None)
    res = run(tl, [job(scaling=FAST)], pol)
    (j,) = res.jobs
    assert [h[2] for h in j.history] == [2, 3, 2]
    ev = j.monitor.evidence(res.end)
    assert set(ev.rates) == {2, 3}
    for n, est in ev.rates.items():
        assert est.rate == pytest.approx(throughput_at(FAST, n), rel=0.03)
    assert (ev.costs.n_up, ev.costs.n_down) == (1, 1)
    assert ev.costs.up_s == pytest.approx(5.0, abs=0.5) and ev.costs.down_s == pytest.approx(3.0, abs=0.5)
    assert set(pol.policy.state.measured[j.id]) == {2, 3}  # the policy learned both counts from them


def test_monitor_evidence_is_evidence_from_its_rates_and_events():
    # the monitor summarises its rescale events once per probe: what it shows is still what
    # policy.evidence_from(rates, events) makes, at every moment
    from policy import evidence_from
    from simulator.monitor import SimJobMonitor

    mon = SimJobMonitor("j", FAST, seed=3)
    t = 0.0
    for old, new in [(0, 2), (2, 3), (3, 1), (1, 4), (4, 0), (0, 2)]:
        mon.change(t, old, new, t + 5.0)
        for dt in (1.0, 3.0, 7.0, 20.0):
            ev = mon.evidence(t + dt)
            assert ev == evidence_from(mon.rates, mon.events)
            assert mon.evidence(t + dt) is ev  # nothing new: the same object
        t += 40.0
    assert len(mon.events) == 3 and len(mon.rates) == 4


def test_job_views_moved_on_equal_the_constructors():
    # a running job's view is the ledger's, moved on by events (placed, progressed); it must be the
    # JobView the constructor makes
    from policy import JobView

    # job a stays at its 2 nodes while nodes come and go (a decision each time); b finishes early
    changes = [(50.0, "c", True), (100.0, "d", True), (150.0, "c", False), (200.0, "e", True), (250.0, "d", False)]
    tl = timeline("abcde", "ab", changes, end=300.0)
    sim = Simulator(tl, workload(job(max_nodes=2), job("b", samples=5e3)), named("greedy"), SimConfig())
    shown: list[tuple[object, JobView]] = []
    real = sim.policy.decide

    def decide(view: View, evidence: Evidence) -> Decision:
        shown.extend((sim.jobs[v.id], v) for v in view.jobs)
        return real(view, evidence)

    sim.policy.decide = decide  # type: ignore[method-assign]
    sim.run()
    assert len(shown) > 4
    for simjob, v in shown:
        spec = simjob.spec  # type: ignore[attr-defined]
        fresh = JobView(id=v.id, min_nodes=spec.min_nodes, max_nodes=spec.max_nodes, nodes=v.nodes, order=v.order,
                        last_interrupted=v.last_interrupted, scaling=simjob.user_curve,  # type: ignore[attr-defined]
                        profile=False, work_left=v.work_left, used_node_hours=v.used_node_hours)
        assert v == fresh and vars(v) == vars(fresh)


def test_monitor_draws_a_run_only_as_far_as_it_is_read(monkeypatch):
    # a run replaced before a look reaches its records draws none of them; a look draws up to its time,
    # and stable_at draws on to the stable point
    import simulator.monitor as monitor
    from profiler.records import iter_records

    drawn: list[float] = []

    def counted(*args, **kwargs):
        for rec in iter_records(*args, **kwargs):
            drawn.append(rec.timestamp)
            yield rec

    monkeypatch.setattr(monitor, "iter_records", counted)
    mon = monitor.SimJobMonitor("j", FAST, seed=3, costs=False)
    mon.change(10.0, 0, 2, 15.0)  # its first record comes after 15.0
    mon.change(12.0, 2, 4, 12.0)  # replaced before any: none drawn
    assert drawn == []
    mon.evidence(12.5)
    assert drawn and drawn[-1] > 12.5 and all(t <= 12.5 for t in drawn[:-1])  # one past the look
    assert mon.stable_at == drawn[-1] and mon.stable_at > 12.5


def test_monitor_estimates_are_those_of_its_records():
    # the monitor feeds its estimator the records' fields and makes an Estimate only for the newest
    # one a look reaches: what it shows at each record's time is the estimate after that record
    from itertools import islice

    from profiler import ThroughputEstimator
    from simulator.monitor import CHUNK, MAX_CHUNKS, SimJobMonitor, StepFeed, _seed

    mon = SimJobMonitor("j", FAST, seed=3, rel_ci=0.01)  # strict: a few chunks of records
    mon.change(10.0, 0, 2, 15.0)
    est, snaps = ThroughputEstimator(), []
    for rec in islice(StepFeed("j", FAST, 2, 15.0, seed=_seed(3, 1)).records(), MAX_CHUNKS * CHUNK):
        est.add(rec)
        e = est.estimate(2)
        if e is not None:
            snaps.append((rec.timestamp, e))
            if est.stable(2, mon.rel_ci):
                break
    assert len(snaps) > CHUNK and mon.stable_at == snaps[-1][0]
    assert 2 not in mon.evidence(snaps[0][0] - 1e-9).rates
    for ts, e in snaps:
        assert mon.evidence(ts).rates[2] == e


def test_the_views_idle_since_is_the_free_nodes_idle_times():
    # the ledger keeps each free node's idle-since time in its free pool: the view's idle_since is
    # every shown free node's time, in the free nodes' order
    changes = [(50.0, "c", True), (100.0, "d", True), (150.0, "c", False), (200.0, "e", True), (250.0, "c", True)]
    tl = timeline("abcde", "ab", changes, end=300.0)
    sim = Simulator(tl, workload(job(max_nodes=2), job("b", samples=5e3, max_nodes=1)), named("greedy"), SimConfig())
    seen: list[View] = []
    real = sim.policy.decide

    def decide(view: View, evidence: Evidence) -> Decision:
        seen.append(view)
        assert list(view.idle_since) == list(view.free_nodes)
        assert view.idle_since == {n: sim.ledger.idle_since(n) for n in view.free_nodes}
        return real(view, evidence)

    sim.policy.decide = decide  # type: ignore[method-assign]
    sim.run()
    assert any(view.free_nodes for view in seen)


def test_the_policy_reads_measured_rescale_costs_not_the_true_ones():
    # growing 2 -> 3 -> 4 nodes adds 10 samples/s each time; over Tfwd 120 s that is worth 1200 samples.
    # The true up pause is 50 s. Before any measurement the policy assumes the default 10 s (cost at
    # 3 nodes: 300 samples) and grows at 100; the monitor then measures ~50 s (cost at 4 nodes: 2000
    # samples) and the policy declines the node that arrives at 400.
    tl = timeline("abcd", "ab", [(100.0, "c", True), (400.0, "d", True)], end=1000.0)
    slow = job(up_cost_s=50.0)
    res = run(tl, [slow], "milp-true")
    (j,) = res.jobs
    assert [(t, n) for t, _, n, _ in j.history] == [(0.0, 2), (100.0, 3)]
    assert j.monitor.evidence(res.end).costs.up_s == pytest.approx(50.0, abs=1.0)
    # with a 5 s pause it takes both nodes; the oracle (free rescales, charged nothing) too
    assert [n for _, _, n, _ in run(tl, [job(up_cost_s=5.0)], "milp-true").jobs[0].history] == [2, 3, 4]
    assert [n for _, _, n, _ in run(tl, [slow], "oracle").jobs[0].history] == [2, 3, 4]


# ------------------------------------------------------------------ the engine's own rules


class Thief(Policy):
    """Gives the second job a node the first one keeps."""

    def decide(self, view: View, evidence: Evidence) -> Decision:
        d = super().decide(view, evidence)
        jobs = [j for j in view.jobs if j.id in d.admitted]
        if len(jobs) < 2 or not jobs[0].nodes:
            return d
        a, b = jobs[0], jobs[1]
        return replace(d, assignment={**d.assignment, a.id: a.nodes, b.id: (a.nodes[0],)})


class Swapper(Policy):
    """Moves the first job from one of its nodes to a free one."""

    def decide(self, view: View, evidence: Evidence) -> Decision:
        d = super().decide(view, evidence)
        j = next((j for j in view.jobs if j.id in d.admitted), None)
        if j is not None and j.nodes and view.free_nodes:
            return replace(d, assignment={**d.assignment, j.id: (view.free_nodes[0],) + j.nodes[1:]})
        return d


def test_policy_breaking_the_rules_is_named():
    tl = timeline("abcd", "ab", [(10.0, "c", True)], end=100.0)
    thief = SimPolicy("thief", Thief(preset("greedy")), lambda spec: None)
    with pytest.raises(PolicyError, match=r"thief.*j0000\d.*node 'a'"):
        run(tl, [job("x", max_nodes=2), job("y", max_nodes=2)], thief)
    swapper = SimPolicy("swapper", Swapper(preset("greedy")), lambda spec: None)
    with pytest.raises(PolicyError, match="swapper.*both gain and lose"):
        run(tl, [job("x")], swapper)


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
@given(tl=small_traces(), specs=small_jobs(), policy=st.sampled_from(PRESET_NAMES),
       pjmax=st.integers(1, 3), interval=st.sampled_from([0.0, 0.0, 25.0]))
def test_conservation_and_progress_on_random_traces(tl, specs, policy, pjmax, interval):
    res = run(tl, specs, policy, max_running=pjmax, tfwd_s=60.0, min_interval_s=interval)
    s = res.summary
    assert s["idle_node_seconds"] == pytest.approx(tl.idle_node_seconds(), abs=1e-6)
    assert s["used_node_seconds"] <= s["idle_node_seconds"] + 1e-6
    assert s["used_node_seconds"] == pytest.approx(sum(j.node_seconds for j in res.jobs), abs=1e-6)
    for part in ("idle_node_seconds", "used_node_seconds", "work_node_seconds"):
        assert s[f"{part}_constrained"] + s[f"{part}_unconstrained"] == pytest.approx(s[part], rel=1e-9, abs=1e-6)
    assert s["constrained_seconds"] + s["unconstrained_seconds"] == pytest.approx(s["span_seconds"])
    for j in res.jobs:
        expected = replay_progress(j.history, j.spec, res.end)
        assert j.progress == pytest.approx(expected, rel=1e-9, abs=1e-6), j.id
        assert j.progress <= j.spec.samples + 1e-9
        if j.finished_at is not None:
            assert j.progress == j.spec.samples
        assert j.profiling_scale_ups == (1 if j.profiled else 0), j.id  # inverse order: one scale-up
        assert j.profiling_node_seconds <= j.node_seconds + 1e-6
    cfg = s["policy_config"]  # adaptive admission may admit past Pjmax while nodes would stay idle
    limit = pjmax if cfg.get("admission", "fixed") == "fixed" else max(pjmax, cfg["admission_cap"] or math.inf)
    assert all(r.running_jobs <= limit and r.running_jobs <= r.used_nodes <= r.idle_nodes for r in res.rows)
    assert s["jobs_completed"] <= s["jobs_submitted"] == len(specs) - sum(
        1 for sp in specs if sp.arrival_s >= 500.0
    )
    assert not math.isnan(s["samples_processed"])
    asking = always_solving(named(policy, specs, max_running=pjmax, tfwd_s=60.0))
    again = run(tl, specs, asking, min_interval_s=interval)
    assert strip(again.summary, "solver_calls") == strip(s, "solver_calls")
