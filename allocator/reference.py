"""Reference solvers: the published node x job MILP and a brute-force enumerator.

Both are yardsticks the fast exact methods are checked against, and both are
slow: use them on small problems only.

The node x job formulation (BFTrainer/MalleTrain style), for job ``j`` holding
``cur_j`` nodes now and every held node ``i`` (free or in use):

* ``x[j,i]`` binary: node ``i`` runs job ``j``; ``sum_j x[j,i] <= 1``.
* ``y[j,t]`` one-hot over the allowed counts, ``n_j = sum_i x[j,i] = sum_t t*y[j,t]``;
  throughput is tabulated over counts, so any (non-concave) curve is exact.
* ``kept_j`` = current nodes still used, ``new_j = n_j - kept_j``;
  ``g_j`` (grows, pays the up cost) and ``s_j`` (shrinks, pays the down cost),
  ``g_j + s_j <= 1``:

  - ``cur_j - n_j <= N*s_j``                 a job below its current count shrinks,
  - ``(n_j - cur_j) + new_j <= bigM*g_j``   growth pays, and only growing jobs take new nodes,
  - ``new_j <= N*(1 - s_j)``                a shrinking job takes no new node,
  - ``cur_j - kept_j <= cur_j*s_j``         a job that does not shrink keeps all its nodes.

The left side of the growth constraint reaches ``2N`` (a job starting from 0
nodes that takes the whole pool has growth ``N`` and ``N`` new nodes), so
``bigM`` must be at least ``2N``. The released BFTrainer code uses
``bigM = N + 1``: it silently caps one job's growth per decision at
``(N + 1) / 2`` nodes. The default here is ``2N + 1``; ``big_m`` lets the tests
show the difference.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pulp

from allocator.milp import Backend, binary, objective_scale, run
from allocator.model import Problem, ProblemError
from allocator.values import ValueTable, throughputs

BRUTE_FORCE_LIMIT = 200_000


@dataclass(frozen=True)
class NodePlan:
    """What the node x job MILP chose: node map and per-job counts."""

    assignment: dict[str, tuple[str, ...]]
    counts: dict[str, int]


def held_nodes(problem: Problem) -> tuple[str, ...]:
    """Every node the problem holds: free ones first, then each job's, in order."""
    return problem.free_nodes + tuple(n for job in problem.jobs for n in job.nodes)


def correct_big_m(problem: Problem) -> int:
    return 2 * problem.total_nodes + 1


def solve_node_binary(
    problem: Problem, tables: list[ValueTable], backend: Backend, big_m: int | None = None
) -> NodePlan:
    """Solve the node x job MILP; ``big_m`` defaults to the correct ``2N + 1``."""
    pool = held_nodes(problem)
    total = len(pool)
    big_m = correct_big_m(problem) if big_m is None else big_m
    scale = objective_scale(tables)
    model = pulp.LpProblem("malletrain_node_binary", pulp.LpMaximize)
    x = {(j, i): binary(model, f"x_{j}_{i}") for j in range(len(tables)) for i in range(total)}
    for i in range(total):
        model += pulp.lpSum(x[j, i] for j in range(len(tables))) <= 1, f"node_{i}"
    gains = []
    index = {node: i for i, node in enumerate(pool)}
    for j, t in enumerate(tables):
        gains.append(_add_job(model, x, j, t, problem.horizon_s, [index[n] for n in t.job.nodes], total, big_m, scale))
    model += pulp.lpSum(gains)
    run(model, backend, "node x job MILP")
    return _read_plan(problem, x, pool)


def _add_job(
    model: pulp.LpProblem,
    x: dict[tuple[int, int], pulp.LpVariable],
    j: int,
    table: ValueTable,
    horizon_s: float,
    mine: list[int],
    total: int,
    big_m: int,
    scale: float,
) -> pulp.LpAffineExpression:
    """Constraints of one job; returns its (scaled) objective term."""
    job, cur = table.job, table.job.current
    y = [binary(model, f"y_{j}_{t}") for t in range(table.counts.size)]
    g = binary(model, f"grow_{j}")
    s = binary(model, f"shrink_{j}")
    n = pulp.lpSum(x[j, i] for i in range(total))
    kept = pulp.lpSum(x[j, i] for i in mine)
    new = n - kept
    model += pulp.lpSum(y) == 1, f"one_count_{j}"
    model += n == pulp.lpSum(int(c) * yt for c, yt in zip(table.counts.tolist(), y)), f"count_{j}"
    model += g + s <= 1, f"grow_or_shrink_{j}"
    model += cur - n <= total * s, f"shrink_flag_{j}"
    model += (n - cur) + new <= big_m * g, f"grow_flag_{j}"
    model += new <= total * (1 - s), f"shrink_no_new_{j}"
    model += cur - kept <= cur * s, f"keep_unless_shrink_{j}"
    rate = job.throughput(cur) if cur else 0.0
    work = horizon_s * throughputs(job, table.counts)
    return pulp.lpSum(float(w) / scale * yt for w, yt in zip(work.tolist(), y)) - (
        rate * job.up_cost_s / scale * g + rate * job.down_cost_s / scale * s
    )


def _read_plan(problem: Problem, x: dict[tuple[int, int], pulp.LpVariable], pool: tuple[str, ...]) -> NodePlan:
    assignment: dict[str, tuple[str, ...]] = {}
    for j, job in enumerate(problem.jobs):
        taken = {pool[i] for i in range(len(pool)) if (x[j, i].value() or 0.0) > 0.5}
        kept = tuple(n for n in job.nodes if n in taken)
        assignment[job.id] = kept + tuple(n for n in pool if n in taken and n not in job.nodes)
    return NodePlan(assignment, {k: len(v) for k, v in assignment.items()})


def solve_brute_force(tables: list[ValueTable], capacity: int) -> list[int]:
    """Enumerate every count vector (tiny problems only); ties go to the first found."""
    sizes = [t.counts.size for t in tables]
    if int(np.prod(sizes, dtype=np.float64)) > BRUTE_FORCE_LIMIT:
        raise ProblemError(f"brute force: {np.prod(sizes, dtype=np.float64):.0f} combinations > {BRUTE_FORCE_LIMIT}")
    best, best_value = None, -np.inf
    for combo in itertools.product(*(range(s) for s in sizes)):
        used = sum(int(t.counts[i]) for t, i in zip(tables, combo))
        if used > capacity:
            continue
        value = sum(float(t.values[i]) for t, i in zip(tables, combo))
        if value > best_value:
            best, best_value = list(combo), value
    assert best is not None  # all-zero always fits
    return best
