"""The simulator's named policies: the shared :class:`policy.Policy` under a preset, plus ground truth.

Hand-built traces whose answers follow from the policy's rules: profiling
node-seconds, one scale-up per profiled job, a lender shrinking by what it lent and
getting it back, a job waiting when nodes are short, and freetrain deciding on the
believed curve while progress follows the true one. Then the presets themselves and
the count-picking baselines (:func:`policy.allocation.greedy_counts` / ``equal_counts``).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pytest

from allocator import throughput_at
from policy import PRESETS, Allocation, CostSource, JobView, PolicyConfig, PolicyConfigError, Profiling, preset
from policy.allocation import apply_pins, equal_counts, greedy_counts, node_map
from profiler import ThroughputEstimator, default_counts
from simulator import POLICIES, JobSpec, PolicyContext, SimConfig, SimPolicy, Simulator, Workload, make_policy
from simulator.monitor import PER_NODE_BATCH, SimJobMonitor, StepFeed, _seed, run_until_stable, step_seconds
from simulator.policies import believed_curve, mean_curve, parse_error_model
from traces.model import IdleTimeline

FAST = {1: 1000.0, 2: 2000.0, 4: 4000.0}  # steps of 0.256 s: a profile step lasts seconds
UP, DOWN = 5.0, 3.0


def timeline(nodes: Sequence[str], initial: Sequence[str], changes: Sequence[tuple[float, str, bool]] = (),
             end: float = 1000.0) -> IdleTimeline:
    index = {n: i for i, n in enumerate(nodes)}
    return IdleTimeline(
        source="hand-built", format="test", nodes=tuple(nodes), start=0.0, end=end,
        initial_idle=frozenset(initial),
        times=np.array([c[0] for c in changes], dtype=np.float64),
        node_ids=np.array([index[c[1]] for c in changes], dtype=np.int32),
        idle=np.array([c[2] for c in changes], dtype=bool),
    )


def spec(name: str, arrival: float = 0.0, scaling=FAST, **kw) -> JobSpec:
    kw.setdefault("max_nodes", 4)
    return JobSpec(name=name, model=name, samples=1e12, scaling=scaling, arrival_s=arrival,
                   up_cost_s=UP, down_cost_s=DOWN, **kw)


def malletrain(curves=None, **knobs) -> SimPolicy:
    """The paper's MalleTrain (JPA): every job profiled in inverse order (preset ``jpa``)."""
    return make_policy("jpa", PolicyContext(curves if curves is not None else {"a": FAST}),
                       PolicyConfig(**knobs))


def measured(policy: SimPolicy, job) -> dict[int, float]:
    """The points the shared policy accepted for ``job`` (profiled or refined)."""
    return policy.policy.state.measured.get(job.id, {})


def run(tl: IdleTimeline, specs: Sequence[JobSpec], policy, **cfg):
    wl = Workload("hand", "test", timed=list(specs), finite=True, models={s.model: s.scaling for s in specs})
    return Simulator(tl, wl, policy, SimConfig(**cfg)).run()


def counts(job) -> list[int]:
    return [h[2] for h in job.history]


def node_seconds_between(job, t0: float, t1: float) -> float:
    """Independent integral of the job's node count over [t0, t1] from its change log."""
    total = 0.0
    hist = job.history
    for (ta, _, n, _), nxt in zip(hist, list(hist[1:]) + [(math.inf, 0.0, 0, 0.0)]):
        lo, hi = max(ta, t0), min(nxt[0], t1)
        if hi > lo:
            total += n * (hi - lo)
    return total


# ------------------------------------------------------------------ the simulated monitor


def test_step_records_follow_the_true_curve_and_are_deterministic():
    feed = StepFeed("j", FAST, 4, start=10.0, seed=1, noise=0.0)
    recs = feed.next_records(6)
    assert step_seconds(FAST, 4) == pytest.approx(4 * PER_NODE_BATCH / 4000.0)
    assert all(r.samples == 4 * PER_NODE_BATCH and r.world_size == 4 for r in recs)
    steps = np.diff([10.0] + [r.timestamp for r in recs])
    assert steps[3:] == pytest.approx([0.256] * 3)  # after the first and two warm-up steps
    again = StepFeed("j", FAST, 4, start=10.0, seed=1).next_records(6)
    assert again == StepFeed("j", FAST, 4, start=10.0, seed=1).next_records(6)
    fresh = StepFeed("j", FAST, 4, start=10.0, seed=1)  # each chunk's seed derives from (seed, job, count, chunk)
    for k in range(3):
        assert fresh._chunk_seed() == _seed(1, "j", 4, k)
        fresh.next_records()
    est = ThroughputEstimator()  # the monitor's estimator, fed from these records, finds the true rate
    assert run_until_stable(StepFeed("j", FAST, 2, 0.0, seed=3), est, deadline=100.0) is not None
    assert est.rates()[2] == pytest.approx(2000.0, rel=0.03)


