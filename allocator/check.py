"""Feasibility of a plan against its problem, as a list of named violations."""

from __future__ import annotations

from allocator.model import Job, Plan, Problem


def violations(problem: Problem, plan: Plan) -> list[str]:
    """Everything wrong with ``plan``; empty when it is feasible.

    Checks: every job has an entry and no unknown job does; each node goes to
    at most one job and comes from the held pool; counts are 0 or within
    [min, max]; no job both gains and loses nodes; a growing (or unchanged)
    job keeps all its nodes; ``plan.counts`` agrees with the assignment.
    """
    out: list[str] = []
    held = set(problem.free_nodes).union(*(job.nodes for job in problem.jobs))
    ids = {job.id for job in problem.jobs}
    out += [f"plan assigns unknown job {jid}" for jid in plan.assignment if jid not in ids]
    owner: dict[str, str] = {}
    for job in problem.jobs:
        if job.id not in plan.assignment:
            out.append(f"job {job.id}: missing from the plan")
            continue
        out += _job_violations(job, plan.assignment[job.id], held, owner)
        if plan.counts and plan.counts.get(job.id) != len(plan.assignment[job.id]):
            out.append(f"job {job.id}: counts says {plan.counts.get(job.id)}, assignment has {len(plan.assignment[job.id])}")
    return out


def _job_violations(job: Job, nodes: tuple[str, ...], held: set[str], owner: dict[str, str]) -> list[str]:
    out: list[str] = []
    n = len(nodes)
    if n and not (job.min_nodes <= n <= job.max_nodes):
        out.append(f"job {job.id}: {n} nodes outside {{0}} ∪ [{job.min_nodes}, {job.max_nodes}]")
    if len(set(nodes)) != n:
        out.append(f"job {job.id}: a node appears twice in its assignment")
    for node in nodes:
        if node not in held:
            out.append(f"job {job.id}: node {node} is not held")
        if node in owner and owner[node] != job.id:
            out.append(f"node {node}: given to both {owner[node]} and {job.id}")
        owner[node] = job.id
    mine = set(job.nodes)
    gained = [x for x in nodes if x not in mine]
    lost = [x for x in job.nodes if x not in set(nodes)]
    if gained and lost:
        out.append(f"job {job.id}: gains {gained[:3]} and loses {lost[:3]} (migration)")
    if n >= job.current and lost:
        out.append(f"job {job.id}: grows or stays but drops {lost[:3]}")
    return out
