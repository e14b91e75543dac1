"""Property tests: every exact method reaches the same objective; plans are feasible."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from allocator import Job, Plan, Problem, solve, throughput_at
from allocator.check import violations
from allocator.milp import highs_available
from allocator.values import build_tables, plan_objective

PROPS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

rates = st.one_of(st.integers(0, 40).map(float), st.floats(0.0, 100.0, allow_nan=False))


@st.composite
def problems(draw, max_jobs: int = 4, max_count: int = 8, max_free: int = 6) -> Problem:
    """Small random instances: non-monotone, non-concave curves; running and idle jobs."""
    n_jobs = draw(st.integers(1, max_jobs))
    pool = 0
    jobs = []
    for j in range(n_jobs):
        lo = draw(st.integers(1, 3))
        hi = draw(st.integers(lo, lo + max_count - 3))
        points = draw(st.dictionaries(st.integers(1, max_count), rates, min_size=1, max_size=4))
        cur = draw(st.integers(0, hi + 1)) if draw(st.booleans()) else 0
        nodes = tuple(f"n{pool + i}" for i in range(cur))
        pool += cur
        up, down = draw(st.integers(0, 30)), draw(st.integers(0, 30))
        jobs.append(Job(f"job{j}", lo, hi, points, nodes, float(up), float(down)))
    free = tuple(f"f{i}" for i in range(draw(st.integers(0, max_free))))
    horizon = float(draw(st.integers(1, 100)))
    return Problem(tuple(jobs), free, horizon)


def check(problem: Problem, plan: Plan) -> None:
    assert violations(problem, plan) == []
    assert set(plan.assignment) == {job.id for job in problem.jobs}
    assert math.isclose(plan.objective, plan_objective(problem, plan.counts), rel_tol=1e-12, abs_tol=1e-9)


def agree(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


@PROPS
@given(problems())
def test_fast_methods_match_brute_force(problem: Problem) -> None:
    oracle = solve(problem, "brute-force")
    check(problem, oracle)
    for method in ("auto", "dp", "milp"):
        plan = solve(problem, method)
        check(problem, plan)
        assert agree(plan.objective, oracle.objective), (method, plan.counts, oracle.counts)


@settings(PROPS, max_examples=25)
@given(problems(max_jobs=3, max_count=6, max_free=5))
def test_node_binary_reference_matches_brute_force(problem: Problem) -> None:
    oracle = solve(problem, "brute-force")
    plan = solve(problem, "node-binary")
    check(problem, plan)
    assert agree(plan.objective, oracle.objective), (plan.counts, oracle.counts)


@settings(PROPS, max_examples=15)
@given(problems())
def test_cbc_matches_brute_force(problem: Problem) -> None:
    plan = solve(problem, "milp-cbc")
    check(problem, plan)
    assert agree(plan.objective, solve(problem, "brute-force").objective)


@settings(PROPS, max_examples=60)
@given(problems(max_jobs=30, max_count=20, max_free=120))
def test_reduction_matches_full_dp_on_bigger_instances(problem: Problem) -> None:
    """The Lagrangian reduction in `auto` only drops provably useless choices."""
    auto, dp = solve(problem, "auto"), solve(problem, "dp")
    check(problem, auto)
    check(problem, dp)
    assert agree(auto.objective, dp.objective), (auto.counts, dp.counts)


@settings(PROPS, max_examples=10)
@given(problems(max_jobs=12, max_count=16, max_free=60))
def test_milp_matches_dp_on_bigger_instances(problem: Problem) -> None:
    method = "milp-highs" if highs_available() else "milp-cbc"
    assert agree(solve(problem, method).objective, solve(problem, "dp").objective)


@PROPS
@given(st.dictionaries(st.integers(1, 64), rates, min_size=1, max_size=6), st.integers(1, 20))
def test_tables_use_throughput_at_semantics(scaling: dict[int, float], lo: int) -> None:
    job = Job("t", lo, 70, scaling)
    problem = Problem((job,), tuple(f"f{i}" for i in range(70)), 1.0)
    table = build_tables(problem).table(0)
    expected = np.array([throughput_at(scaling, int(n)) for n in table.counts])
    assert np.allclose(table.values, expected, rtol=1e-12, atol=1e-12)


def _demand_by_envelopes(envelopes, lam: float) -> int:
    return sum(step for e in envelopes for slope, step in zip(e.slopes, e.steps) if slope > lam)


@settings(PROPS, max_examples=200)
@given(problems(max_jobs=8, max_count=24, max_free=40))
def test_the_envelopes_give_the_arrays_demand_at_every_multiplier(problem: Problem) -> None:
    """Each row's envelope (from the curve's points, the min, the current count and its neighbours)
    predicts the row's best count at any multiplier off a breakpoint, as the full array does."""
    from allocator.fast import Padded

    tables = build_tables(problem)
    pad = Padded(tables.counts, tables.values)
    slopes = sorted({float(s) for e in tables.envelopes for s in e.slopes})
    probes = [0.5 * (a + b) for a, b in zip(slopes, slopes[1:])]
    probes += [slopes[0] * 0.5, slopes[-1] * 2.0 + 1.0] if slopes else [1.0]
    for lam in probes:
        if any(abs(lam - s) <= 1e-9 * max(1.0, s) for s in slopes):
            continue  # a tie: rounding decides either way
        assert _demand_by_envelopes(tables.envelopes, lam) == pad.demand(pad.choice(lam)), lam


