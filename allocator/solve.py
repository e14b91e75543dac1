"""Solver entry point. (Initial version: a plain exact DP; faster methods to come.)"""

from __future__ import annotations

import time

from allocator.model import Plan, Problem, ProblemError

METHODS = ("auto", "dp")


def assign_nodes(problem: Problem, counts: dict[str, int]) -> dict[str, tuple[str, ...]]:
    """Turn per-job node counts into a node map without migration.

    Shrinking jobs keep a prefix of their nodes; growing jobs keep all theirs
    and take from the free pool plus what shrinking jobs released.
    """
    if sum(counts.values()) > problem.total_nodes:
        raise ProblemError("counts exceed the nodes held")
    pool = list(problem.free_nodes)
    out: dict[str, tuple[str, ...]] = {}
    for job in problem.jobs:
        n = counts.get(job.id, 0)
        if n <= job.current:
            out[job.id] = job.nodes[:n]
            pool.extend(job.nodes[n:])
    pool.reverse()
    for job in problem.jobs:
        n = counts.get(job.id, 0)
        if n > job.current:
            extra = [pool.pop() for _ in range(n - job.current)]
            out[job.id] = job.nodes + tuple(extra)
    return out


def _choices(job, cap: int) -> list[int]:
    return [0] + list(range(job.min_nodes, min(job.max_nodes, cap) + 1))


def _solve_dp(problem: Problem) -> tuple[dict[str, int], float]:
    cap = problem.total_nodes
    best = [0.0] + [float("-inf")] * cap
    picks: list[list[int]] = []
    for job in problem.jobs:
        new = [float("-inf")] * (cap + 1)
        arg = [0] * (cap + 1)
        vals = {n: job.value(n, problem.horizon_s) for n in _choices(job, cap)}
        for c in range(cap + 1):
            if best[c] == float("-inf"):
                continue
            for n, v in vals.items():
                if c + n <= cap and best[c] + v > new[c + n]:
                    new[c + n] = best[c] + v
                    arg[c + n] = n
        best = new
        picks.append(arg)
    c = max(range(cap + 1), key=lambda i: best[i])
    obj = best[c]
    counts: dict[str, int] = {}
    for job, arg in zip(reversed(problem.jobs), reversed(picks)):
        n = arg[c]
        counts[job.id] = n
        c -= n
    return counts, obj


def solve(problem: Problem, method: str = "auto") -> Plan:
    if method not in METHODS:
        raise ProblemError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    t0 = time.perf_counter()
    counts, obj = _solve_dp(problem)
    assignment = assign_nodes(problem, counts)
    return Plan(assignment, obj, time.perf_counter() - t0, "dp", counts)