def test_the_simulated_monitor_shows_only_the_records_that_exist_by_then():
    mon = SimJobMonitor("j", FAST, seed=0)
    mon.change(0.0, 0, 4, 0.0)  # started on 4 nodes: no pause to measure
    assert mon.evidence(0.0).rates == {} and mon.evidence(0.0).costs is None
    assert mon.stable_at is not None and 0.0 < mon.stable_at < 10.0
    early = mon.evidence(mon.stable_at / 2).rates.get(4)
    assert early is None or early.rel_ci > 0.05  # not stable yet
    est = mon.evidence(mon.stable_at).rates[4]
    assert est.rel_ci <= 0.05 and est.rate == pytest.approx(4000.0, rel=0.03)
    mon.change(20.0, 4, 2, 20.0 + DOWN)  # a scale-down paused it DOWN seconds
    ev = mon.evidence(20.0)
    assert ev.rates[4] == est and 2 not in ev.rates  # the newest estimate per count
    assert (ev.costs.n_up, ev.costs.n_down) == (0, 1) and ev.costs.down_s == pytest.approx(DOWN, abs=0.3)
    assert ev.costs.up_s is None
    assert mon.evidence(mon.stable_at).rates[2].rate == pytest.approx(2000.0, rel=0.03)


# ------------------------------------------------------------------ malletrain (JPA-fed)


def test_profile_runs_inverse_order_and_its_node_seconds_are_counted():
    tl = timeline("abcd", "abcd")
    policy = malletrain()
    res = run(tl, [spec("a")], policy)
    job = res.jobs[0]
    s = res.summary
    # one start at the largest count, then down through 2 and 1; the allocator then takes it back to 4
    assert counts(job)[:4] == [4, 2, 1, 4]
    t_start, t_2, t_1, t_done = (h[0] for h in job.history[:4])
    assert t_start == 0.0 and 0 < t_2 - t_start < 10 and DOWN < t_1 - t_2 < DOWN + 10
    assert s["profiles_done"] == 1 and s["profiled_jobs"] == 1
    assert s["profiling_scale_ups"] == 1 and job.profiling_scale_ups == 1
    assert s["profiling_node_seconds"] == pytest.approx(node_seconds_between(job, t_start, t_done))
    # the two step-downs each paused the job DOWN seconds (2 nodes, then 1)
    assert s["profiling_paused_node_seconds"] == pytest.approx(2 * DOWN + 1 * DOWN)
    assert s["profiling_lost_samples"] == pytest.approx(2000.0 * DOWN + 1000.0 * DOWN)
    assert 0 < s["profiling_fraction"] < 1
    points = measured(policy, job)
    assert sorted(points)[:3] == [1, 2, 4]
    for n in (1, 2, 4):
        assert points[n] == pytest.approx(FAST[n], rel=0.03)  # seen through 3%-noisy records
    assert s["scalability_error_pct"] < 3.0


def test_lender_shrinks_by_the_borrowed_count_and_gets_them_back():
    tl = timeline("abcdef", "abcdef", end=2000.0)
    policy = malletrain()
    # A profiles on 4 of the 6 nodes and then runs on 4; B arrives with 2 free nodes and borrows 2 from A
    res = run(tl, [spec("a"), spec("b", arrival=500.0)], policy)
    a, b = res.jobs
    assert counts(b)[:3] == [4, 2, 1]
    t_b = b.history[0][0]
    assert t_b == 500.0
    a_after = [(t, n) for t, _, n, _ in a.history if t >= t_b]
    assert a_after[0] == (500.0, 2)  # shrank by exactly the 2 it lent
    t_done = b.history[3][0] if len(b.history) > 3 else res.end
    assert (t_done, 4) in a_after  # and grew back by 2 when B's profile ended
    assert all(n <= 2 for t, n in a_after if t < t_done)  # never grew while it was owed nodes
    s = res.summary
    assert s["profile_lent_nodes"] == 2 and s["profile_returned_nodes"] == 2
    assert s["profiling_scale_ups"] == 2 and s["profiling_scale_ups_max_per_job"] == 1
    assert a.profiling_scale_ups == 1  # its own profile's start; growing back as a lender is not profiling


