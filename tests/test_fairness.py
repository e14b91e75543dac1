"""Fair share between users (:mod:`policy.fairness`): pure, on a fake clock.

One user's job holds every node; another user submits. The late user gets nodes within
``fair_wait_s``, its share soon after, and a job that claims a superlinear curve gets no more than
its share; the rule is set (and turned off) by the ``[policy]`` table.
"""

from __future__ import annotations

import pytest

from policy import Fairness, Policy, PolicyConfig, PolicyConfigError, PolicyState, View
from policy.fairness import job_shares, water_fill
from policy.model import JobView

NODES = tuple(f"n{i}" for i in range(8))
LIE = {1: 1.0, 8: 1000.0}  # a claimed curve 125x superlinear


def _run(cfg: PolicyConfig, late_at: float = 20.0, until: float = 60.0, step: float = 1.0,
         late_user: str = "bob", late_curve: dict[int, float] | None = None) -> list[tuple[float, dict[str, int]]]:
    """Alice's lying job alone from 0 s, Bob's job from ``late_at``; a decision every ``step`` s."""
    pol = Policy(cfg)
    held: dict[str, tuple[str, ...]] = {}
    out = []
    t = 0.0
    while t <= until:
        jobs = [JobView("a1", 1, 8, held.get("a1", ()), order=0, scaling=LIE, user="alice")]
        if t >= late_at:
            jobs.append(JobView("b1", 1, 8, held.get("b1", ()), order=1, scaling=late_curve, user=late_user))
        used = {n for nodes in held.values() for n in nodes}
        d = pol.decide(View(t, tuple(n for n in NODES if n not in used), tuple(jobs)), {})
        held = {j: tuple(nodes) for j, nodes in d.assignment.items()}
        out.append((t, d.counts))
        t += step
    return out


def _first_node(run: list[tuple[float, dict[str, int]]]) -> float | None:
    return next((t for t, c in run if c.get("b1", 0) > 0), None)


CFG = PolicyConfig(profiling="never", fair_wait_s=10.0)


def test_a_late_user_gets_nodes_within_the_bound_and_its_share():
    run = _run(CFG)
    first = _first_node(run)
    assert first is not None and first - 20.0 <= CFG.fair_wait_s
    _, counts = run[-1]
    assert counts == {"a1": 4, "b1": 4}  # the equal share of 8 nodes between two users


def test_a_lying_job_gets_no_more_than_its_share():
    run = _run(CFG)
    late = [c for t, c in run if t >= 20.0 + CFG.fair_wait_s]
    assert late and all(c["a1"] <= 4 for c in late)


def test_the_rule_is_off_by_config():
    run = _run(PolicyConfig(profiling="never", fairness="none"))
    assert _first_node(run) is None  # the lying job keeps every node: the starvation the rule prevents
    assert PolicyConfig().fairness is Fairness.EQUAL  # on by default


def test_one_user_s_jobs_are_not_held_to_shares():
    run = _run(CFG, late_user="alice")  # the same user: the objective alone decides
    assert all(c.get("b1", 0) == 0 for _, c in run)


def test_the_decision_wakes_when_the_wait_runs_out():
    pol = Policy(CFG)
    a = JobView("a1", 1, 8, NODES, order=0, scaling=LIE, user="alice")
    b = JobView("b1", 1, 8, (), order=1, user="bob")
    pol.decide(View(0.0, (), (a,)), {})
    d = pol.decide(View(5.0, (), (a, b)), {})
    assert d.counts == {"a1": 8, "b1": 0} and d.wake_at == 15.0


def test_weighted_shares_follow_the_weights():
    cfg = PolicyConfig(profiling="never", fair_wait_s=10.0, fairness="weighted", user_weights=(("bob", 3.0),))
    _, counts = _run(cfg)[-1]
    assert counts == {"a1": 2, "b1": 6}


def test_fair_state_survives_a_restart():
    st = PolicyState(fair_since={"bob": 3.0}, fair_for={"carol"})
    back = PolicyState.from_json(st.to_json())
    assert back.fair_since == {"bob": 3.0} and back.fair_for == {"carol"}


