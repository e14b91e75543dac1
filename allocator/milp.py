"""The count-based MILP (multiple-choice knapsack) in PuLP.

One binary ``x[j,t]`` per job ``j`` and allowed count ``t`` of its value table:
``sum_t x[j,t] = 1`` for every job, ``sum_{j,t} count_t * x[j,t] <= C``,
maximise ``sum value_t * x[j,t]``. Nodes are interchangeable, so counts
suffice; :func:`allocator.solve.assign_nodes` turns them into a node map
without migration.
"""

from __future__ import annotations

import enum
import warnings

import numpy as np
import pulp

from allocator.model import ProblemError
from allocator.values import ValueTable

# The MILP must be exact: no relative gap; values are scaled to O(1) per job.
_GAP_REL = 1e-12
_GAP_ABS = 1e-9


class Backend(enum.Enum):
    """A MILP solver PuLP can drive."""

    CBC = "cbc"
    HIGHS = "highs"


def highs_available() -> bool:
    try:
        import highspy  # noqa: F401
    except ImportError:
        return False
    return bool(pulp.HiGHS(msg=False).available())


def default_backend() -> Backend:
    """HiGHS when highspy is importable, else CBC (bundled with PuLP)."""
    return Backend.HIGHS if highs_available() else Backend.CBC


def make_solver(backend: Backend) -> pulp.LpSolver:
    if backend is Backend.HIGHS:
        if not highs_available():
            raise ProblemError("solver 'highs' needs highspy (pip install 'malletrain[highs]')")
        return pulp.HiGHS(msg=False, gapRel=_GAP_REL, gapAbs=_GAP_ABS, threads=1)
    with warnings.catch_warnings():  # PuLP 3 warns that its bundled CBC moves to an extra in 4.0
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False, gapRel=_GAP_REL, gapAbs=_GAP_ABS, threads=1)


def binary(model: pulp.LpProblem, name: str) -> pulp.LpVariable:
    """A binary variable of ``model`` (PuLP >= 3 API when present, else the old one)."""
    if hasattr(model, "add_variable"):
        return model.add_variable(name, 0, 1, pulp.LpBinary)
    return pulp.LpVariable(name, cat=pulp.LpBinary)  # pragma: no cover - PuLP < 3


def objective_scale(tables: list[ValueTable]) -> float:
    """Divide values by this so the solver sees O(1) coefficients."""
    top = max((float(np.abs(t.values).max()) for t in tables if t.values.size), default=0.0)
    return top if top > 0 else 1.0


def run(model: pulp.LpProblem, backend: Backend, what: str) -> None:
    status = model.solve(make_solver(backend))
    if pulp.LpStatus[status] != "Optimal":
        raise ProblemError(f"{what}: solver {backend.value} ended with status {pulp.LpStatus[status]!r}")


def solve_milp(tables: list[ValueTable], capacity: int, backend: Backend) -> list[int]:
    """Chosen index into each table, from the count-based MILP."""
    if not tables:
        return []
    scale = objective_scale(tables)
    model = pulp.LpProblem("malletrain_counts", pulp.LpMaximize)
    xs: list[list[pulp.LpVariable]] = []
    for j, t in enumerate(tables):
        xs.append([binary(model, f"x_{j}_{i}") for i in range(t.counts.size)])
    model += pulp.lpSum(
        float(v) / scale * x for t, row in zip(tables, xs) for v, x in zip(t.values.tolist(), row)
    )
    for j, row in enumerate(xs):
        model += pulp.lpSum(row) == 1, f"one_count_{j}"
    model += (
        pulp.lpSum(int(c) * x for t, row in zip(tables, xs) for c, x in zip(t.counts.tolist(), row) if c)
        <= capacity,
        "capacity",
    )
    run(model, backend, "count MILP")
    return [max(range(len(row)), key=lambda i: row[i].value() or 0.0) for row in xs]