def test_job_waits_in_the_queue_while_nodes_are_short():
    # 1 idle node cannot source two of the counts (1, 2, 4): both jobs wait, FCFS; a 2nd node at 300 s
    tl = timeline("abcd", "a", [(300.0, "b", True)])
    policy = malletrain()
    res = run(tl, [spec("a"), spec("b")], policy)
    a, b = res.jobs
    assert a.history[0][0] == 300.0 and counts(a)[:2] == [2, 1]
    assert res.summary["profile_waits"] >= 1
    assert all(r.running_jobs == 0 for r in res.rows if r.time < 300.0)
    assert a.node_seconds > 0 and a.profiling_scale_ups == 1


def test_profile_cut_short_by_a_recall_keeps_what_was_measured():
    # node d is recalled 1 s in, while the job profiles at 4: it shrinks to 3 and the profile stops
    tl = timeline("abcd", "abcd", [(1.0, "d", False)])
    policy = malletrain()
    res = run(tl, [spec("a")], policy)
    s = res.summary
    assert s["profiles_aborted"] == 1 and s["profiles_done"] == 0
    assert s["profiling_scale_ups"] == 1
    job = res.jobs[0]
    assert job.id in policy.policy.state.profiled  # never profiled again
    assert counts(job) == [4, 3]  # it runs on at what it has left; refinement measures that count
    assert set(measured(policy, job)) == {3}


def test_refinement_measures_counts_the_job_runs_at():
    tl = timeline("abc", "abc", end=2000.0)  # max 4 but only 3 nodes: 3 is never profiled
    policy = malletrain()
    res = run(tl, [spec("a")], policy)
    points = measured(policy, res.jobs[0])
    assert 3 in points and points[3] == pytest.approx(3000.0, rel=0.03)
    assert res.summary["refinements"] >= 1


# ------------------------------------------------------------------ freetrain (user curves)

TRUE = {1: 100.0, 2: 150.0, 4: 200.0}


def true_spec(curve=TRUE, name="x") -> JobSpec:
    return JobSpec(name=name, model="m", samples=1e6, scaling=curve, max_nodes=4)


def test_freetrain_decides_on_the_believed_curve_but_progresses_on_the_true_one():
    tl = timeline("abcd", "abcd", end=1000.0)
    policy = make_policy("freetrain", PolicyContext({"m": TRUE}, freetrain_model="linear"))
    res = run(tl, [spec("x", scaling=TRUE)], policy)
    job = res.jobs[0]
    assert counts(job) == [4]
    assert res.summary["samples_processed"] == pytest.approx(200.0 * 1000.0)  # TRUE rate at 4 nodes
    # the user's linear curve says 400/s at 4 nodes: 100% off
    assert res.summary["scalability_error_pct"] == pytest.approx(100.0)


def test_freetrain_error_models():
    view = true_spec()
    mean = mean_curve({"a": {1: 10.0, 4: 40.0}, "b": {1: 30.0, 2: 40.0}})
    # the mean 1-node rate (20) times the mean shape: a is linear (2x, 4x), b gains a third by 2 nodes
    assert mean == {1: 20.0, 2: pytest.approx(20.0 * (2.0 + 4 / 3) / 2), 4: pytest.approx(20.0 * (4.0 + 4 / 3) / 2)}
    assert believed_curve(parse_error_model("mean"), view, mean, 0) == mean
    assert believed_curve(parse_error_model("linear"), view, None, 0) == {1: 100.0, 2: 200.0, 4: 400.0}
    noisy = believed_curve(parse_error_model("noise:20"), view, None, 7)
    assert noisy == believed_curve(parse_error_model("noise:20"), view, None, 7)
    assert noisy != believed_curve(parse_error_model("noise:20"), view, None, 8)
    assert all(0.8 * TRUE[n] <= v <= 1.2 * TRUE[n] for n, v in noisy.items())
    assert believed_curve(parse_error_model("noise:0"), view, None, 7) == TRUE
    for bad in ("median", "noise:abc", "noise:100", "noise:-1"):
        with pytest.raises(ValueError, match="freetrain model"):
            parse_error_model(bad)
    with pytest.raises(ValueError, match="needs the workload's model curves"):
        make_policy("freetrain")


