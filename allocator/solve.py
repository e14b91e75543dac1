"""Solver entry point: ``solve(problem, method) -> Plan``.

Methods (all exact; they differ in speed):

* ``auto``: the fast path (:mod:`allocator.fast`): unconstrained shortcut,
  Lagrangian reduction of the choices, then the numpy DP on what is left.
* ``dp``: the plain vectorised (max,+) DP over all allowed counts.
* ``milp``: the count-based multiple-choice knapsack MILP in PuLP, HiGHS when
  highspy is importable else CBC; ``milp-highs`` / ``milp-cbc`` pick one.
* ``node-binary``: the published node x job MILP (reference, slow; bigM fixed),
  with ``node-binary-highs`` / ``node-binary-cbc``.
* ``brute-force``: enumerate all count vectors (tiny problems only).

Counts become a node map without migration (:func:`assign_nodes`); the plan's
objective is always recomputed from the counts with the model's own
:meth:`Job.value`, so every method reports it the same way.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Callable

import numpy as np

from allocator import fast, milp, reference
from allocator.model import Plan, Problem, ProblemError
from allocator.values import RowMemo, Tables, build_tables, plan_objective

METHODS = (
    "auto",
    "dp",
    "milp",
    "milp-highs",
    "milp-cbc",
    "node-binary",
    "node-binary-highs",
    "node-binary-cbc",
    "brute-force",
)

CountSolver = Callable[[Tables, int], list[int]]


def assign_nodes(problem: Problem, counts: dict[str, int]) -> dict[str, tuple[str, ...]]:
    """Turn per-job node counts into a node map without migration.

    Shrinking jobs keep a prefix of their nodes; growing jobs keep all theirs
    and take from the free pool plus what shrinking jobs released.
    """
    if sum(counts.values()) > problem.total_nodes:
        raise ProblemError(f"counts need {sum(counts.values())} nodes, only {problem.total_nodes} held")
    pool = list(problem.free_nodes)
    out: dict[str, tuple[str, ...]] = {}
    for job in problem.jobs:
        n = counts.get(job.id, 0)
        if n < 0:
            raise ProblemError(f"job {job.id}: count {n} < 0")
        if n <= job.current:
            out[job.id] = job.nodes[:n]
            pool.extend(job.nodes[n:])
    taken = 0  # growing jobs, in order, take the next nodes of the pool
    for job in problem.jobs:
        n = counts.get(job.id, 0)
        if n > job.current:
            grow = n - job.current
            out[job.id] = job.nodes + tuple(pool[taken:taken + grow])
            taken += grow
    return {job.id: out[job.id] for job in problem.jobs}


def _count_solvers() -> dict[str, CountSolver]:
    return {
        "auto": fast.solve_fast,
        "dp": fast.solve_full_dp,
        "milp": lambda t, c: milp.solve_milp(t.all(), c, milp.default_backend()),
        "milp-highs": lambda t, c: milp.solve_milp(t.all(), c, milp.Backend.HIGHS),
        "milp-cbc": lambda t, c: milp.solve_milp(t.all(), c, milp.Backend.CBC),
        "brute-force": lambda t, c: reference.solve_brute_force(t.all(), c),
    }


_NODE_BINARY = MappingProxyType({
    "node-binary": None,
    "node-binary-highs": milp.Backend.HIGHS,
    "node-binary-cbc": milp.Backend.CBC,
})


def solve(problem: Problem, method: str = "auto", memo: RowMemo | None = None) -> Plan:
    """The exact optimal plan of ``problem`` by ``method`` (see :data:`METHODS`); ``memo``: rows of
    jobs valued before (:class:`allocator.values.RowMemo`), which changes no plan."""
    if method not in METHODS:
        raise ProblemError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    tables = build_tables(problem, memo)
    if method in _NODE_BINARY:
        backend = _NODE_BINARY[method] or milp.default_backend()
        node_plan = reference.solve_node_binary(problem, tables.all(), backend)
        return Plan(node_plan.assignment, plan_objective(problem, node_plan.counts), method, node_plan.counts)
    picks = _count_solvers()[method](tables, problem.total_nodes)
    at = (np.arange(len(picks), dtype=np.int64), np.asarray(picks, np.int64))
    counts = {job.id: n for job, n in zip(problem.jobs, tables.counts[at].tolist())}
    # the chosen choices' values: what plan_objective recomputes with the model's functions, to
    # rounding (the tests hold them together)
    return Plan(assign_nodes(problem, counts), float(sum(tables.values[at].tolist())), method, counts)