@settings(PROPS, max_examples=200)
@given(problems(max_jobs=8, max_count=24, max_free=40))
# found by the search: a job flat past its one point, another whose one point lies past its max; the
# float bisection and the array's part at a multiplier of about 1e-17
@example(Problem((Job("job0", 1, 2, {1: 1.0}, ("n0", "n1", "n2")),
                  Job("job1", 1, 6, {10: 1.0}, ("n3", "n4", "n5"), up_cost_s=1.0)), (), horizon_s=1.0))
def test_the_bracket_from_the_envelopes_is_the_bisections(problem: Problem) -> None:
    from allocator.fast import Padded, _all_idle_multiplier, _bisect, _bracket, _threshold

    tables = build_tables(problem)
    pad = Padded(tables.counts, tables.values)
    cap = problem.total_nodes
    over = _threshold(tables.envelopes, cap)  # the float-only bisection, before the array's check
    lo, hi = _bisect(_all_idle_multiplier(pad), lambda lam: lam < over)
    on_array = lambda lam: pad.demand(pad.choice(lam)) > cap  # noqa: E731
    if (lo == 0.0 or on_array(lo)) and not on_array(hi):
        # the array agrees at both ends, so no midpoint fell between the two switch points: one path
        assert (lo, hi) == _bracket(pad, cap)
    else:
        # a tie the floats round the other way (e.g. a flat segment at a multiplier of 1e-17): the
        # bracket is the array's own bisection, still a bracket
        a_lo, a_hi = _bracket(pad, cap)
        assert (a_lo == 0.0 or on_array(a_lo)) and not on_array(a_hi) and a_lo < a_hi
    assert _bracket(pad, cap, tables.envelopes) == _bracket(pad, cap)



@settings(PROPS, max_examples=150)
@given(st.lists(problems(max_jobs=6, max_count=16, max_free=20), min_size=1, max_size=4))
def test_a_row_memo_changes_no_plan(stream: list[Problem]) -> None:
    """A caller's RowMemo (rows keyed by what they are made of) gives each problem of a stream the
    plan it gets alone, also when a later problem repeats an earlier one's jobs with another pool."""
    from allocator import RowMemo

    memo = RowMemo(keep=8)  # small: the memo is also emptied and refilled on the way
    for problem in stream + [Problem(p.jobs, (), p.horizon_s) for p in stream]:
        alone, memoised = solve(problem), solve(problem, memo=memo)
        assert (memoised.assignment, memoised.counts, memoised.objective) == \
            (alone.assignment, alone.counts, alone.objective)


def _table_dp(items, capacity: int) -> tuple[list[int], float]:
    """The plain (max,+) table, cell by cell over every capacity, and its backtrack in each item's
    preference order: what :func:`allocator.dp.solve_items` must give."""
    rows = [[0.0] * (capacity + 1)]
    for item in items:
        prev = rows[-1]
        rows.append([max([prev[c - w] + v for w, v in zip(item.weights, item.values) if w <= c], default=-math.inf)
                     for c in range(capacity + 1)])
    picks, c = [0] * len(items), capacity
    for j in range(len(items) - 1, -1, -1):
        item = items[j]
        picks[j] = next(i for i in item.preference
                        if item.weights[i] <= c and rows[j][c - item.weights[i]] + item.values[i] == rows[j + 1][c])
        c -= item.weights[picks[j]]
    return picks, rows[-1][capacity]


@st.composite
def knapsacks(draw):
    """Items of 1-5 choices (weights 0-6, repeated values for ties, a shuffled preference) and a
    capacity from 0 to beyond what all items can take together."""
    from allocator.dp import Item

    items = []
    for _ in range(draw(st.integers(1, 5))):
        k = draw(st.integers(1, 5))
        weights = [0] + [draw(st.integers(0, 6)) for _ in range(k - 1)]
        values = [float(draw(st.integers(-3, 6))) for _ in range(k)]
        items.append(Item(weights, values, draw(st.permutations(list(range(k))))))
    return items, draw(st.integers(0, 5 + sum(max(it.weights) for it in items)))


@settings(PROPS, max_examples=300)
@given(knapsacks())
def test_the_dp_fills_only_the_cells_its_answer_reads(case) -> None:
    """The DP fills only the band of cells the answer can reach; its picks and optimum are the full
    table's, ties included, also when the capacity exceeds what the items can take."""
    from allocator.dp import solve_items

    items, capacity = case
    assert solve_items(items, capacity) == _table_dp(items, capacity)