def test_named_policies_on_one_trace_keep_their_accounting():
    tl = timeline("abcdef", "abcd", [(100.0, "e", True), (200.0, "a", False), (400.0, "f", True)], end=800.0)
    specs = [spec("a"), spec("b", arrival=50.0, scaling=TRUE), spec("c", arrival=150.0)]
    ctx = PolicyContext({"a": FAST, "b": TRUE, "c": FAST})
    results = {name: run(tl, specs, make_policy(name, ctx, PolicyConfig(max_running=2))) for name in POLICIES}
    for name, res in results.items():
        s = res.summary
        assert s["used_node_seconds"] == pytest.approx(sum(j.node_seconds for j in res.jobs)), name
        assert s["used_node_seconds"] <= s["idle_node_seconds"] + 1e-6, name
        for j in res.jobs:
            assert j.profiling_scale_ups == (1 if j.profiled else 0), (name, j.id)
        assert all(r.running_jobs <= 2 for r in res.rows), name
    assert results["jpa"].summary["profiled_jobs"] >= 2
    assert results["milp-true"].summary["scalability_error_pct"] == 0.0
    assert results["greedy"].summary["scalability_error_pct"] is None


def test_default_counts_are_what_a_profile_visits():
    # the policy profiles the profiler's default counts, largest first
    tl = timeline([f"n{i}" for i in range(8)], [f"n{i}" for i in range(8)])
    policy = malletrain()
    res = run(tl, [spec("a", max_nodes=8, scaling={1: 1000.0, 8: 8000.0})], policy)
    visited = counts(res.jobs[0])[: len(default_counts(1, 8))]
    assert visited == sorted(default_counts(1, 8), reverse=True)
    assert throughput_at(measured(policy, res.jobs[0]), 8) == pytest.approx(8000.0, rel=0.03)


# ------------------------------------------------------------------ the presets


def test_named_policies_are_presets_of_one_config_plus_ground_truth():
    # every named policy is a preset, but rigid-preemptible: greedy on rigid submissions (test_sim_baselines)
    assert set(POLICIES) - {"rigid-preemptible"} == set(PRESETS) >= {"malletrain", "jpa", "freetrain", "milp-true",
                                                                      "oracle", "greedy", "equal"}
    base = PolicyConfig(max_running=3, tfwd_s=60.0, profile_time_cap_s=30.0)
    ctx = PolicyContext({"a": FAST, "b": TRUE}, seed=4)
    pols = {name: make_policy(name, ctx, base) for name in POLICIES if name in PRESETS}
    for name, pol in pols.items():
        cfg = pol.config
        assert (cfg.max_running, cfg.tfwd_s, cfg.profile_time_cap_s) == (3, 60.0, 30.0), name  # the base stays
        for knob, value in PRESETS[name].items():
            assert getattr(cfg, knob) == value, (name, knob)
    mt = pols["jpa"].config
    assert mt.profiling is Profiling.ALWAYS and mt.learn and mt.rescale_costs is CostSource.MEASURED
    for learner in ("malletrain", "jpa"):  # the models' mean, not the job's curve
        assert pols[learner].config.prior_curve == mean_curve({"a": FAST, "b": TRUE})
    for name in ("freetrain", "milp-true", "oracle", "greedy", "equal"):
        assert pols[name].config.profiling is Profiling.NEVER and not pols[name].config.learn, name
    assert pols["greedy"].config.allocation is Allocation.GREEDY
    assert pols["equal"].config.allocation is Allocation.EQUAL
    oracle = pols["oracle"].config
    assert (oracle.rescale_costs, oracle.default_up_cost_s, oracle.default_down_cost_s) == (CostSource.CONFIGURED, 0, 0)
    assert [n for n, p in pols.items() if p.free_rescales] == ["oracle"]
    # what each is told about a job: the user's curve (the job file's), the freetrain error model's, the truth
    job = true_spec()
    told = JobSpec(name="y", model="m", samples=1e6, scaling=TRUE, believed_scaling={1: 1.0, 4: 4.0})
    assert pols["malletrain"].user_curve(job) is None and pols["malletrain"].user_curve(told) == {1: 1.0, 4: 4.0}
    assert pols["freetrain"].user_curve(job) == mean_curve({"a": FAST, "b": TRUE}) and pols["freetrain"].label == "mean"
    assert pols["freetrain"].user_curve(told) == {1: 1.0, 4: 4.0}
    assert pols["milp-true"].user_curve(job) == TRUE and pols["oracle"].user_curve(job) == TRUE
    assert pols["greedy"].user_curve(job) is None and pols["equal"].user_curve(job) is None
    assert make_policy("freetrain", PolicyContext({"a": FAST}, freetrain_model="noise:10")).label == "noise:10"
    with pytest.raises(PolicyConfigError, match="unknown policy 'best'"):
        make_policy("best")
    # a preset wins over the base; explicit overrides win over the preset
    assert preset("greedy", PolicyConfig(allocation="milp")).allocation is Allocation.GREEDY
    assert preset("malletrain", profile_counts="sparse").profile_counts == "sparse"


def test_baselines_do_not_profile():
    from policy import Policy

    with pytest.raises(PolicyConfigError, match="profiling needs allocation"):
        Policy(PolicyConfig(allocation="greedy", profiling="always"))