def test_a_user_without_a_slot_is_admitted_beyond_pjmax():
    pol = Policy(PolicyConfig(profiling="never", max_running=1, admission="fixed", fair_wait_s=0.0))
    a = JobView("a1", 1, 8, (), order=0, scaling=LIE, user="alice")
    a2 = JobView("a2", 1, 8, (), order=1, user="alice")
    b = JobView("b1", 1, 8, (), order=2, user="bob")
    d = pol.decide(View(0.0, NODES, (a, a2, b)), {})
    assert d.admitted == ("a1", "b1") and "a2" in d.waiting


def test_water_fill_is_max_min():
    assert water_fill(8, {"a": 8, "b": 8}, {}) == {"a": 4, "b": 4}
    assert water_fill(8, {"a": 2, "b": 8, "c": 8}, {}) == {"a": 2, "b": 3, "c": 3}
    assert water_fill(8, {"a": 8, "b": 8}, {"b": 3.0}) == {"a": 2, "b": 6}
    assert water_fill(3, {"a": 8, "b": 8}, {}) == {"a": 2, "b": 1}  # ties: the first
    assert water_fill(8, {"a": 2, "b": 3}, {}) == {"a": 2, "b": 3}  # room for all: every demand
    jobs = [JobView("x", 1, 8, user="u"), JobView("y", 1, 8, user="u"), JobView("z", 1, 8, user="v")]
    assert job_shares(jobs, {"x": 8, "y": 8, "z": 8}, 8, {}) == {"x": 2, "y": 2, "z": 4}


@pytest.mark.parametrize("table, word", [
    ({"fairness": "fair"}, "fairness"),
    ({"user_weights": {"bob": 0}}, "user_weights"),
    ({"user_weights": {"bob": "x"}}, "user_weights"),
    ({"fair_wait_s": -1}, "fair_wait_s"),
])
def test_bad_settings_are_named(table, word):
    with pytest.raises(PolicyConfigError, match=word):
        PolicyConfig.from_mapping(table)


def test_settings_read_from_a_table():
    cfg = PolicyConfig.from_mapping({"fairness": "weighted", "user_weights": {"bob": 2.5}, "fair_wait_s": 30})
    assert cfg.fairness is Fairness.WEIGHTED and cfg.weight_of == {"bob": 2.5} and cfg.fair_wait_s == 30
    assert PolicyConfig.from_mapping(cfg.as_dict()) == cfg


def test_shares_leave_no_node_idle():
    """Held to shares, jobs that can use fewer nodes than there are (their believed knee) leave the rest
    to any job: the allocator's objective places what no share needs."""
    pol = Policy(CFG)
    flat = {1: 10.0, 2: 11.0, 3: 11.5, 8: 12.0}  # knee at 1 node: what the job "can use"
    a = JobView("a1", 1, 8, NODES[:7], order=0, scaling=flat, user="alice")
    b = JobView("b1", 1, 8, (), order=1, scaling=flat, user="bob")
    pol.decide(View(0.0, NODES[7:], (a,)), {})
    pol.state.fair_for.add("bob")  # shares hold
    d = pol.decide(View(1.0, NODES[7:], (a, b)), {})
    assert sum(d.counts.values()) == 8 and d.counts["b1"] >= 1


