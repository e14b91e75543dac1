"""Allocator behaviour on hand-made and real-curve instances (issue A §3)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from allocator import Job, Plan, Problem, ProblemError, solve, throughput_at
from allocator.check import violations
from allocator.dp import InfeasibleError, Item, solve_items
from allocator.milp import Backend, highs_available
from allocator.reference import correct_big_m, solve_node_binary
from allocator.solve import METHODS, assign_nodes
from allocator.values import build_tables, plan_objective

EXACT = ("auto", "dp", "milp", "milp-cbc", "brute-force", "node-binary")


def free(n: int, prefix: str = "f") -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(n))


def same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def small_problem() -> Problem:
    jobs = (
        Job("a", 1, 8, {1: 10.0, 4: 30.0, 8: 50.0}, ("n0", "n1"), 18.0, 12.0),
        Job("b", 2, 6, {2: 20.0, 6: 80.0}, (), 18.0, 12.0),
        Job("c", 1, 4, {1: 5.0, 2: 6.0}, ("n2",), 18.0, 12.0),
    )
    return Problem(jobs, free(5), 600.0)


def test_public_api_and_every_method_agree_on_a_small_problem() -> None:
    problem = small_problem()
    plans = {m: solve(problem, m) for m in METHODS}
    best = plans["brute-force"].objective
    for method, plan in plans.items():
        assert isinstance(plan, Plan)
        assert plan.method == method
        assert same(plan.objective, best), method
        assert violations(problem, plan) == [], method
        assert set(plan.assignment) == {"a", "b", "c"}


def test_unknown_method_lists_the_methods() -> None:
    with pytest.raises(ProblemError) as err:
        solve(small_problem(), "simplex")
    for method in METHODS:
        assert method in str(err.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [("up_cost_s", float("nan")), ("down_cost_s", float("inf")), ("min_nodes", 1.5)],
)
def test_bad_job_fields_are_named(field: str, value: float) -> None:
    kwargs = dict(id="job-7", min_nodes=1, max_nodes=4, scaling={1: 1.0}, nodes=(), up_cost_s=1.0, down_cost_s=1.0)
    kwargs[field] = value
    with pytest.raises(ProblemError, match=rf"job-7.*{field}"):
        Job(**kwargs)  # checked when made, once


def test_infinite_horizon_is_rejected() -> None:
    with pytest.raises(ProblemError, match="horizon_s"):
        solve(Problem((), free(1), float("inf")))


def test_empty_problems() -> None:
    assert solve(Problem((), free(3), 10.0)).assignment == {}
    job = Job("j", 2, 4, {2: 1.0}, (), 0.0, 0.0)
    plan = solve(Problem((job,), (), 10.0))
    assert plan.assignment == {"j": ()} and plan.objective == 0.0


def test_unconstrained_every_job_gets_its_best_count() -> None:
    jobs = (
        Job("up", 1, 6, {1: 1.0, 4: 4.0, 6: 5.0}, ("a",), 1.0, 1.0),
        Job("peak", 1, 8, {2: 10.0, 3: 12.0, 8: 2.0}, ("b", "c", "d", "e"), 1.0, 1.0),
    )
    plan = solve(Problem(jobs, free(20), 1000.0))
    assert plan.counts == {"up": 6, "peak": 3}
    assert plan.assignment["up"][0] == "a"
    assert set(plan.assignment["peak"]) < {"b", "c", "d", "e"}


def test_min_nodes_gap_and_capacity() -> None:
    # b needs 5 nodes or none; only 6 nodes in total: a takes 1 and b 5 beats a alone with 6.
    jobs = (
        Job("a", 1, 6, {1: 10.0, 6: 12.0}, (), 0.0, 0.0),
        Job("b", 5, 5, {5: 100.0}, (), 0.0, 0.0),
    )
    for method in EXACT:
        assert solve(Problem(jobs, free(6), 10.0), method).counts == {"a": 1, "b": 5}, method


def test_rescale_cost_keeps_a_job_where_it_is() -> None:
    # Growing from 2 to 3 nodes adds 1 sample/s for 10 s but costs 2 s of 2 samples/s.
    job = Job("j", 1, 3, {1: 1.0, 2: 2.0, 3: 3.0}, ("a", "b"), 2.0, 2.0)
    problem = Problem((job,), free(1), 3.0)
    assert solve(problem).counts == {"j": 2}
    assert solve(Problem((job,), free(1), 10.0)).counts == {"j": 3}


def test_ties_keep_jobs_unchanged() -> None:
    # Flat above 4 nodes and free rescaling: 4..8 nodes are worth the same; stay at 6.
    job = Job("flat", 1, 8, {4: 40.0}, tuple(f"n{i}" for i in range(6)), 0.0, 0.0)
    for method in ("auto", "dp"):
        plan = solve(Problem((job,), free(2), 100.0), method)
        assert plan.counts == {"flat": 6}, method
        assert plan.assignment["flat"] == job.nodes


def test_growing_job_keeps_its_nodes_and_shrinking_job_keeps_a_subset() -> None:
    grow = Job("grow", 1, 10, {1: 100.0, 10: 1000.0}, ("g0", "g1"), 0.0, 0.0)
    shrink = Job("shrink", 1, 10, {1: 200.0, 10: 250.0}, tuple(f"s{i}" for i in range(6)), 0.0, 0.0)
    problem = Problem((grow, shrink), free(2), 100.0)
    plan = solve(problem)
    assert plan.counts == {"grow": 9, "shrink": 1}
    assert plan.assignment["grow"][:2] == ("g0", "g1")
    assert set(plan.assignment["shrink"]) <= set(shrink.nodes)
    assert violations(problem, plan) == []


def test_violations_catch_migration_and_double_use() -> None:
    problem = small_problem()
    bad = Plan({"a": ("n0", "f0"), "b": ("f0", "f1"), "c": ()}, 0.0, 0.0)
    found = " | ".join(violations(problem, bad))
    assert "migration" in found or "drops" in found
    assert "given to both" in found
    too_small = Plan({"a": ("n0", "n1"), "b": ("f0",), "c": ("n2",)}, 0.0, 0.0)
    assert any("job b" in v and "outside" in v for v in violations(problem, too_small))
    stranger = Plan({"a": ("n0", "n1", "zz"), "b": (), "c": ("n2",)}, 0.0, 0.0)
    assert any("zz is not held" in v for v in violations(problem, stranger))


def test_assign_nodes_rejects_too_many() -> None:
    with pytest.raises(ProblemError, match="only 8 held"):
        assign_nodes(small_problem(), {"a": 8, "b": 6})


def test_node_binary_big_m_of_nodes_plus_one_caps_growth() -> None:
    """The released BFTrainer bigM = N + 1 lets a job grow by only about N/2 at once."""
    job = Job("x", 1, 8, {1: 1.0, 8: 8.0}, (), 18.0, 12.0)
    problem = Problem((job,), free(8), 100.0)
    tables = build_tables(problem).all()
    buggy = solve_node_binary(problem, tables, Backend.CBC, big_m=problem.total_nodes + 1)
    right = solve_node_binary(problem, tables, Backend.CBC)
    assert correct_big_m(problem) == 2 * 8 + 1
    assert buggy.counts == {"x": 4}
    assert right.counts == {"x": 8}
    assert plan_objective(problem, buggy.counts) < plan_objective(problem, right.counts)
    assert same(plan_objective(problem, right.counts), solve(problem).objective)


def test_node_binary_big_m_bug_with_a_running_job() -> None:
    # A 2-node job in a 10-node pool may grow to 10; bigM = 11 allows 2*(n-2) <= 11, n <= 7.
    job = Job("x", 1, 10, {1: 1.0, 10: 10.0}, ("a", "b"), 1.0, 1.0)
    problem = Problem((job,), free(8), 1000.0)
    tables = build_tables(problem).all()
    buggy = solve_node_binary(problem, tables, Backend.CBC, big_m=problem.total_nodes + 1)
    assert buggy.counts == {"x": 7}
    assert solve(problem, "node-binary").counts == solve(problem).counts == {"x": 10}


@pytest.mark.skipif(not highs_available(), reason="highspy not installed")
def test_highs_methods_match_cbc() -> None:
    problem = small_problem()
    for a, b in (("milp-highs", "milp-cbc"), ("node-binary-highs", "node-binary-cbc")):
        assert same(solve(problem, a).objective, solve(problem, b).objective)


def test_value_tables_match_the_model() -> None:
    problem = small_problem()
    tables = build_tables(problem)
    for j, job in enumerate(problem.jobs):
        t = tables.table(j)
        for count, value in zip(t.counts.tolist(), t.values.tolist()):
            assert same(value, job.value(count, problem.horizon_s)), (job.id, count)
        assert t.counts[0] == 0 and list(t.counts[1:]) == list(range(job.min_nodes, min(job.max_nodes, 8) + 1))


def test_dp_items_and_infeasible_capacity() -> None:
    items = [
        Item([0, 2, 3], [0.0, 5.0, 6.0], [0, 1, 2]),
        Item([0, 1], [0.0, 4.0], [0, 1]),
    ]
    picks, best = solve_items(items, 3)
    assert picks == [1, 1] and best == 9.0
    with pytest.raises(InfeasibleError):
        solve_items([Item([2], [1.0], [0])], 1)


def summit_curves(path: Path) -> dict[str, dict[int, float]]:
    curves: dict[str, dict[int, float]] = {}
    with path.open() as fh:
        rows = csv.DictReader(line for line in fh if not line.startswith("#"))
        for row in rows:
            curves.setdefault(row["model"], {})[int(row["nodes"])] = float(row["samples_per_second"])
    return curves


def summit_problem(curves: dict[str, dict[int, float]], seed: int, n_jobs: int, n_nodes: int) -> Problem:
    rng = np.random.default_rng(seed)
    names = sorted(curves)
    nodes = [f"n{i}" for i in range(n_nodes)]
    jobs, pos = [], 0
    for j in range(n_jobs):
        cur = int(rng.integers(0, 2 * n_nodes // n_jobs)) if rng.random() < 0.6 else 0
        cur = min(cur, n_nodes - pos)
        jobs.append(Job(f"j{j}", 1, 64, curves[names[j % len(names)]], tuple(nodes[pos : pos + cur]), 18.0, 12.0))
        pos += cur
    return Problem(tuple(jobs), tuple(nodes[pos:]), 600.0)


def test_summit_curves_auto_matches_milp_and_dp(summit_scaling: Path) -> None:
    curves = summit_curves(summit_scaling)
    assert len(curves) >= 7
    for seed in range(3):
        problem = summit_problem(curves, seed, 20, 200)
        auto = solve(problem)
        assert violations(problem, auto) == []
        assert same(auto.objective, solve(problem, "milp").objective)
        assert same(auto.objective, solve(problem, "dp").objective)


def test_summit_curves_reduction_is_exact_at_scale(summit_scaling: Path) -> None:
    curves = summit_curves(summit_scaling)
    for seed in range(2):
        problem = summit_problem(curves, 10 + seed, 150, 1500)
        auto, dp = solve(problem), solve(problem, "dp")
        assert violations(problem, auto) == []
        assert same(auto.objective, dp.objective)
        assert same(auto.objective, plan_objective(problem, auto.counts))
        assert sum(auto.counts.values()) <= problem.total_nodes


def test_throughput_semantics_below_between_above() -> None:
    scaling = {2: 10.0, 4: 30.0}
    job = Job("s", 1, 10, scaling)
    tables = build_tables(Problem((job,), free(10), 1.0))
    got = dict(zip(tables.table(0).counts.tolist(), tables.table(0).values.tolist()))
    assert got[1] == throughput_at(scaling, 1) == 5.0
    assert got[3] == throughput_at(scaling, 3) == 20.0
    assert got[9] == throughput_at(scaling, 9) == 30.0


@pytest.mark.parametrize(
    ("jobs", "free_nodes", "message"),
    [
        ((("a", ("n1",)), ("a", ())), (), "job id 'a' appears twice"),
        ((("a", ("n1",)), ("b", ("n2", "n1"))), (), "node 'n1' held by both a and b"),
        ((("a", ("n1",)),), ("n2", "n1"), "free node 'n1' is also held by job a"),
        ((("a", ("n1",)),), ("n2", "n3", "n2"), "free_nodes lists a node twice"),
    ],
)
def test_a_problem_names_the_id_or_node_it_lists_twice(jobs, free_nodes, message: str) -> None:
    made = tuple(Job(job_id, 1, 4, {1: 1.0}, nodes) for job_id, nodes in jobs)
    with pytest.raises(ProblemError, match=message):
        Problem(made, free_nodes, 10.0)