# ------------------------------------------------------------------ the count-picking baselines


def view(i: str, lo: int, hi: int, nodes: tuple[str, ...] = ()) -> JobView:
    return JobView(i, lo, hi, nodes)


def test_greedy_grows_each_job_to_its_max_in_order_and_never_shrinks():
    jobs = (view("a", 1, 4, ("n1",)), view("b", 2, 8), view("c", 1, 2))
    assert greedy_counts(jobs, 3) == {"a": 4, "b": 0, "c": 0}  # b would get 0 < its min: it waits
    assert greedy_counts(jobs, 7) == {"a": 4, "b": 4, "c": 0}
    assert greedy_counts(jobs, 12) == {"a": 4, "b": 8, "c": 1}
    assert greedy_counts((view("a", 1, 2, ("n1", "n2")), view("b", 3, 3)), 2) == {"a": 2, "b": 0}


def test_equal_split_waterfills_and_respects_min():
    jobs = (view("a", 1, 2), view("b", 1, 64), view("c", 1, 64))
    assert equal_counts(jobs, 11) == {"a": 2, "b": 5, "c": 4}
    assert equal_counts((view("a", 2, 8), view("b", 2, 8)), 3) == {"a": 3, "b": 0}
    # held nodes count too: the split is of everything the admitted jobs could hold
    assert equal_counts((view("a", 1, 8, ("n1", "n2", "n3", "n4")), view("b", 1, 8)), 0) == {"a": 2, "b": 2}


def test_counts_become_nodes_without_migration():
    jobs = (view("a", 1, 4, ("n1", "n2", "n3")), view("b", 1, 4, ("n4",)))
    out = node_map(jobs, ("f1",), {"a": 1, "b": 4})
    assert out["a"] == ("n1",) and out["b"][0] == "n4" and set(out["b"]) == {"n4", "n2", "n3", "f1"}


def test_pinned_job_runs_on_exactly_its_pin_borrowing_from_its_lender():
    jobs = (view("big", 1, 4, ("a", "b", "c", "d")), view("probe", 1, 4))
    pinned = apply_pins(jobs, ("e",), {"probe": 3}, {"probe": "big"})
    assert pinned.fixed["probe"] == ("e", "c", "d")  # the free node, then two borrowed
    assert pinned.lenders["big"] == ("a", "b")  # the lender only shrank
    assert pinned.free == []
    # a pinned job stepping down keeps a prefix of its nodes; the rest become free
    down = apply_pins((view("probe", 1, 4, ("e", "c", "d")),), (), {"probe": 1}, {})
    assert down.fixed["probe"] == ("e",) and down.free == ["c", "d"]


def test_other_prior_is_another_models_curve_seeded_by_job():
    view = true_spec()
    curves = {"m": TRUE, "a": {1: 10.0, 4: 40.0}, "b": {1: 30.0, 2: 40.0}}
    other = parse_error_model("other")
    got = believed_curve(other, view, None, 3, curves)
    assert got in (curves["a"], curves["b"]) and got != TRUE
    assert got == believed_curve(other, view, None, 3, curves)  # seeded by (seed, job name)
    with pytest.raises(ValueError, match="needs the workload's model curves"):
        make_policy("freetrain", PolicyContext(freetrain_model="other"))


def test_jpa_is_named_and_profiles_every_job_in_inverse_order():
    from simulator.policies import resolve_config

    assert "jpa" in POLICIES
    pol = make_policy("jpa", PolicyContext({"m": TRUE}))
    assert pol.config.profiling is Profiling.ALWAYS
    assert pol.config.prior is not None  # the population prior, as malletrain's
    assert resolve_config("jpa") == (preset("jpa") if "jpa" in PRESETS
                                     else preset("malletrain", profiling=Profiling.ALWAYS))


def test_a_learning_policy_starts_from_the_mean_or_a_linear_belief():
    curves = {"a": {1: 10.0, 4: 40.0}, "b": {1: 30.0, 2: 40.0}}
    mean = make_policy("malletrain", PolicyContext(curves, 0, "noise:20"))  # freetrain's model reaches freetrain only
    assert mean.config.prior_curve == mean_curve(curves)
    linear = make_policy("malletrain", PolicyContext(curves, 0, learning_prior="linear"))
    assert linear.config.prior_curve == {1: 20.0, 2: 40.0, 4: 80.0}  # the mean 1-node rate, per node
    with pytest.raises(ValueError, match="starts from one of mean, linear"):
        make_policy("malletrain", PolicyContext(curves, 0, learning_prior="noise:20"))
