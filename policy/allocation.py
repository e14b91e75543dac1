"""Turning counts into node maps: profiling pins and the two count-picking baselines.

The exact allocator (:func:`allocator.solve`) is called from :mod:`policy.decide` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from allocator import Job, Problem
from allocator.solve import assign_nodes
from policy.model import JobView


@dataclass
class Pinned:
    fixed: dict[str, tuple[str, ...]] = field(default_factory=dict)  # pinned jobs' node maps
    lenders: dict[str, tuple[str, ...]] = field(default_factory=dict)  # what each lender keeps
    free: list[str] = field(default_factory=list)


def apply_pins(jobs: Sequence[JobView], free: Sequence[str], pins: Mapping[str, int], lenders: Mapping[str, str]
               ) -> Pinned:
    """Place pinned (profiling) jobs first: one stepping down keeps a prefix of its nodes; one short of nodes takes
    free ones, then borrows from ``lenders[job]``, which keeps the rest and may only shrink further in this decision."""
    out = Pinned(free=list(free))
    holdings = {j.id: j.nodes for j in jobs}
    by_id = {j.id: j for j in jobs}
    for job_id, want in pins.items():
        job = by_id.get(job_id)
        if job is None:
            continue
        want = max(0, min(want, job.max_nodes))
        own = holdings[job_id]
        if want <= len(own):
            out.fixed[job_id] = own[:want]
            out.free.extend(own[want:])
            continue
        need = want - len(own)
        extra = out.free[:need]
        del out.free[:need]
        need -= len(extra)
        lender = lenders.get(job_id)
        if need > 0 and lender is not None and holdings.get(lender):
            keep = holdings[lender]
            take = min(need, len(keep))
            extra += list(keep[len(keep) - take:])
            holdings[lender] = keep[: len(keep) - take]
            out.lenders[lender] = holdings[lender]
        out.fixed[job_id] = own + tuple(extra)
    return out


def _problem(jobs: Sequence[JobView], free: Sequence[str]) -> Problem:
    return Problem(tuple(Job(j.id, j.min_nodes, j.max_nodes, {j.min_nodes: 1.0}, j.nodes) for j in jobs),
                   tuple(free), 1.0)


def held_to_shares(jobs: Sequence[JobView], caps: Mapping[str, int]) -> tuple[list[JobView], int]:
    """``jobs`` as a count rule sees them while fair shares bind (``caps``): each job's max is its share (its min at
    least), keeping no more nodes than that; a job whose share is none is left out. Also the nodes so released."""
    out: list[JobView] = []
    released = 0
    for j in jobs:
        cap = caps.get(j.id)
        if cap is None:
            out.append(j)
        elif cap > 0:
            keep = min(j.count, cap)
            out.append(replace(j, nodes=j.nodes[:keep], max_nodes=max(j.min_nodes, min(j.max_nodes, cap))))
            released += j.count - keep
        else:
            released += j.count
    return out, released


def greedy_counts(jobs: Sequence[JobView], n_free: int) -> dict[str, int]:
    """FCFS: each job, in admission order, grown to its max with what is free; nothing shrinks."""
    avail = n_free
    counts: dict[str, int] = {}
    for j in jobs:
        target = min(j.max_nodes, j.count + avail)
        if target < j.min_nodes:
            target = j.count
        counts[j.id] = target
        avail -= target - j.count
    return counts


def equal_counts(jobs: Sequence[JobView], n_free: int) -> dict[str, int]:
    """Split every held node evenly (water-filling) over the earliest jobs that can all get their min (else the
    latest-admitted is dropped and the split retried)."""
    total = sum(j.count for j in jobs) + n_free
    for k in range(len(jobs), 0, -1):
        chosen = jobs[:k]
        counts = _water_fill(total, chosen)
        if all(counts[j.id] >= j.min_nodes for j in chosen):
            out = {j.id: 0 for j in jobs}
            out.update(counts)
            return out
    return {j.id: 0 for j in jobs}


def _water_fill(total: int, jobs: Sequence[JobView]) -> dict[str, int]:
    counts = {j.id: 0 for j in jobs}
    left = total
    open_jobs = list(jobs)
    while left > 0 and open_jobs:
        share = max(1, left // len(open_jobs))
        still_open = []
        for j in open_jobs:
            give = min(share, j.max_nodes - counts[j.id], left)
            counts[j.id] += give
            left -= give
            if counts[j.id] < j.max_nodes:
                still_open.append(j)
            if left == 0:
                break
        open_jobs = still_open
    return counts


def node_map(jobs: Sequence[JobView], free: Sequence[str], counts: dict[str, int]) -> dict[str, tuple[str, ...]]:
    """Counts -> nodes without migration (the allocator's own helper)."""
    return assign_nodes(_problem(jobs, free), counts)