def _simulate(users: str, spec_users: tuple[str, str] = ("", "")) -> dict[str, int]:
    """Two jobs on 4 always-idle nodes in the simulator: one claims a superlinear curve from 0 s, the other
    arrives at 30 s; the counts of the last decision, by job name."""
    import numpy as np

    from simulator import SimConfig, SimPolicy, Simulator, Workload
    from simulator.workload import JobSpec as SimJobSpec
    from traces.model import IdleTimeline

    nodes = NODES[:4]
    line = IdleTimeline(source="fairness", format="test", nodes=nodes, start=0.0, end=120.0,
                        initial_idle=frozenset(nodes), times=np.array([], dtype=np.float64),
                        node_ids=np.array([], dtype=np.int32), idle=np.array([], dtype=bool))
    true = {1: 100.0, 2: 200.0, 4: 400.0}
    specs = [SimJobSpec(name="liar", model="liar", samples=1e15, scaling=true, max_nodes=4,
                        believed_scaling={1: 1.0, 4: 1000.0}, user=spec_users[0]),
             SimJobSpec(name="late", model="late", samples=1e15, scaling=true, max_nodes=4, arrival_s=30.0,
                        believed_scaling=true, user=spec_users[1])]
    pol = SimPolicy("fairness", Policy(PolicyConfig(profiling="never", learn=False, fair_wait_s=10.0)),
                    lambda spec: spec.believed_scaling)
    res = Simulator(line, Workload("fairness", "test", timed=specs, finite=True), pol, SimConfig(users=users),
                    keep_decisions=True).run()
    last = res.decisions[-1]
    return {("liar" if j == "j00000" else "late"): len(n) for j, n in last.assignment.items()}


def test_the_simulator_applies_the_rule_to_its_users():
    assert _simulate("workload") == {"liar": 4, "late": 0}  # a generated stream is one user: no shares
    assert _simulate("job") == {"liar": 2, "late": 2}  # each job its own user
    assert _simulate("workload", ("alice", "bob")) == {"liar": 2, "late": 2}  # a job file's users


@pytest.mark.parametrize("allocation", ["greedy", "equal"])
def test_the_shares_bind_under_every_allocation(allocation):
    """Before: the shares were handed to the exact allocator only; under ``allocation = "greedy"`` the
    first user's job kept every node and the late user never got one."""
    cfg = PolicyConfig(profiling="never", fair_wait_s=10.0, allocation=allocation)
    run = _run(cfg)
    first = _first_node(run)
    assert first is not None and first - 20.0 <= cfg.fair_wait_s + 1.0  # the nodes a share frees: the next decision
    late = [c for t, c in run if t >= 20.0 + cfg.fair_wait_s + 1.0]
    assert late and all(c["a1"] <= 4 for c in late) and late[-1] == {"a1": 4, "b1": 4}
    assert _first_node(_run(PolicyConfig(profiling="never", fairness="none", allocation=allocation))) is None \
        or allocation == "equal"  # without shares greedy keeps every node; equal splits by job anyway


@pytest.mark.parametrize("objective", ["work", "samples"])
def test_a_user_held_below_its_share_gets_it_within_the_bound(objective):
    """Alice's job holds 7 of 7 nodes; Bob submits at 10 s and an eighth node comes idle at 12 s, so Bob
    holds one before his wait runs out. Before: the shares bound only for a user at no node, and Bob
    stayed at 1 of his 4 for good (under samples also when Alice's job merely says it trains 100x more)."""
    cfg = PolicyConfig(profiling="never", fair_wait_s=10.0, objective=objective)
    pol = Policy(cfg)
    claim = {1: 100.0, 8: 800.0} if objective == "samples" else {1: 1.0, 8: 8.0}
    held: dict[str, tuple[str, ...]] = {}
    counts: list[tuple[float, dict[str, int]]] = []
    for t in range(60):
        nodes = NODES[:7] if t < 12 else NODES
        jobs = [JobView("a1", 1, 8, held.get("a1", ()), order=0, scaling=claim, user="alice")]
        if t >= 10:
            jobs.append(JobView("b1", 1, 8, held.get("b1", ()), order=1, scaling={1: 1.0, 8: 8.0}, user="bob"))
        used = {n for v in held.values() for n in v}
        d = pol.decide(View(float(t), tuple(n for n in nodes if n not in used), tuple(jobs)), {})
        held = {j: tuple(v) for j, v in d.assignment.items()}
        counts.append((float(t), d.counts))
    assert counts[12][1]["b1"] >= 1  # a node of its own before the wait ran out
    late = [c for t, c in counts if t >= 12 + cfg.fair_wait_s + 1]
    assert late and all(c == {"a1": 4, "b1": 4} for c in late)
