"""No target passes by construction. Each target the evaluation prints fails on a
deliberately bad policy or input; the bound holds for every policy on random small traces."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import PolicyContext, SimConfig, Simulator
from simulator.calibration import Calibration, free
from evaluation.regimes import real_targets
from evaluation.results import MIN_SEEDS, EvalSettings, Evaluation, real_rows
from simulator.policies import POLICIES, Overrides, make_policy
from evaluation.sweep import RunSpec
from tests.test_simulator import job, timeline, workload


def summary(work: float, bound: float = 1e9, offered: float = 2e9, **kw) -> dict:
    return {"work_node_seconds": work, "bound_work_node_seconds": bound, "offered_work_node_seconds": offered,
            "work_share_of_offered": work / offered, "gap_to_bound_pct": 100.0 * (1 - work / bound),
            "lost_work_node_seconds": 0.0, "admission": "adaptive", "calibration": "t", **kw}


def spec_of(label: str, w: str, seed: int) -> RunSpec:
    if label == "oracle-reference":
        return RunSpec(w, "oracle", seed, bound=True)
    if label.startswith("freetrain-fixed:"):
        return RunSpec(w, "freetrain", seed, fixed_pjmax=int(label.split(":")[1]))
    policy, _, prior = label.partition(":")
    return RunSpec(w, policy, seed, prior=prior or "mean")


def evaluation(works: dict[str, float], load: str = "philly@1", seeds: int = MIN_SEEDS, bound: float = 1e9) -> Evaluation:
    runs = [(spec_of(label, load, k), summary(w * (1 + 0.001 * k), bound=bound))
            for k in range(seeds) for label, w in works.items()]
    return Evaluation(EvalSettings(seeds=tuple(range(seeds)), workloads=(load,)), "t", "s", runs)


BASELINES = {"freetrain:mean": 100.0, "freetrain:linear": 90.0, "greedy": 95.0, "equal": 97.0,
             "rigid-preemptible": 60.0, "freetrain-fixed:40": 103.0, "oracle-reference": 200.0}


def gain_target(ev):
    return next(t for t in real_targets(ev) if "best equal-admission baseline" in t.name)


def test_the_gain_target_is_against_the_best_fixed_prior_baseline_and_fails_on_a_policy_no_better():
    good = evaluation({**BASELINES, "malletrain": 106.0})
    t = gain_target(good)
    # the best baseline at equal admission with a prior fixed before the run: freetrain:mean (100), not the
    # fixed-Pjmax row (its own admission, 103) nor freetrain handed each job's curve within 20% (104)
    assert t.passed and "(freetrain:mean)" in t.name
    with_reference = gain_target(evaluation({**BASELINES, "freetrain:noise:20": 104.0, "malletrain": 106.0}))
    assert with_reference.passed and "(freetrain:mean)" in with_reference.name
    assert "freetrain:noise:20 (given each job's curve within 20%) +1.9%" in with_reference.value
    assert "freetrain-fixed:40 (own admission) +2.9%" in with_reference.value
    # a deliberately bad default: as good as the best fixed-prior baseline, or +5% over a worse one only
    assert not gain_target(evaluation({**BASELINES, "malletrain": 100.0})).passed
    assert not gain_target(evaluation({**BASELINES, "equal": 101.0, "malletrain": 105.5})).passed  # +5.5% over freetrain:mean only
    # too few seeds: fails even with the gain
    assert not gain_target(evaluation({**BASELINES, "malletrain": 110.0}, seeds=MIN_SEEDS - 1)).passed


def test_the_saturated_target_needs_099_of_the_best_fixed_prior_baseline():
    def saturated(w: float):
        ev = evaluation({**BASELINES, "malletrain": w}, load="philly@2")
        return next(t for t in real_targets(ev) if "(saturated)" in t.name)

    assert saturated(99.5).passed and "(freetrain:mean)" in saturated(99.5).name
    assert not saturated(98.5).passed  # 0.985x: a default that loses work when the machine is full fails


def test_the_bound_gap_target_fails_on_a_policy_far_from_the_bound():
    near = evaluation({**BASELINES, "malletrain": 97.0}, load="philly@2", bound=100.0)
    gap = next(t for t in real_targets(near) if "gap to the bound" in t.name)
    assert gap.passed
    far = evaluation({**BASELINES, "malletrain": 80.0}, load="philly@2", bound=100.0)
    assert not next(t for t in real_targets(far) if "gap to the bound" in t.name).passed


def test_the_bounds_target_fails_when_a_policy_beats_a_bound():
    ok = evaluation({**BASELINES, "malletrain": 110.0})
    held = next(t for t in real_targets(ok) if t.name.startswith("bounds hold"))
    assert held.passed
    # a policy above the analytic bound (a bug: e.g. free work) fails it
    over = evaluation({**BASELINES, "malletrain": 110.0}, bound=105.0)
    t = next(t for t in real_targets(over) if t.name.startswith("bounds hold"))
    assert not t.passed and "malletrain above min(offered" in t.value
    # the oracle reference is not a bound (its allocator is a heuristic over time): beating it fails nothing
    beaten = evaluation({**BASELINES, "malletrain": 110.0, "oracle-reference": 105.0})
    assert next(t for t in real_targets(beaten) if t.name.startswith("bounds hold")).passed


def test_rows_report_share_of_offered_and_vs_each_comparison():
    ev = evaluation({**BASELINES, "freetrain:noise:20": 104.0, "malletrain": 110.0})
    rows = {r["policy"]: r for r in real_rows(ev, ev.cells()[0])}
    assert rows["freetrain:mean"]["best_baseline"] and not rows["malletrain"]["baseline"]
    assert not rows["freetrain-fixed:40"]["baseline"] and not rows["freetrain:noise:20"]["fixed_prior"]
    vs = rows["malletrain"]["vs_pct"]
    assert rows["malletrain"]["vs_best_baseline_pct"][0] == pytest.approx(10.0)
    assert vs["freetrain:linear"][0] == pytest.approx(100 * (110 / 90 - 1))
    assert vs["best fixed-Pjmax"][0] == pytest.approx(100 * (110 / 103 - 1))
    assert vs["reference"][0] == pytest.approx(100 * (110 / 104 - 1))


# ------------------------------------------------------------------ the bound holds in the engine

NODES = [f"n{i}" for i in range(4)]
CURVES = ({1: 10.0, 2: 20.0, 4: 40.0}, {1: 10.0, 2: 12.0, 4: 14.0}, {1: 10.0, 2: 25.0, 4: 30.0})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(st.tuples(st.integers(1, 290), st.sampled_from(NODES), st.booleans()), max_size=12),
       curves=st.lists(st.sampled_from(CURVES), min_size=1, max_size=3),
       samples=st.sampled_from([500.0, 5000.0, 1e7]),
       policy=st.sampled_from([p for p in POLICIES if p != "jpa"]),
       charged=st.booleans())
def test_no_policy_beats_the_bound(changes, curves, samples, policy, charged):
    changes = sorted({(float(t), n): v for t, n, v in changes}.items())
    tl = timeline(NODES, NODES[:2], [(t, n, v) for (t, n), v in changes], end=300.0)
    specs = [job(f"j{i}", samples=samples, scaling=c, arrival=10.0 * i) for i, c in enumerate(curves)]
    cal = Calibration("t", 2.0, 5.0, 6.0, 3.0, 40.0) if charged else free()
    pol = make_policy(policy, PolicyContext({s.model: s.scaling for s in specs}), None, Overrides())
    s = Simulator(tl, workload(*specs), pol, SimConfig(calibration=cal)).run().summary
    assert s["work_node_seconds"] <= s["bound_work_node_seconds"] * (1 + 1e-9) + 1e-9
    assert s["trained_node_seconds"] <= s["held_node_seconds"] + 1e-9 <= s["idle_node_seconds"] + 2e-9


def test_a_policy_that_leaves_nodes_idle_is_far_from_the_bound():
    # deliberately bad: one job admitted at a time, fixed, on 4 idle nodes with jobs of max 1 node
    tl = timeline(NODES, NODES, end=300.0)
    specs = [job(f"j{i}", max_nodes=1) for i in range(4)]
    bad = make_policy("greedy", PolicyContext({}), None, Overrides(admission="fixed", max_running=1))
    good = make_policy("greedy", PolicyContext({}), None, Overrides(admission="fixed", max_running=4))
    gap = [Simulator(tl, workload(*specs), p, SimConfig()).run().summary["gap_to_bound_pct"] for p in (bad, good)]
    assert gap[0] == pytest.approx(75.0) and gap[1] == pytest.approx(0.0)


def test_the_scarce_target_needs_095_of_milp_true_from_every_learning_prior():
    def scarce(works: dict[str, float], seeds: int = MIN_SEEDS):
        ev = evaluation(works, load="scarce", seeds=seeds)
        return next(t for t in real_targets(ev) if "milp-true's work" in t.name)

    good = scarce({"milp-true": 100.0, "malletrain": 97.0, "malletrain:linear": 96.0, "freetrain:mean": 80.0})
    assert good.passed and "from linear: 0.960x" in good.value
    # learning that recovers nothing from an optimistic (linear) belief fails it, as does a prior not replayed
    assert not scarce({"milp-true": 100.0, "malletrain": 97.0, "malletrain:linear": 90.0}).passed
    assert not scarce({"milp-true": 100.0, "malletrain": 97.0}).passed
    assert not scarce({"milp-true": 100.0, "malletrain": 97.0, "malletrain:linear": 96.0}, seeds=MIN_SEEDS - 1).passed
    # and the scarce cell carries no Philly target (no gain, saturation or gap target)
    ev = evaluation({"milp-true": 100.0, "malletrain": 97.0, "malletrain:linear": 96.0}, load="scarce")
    assert [t.name.split(":")[0] for t in real_targets(ev)] == ["scarce", "bounds hold"]
