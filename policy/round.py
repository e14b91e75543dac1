"""One decision's scratch: the view checked and in canonical order, and what the decision did so far."""

from __future__ import annotations

import math
from dataclasses import replace

from policy.beliefs import Believed, Population
from policy.model import EventKind, JobView, PolicyEvent, PolicyInputError, Stop, View


def check_view(view: View) -> None:
    """Raise :class:`PolicyInputError` naming what ``view`` lists twice (a job, a free node, a job's node)."""
    ids = {j.id for j in view.jobs}
    seen: set[str] = set(view.free_nodes)
    listed = len(view.free_nodes)
    for j in view.jobs:
        seen.update(j.nodes)
        listed += len(j.nodes)
    if len(ids) == len(view.jobs) and len(seen) == listed:
        return  # nothing listed twice (one set over every node); else find what is, to name it
    seen = set(view.free_nodes)
    if len(seen) != len(view.free_nodes):
        raise PolicyInputError("a free node is listed twice in the view")
    ids.clear()
    for j in view.jobs:
        if j.id in ids:
            raise PolicyInputError(f"job {j.id} is listed twice in the view")
        ids.add(j.id)
        if seen.intersection(j.nodes) or len(set(j.nodes)) != len(j.nodes):
            raise PolicyInputError(f"job {j.id}: a node is listed twice in the view (free or another job's)")
        seen.update(j.nodes)


def with_sorted_nodes(job: JobView) -> JobView:
    """``job`` with its nodes in canonical (sorted) order."""
    nodes = tuple(sorted(job.nodes))
    return job if nodes == job.nodes else replace(job, nodes=nodes)


class Round:
    """Scratch of one decision; node order is canonical (sorted), so no decision depends on how a driver lists nodes."""

    def __init__(self, view: View) -> None:
        check_view(view)
        self.now = view.now
        self.free = sorted(view.free_nodes)
        # a job on no node (a queued one) is in order as it is
        self.jobs: dict[str, JobView] = {j.id: with_sorted_nodes(j) if j.nodes else j for j in view.jobs}
        self.events: list[PolicyEvent] = []
        self.returning: dict[str, int] = {}  # lenders owed nodes back in this decision
        self.profile_ended: set[str] = set()  # jobs whose profile ended in this decision: none starts again in it
        self.released: list[str] = []  # nodes of jobs stopped under their min, free from now on
        self.lender_used = False
        self.stop: dict[str, Stop] = {}  # jobs the driver must end, and why
        self.next_deadline = math.inf  # the earliest deadline still ahead of a job not stopped
        self.weights: dict[str, float] = {}  # deadline weights of this decision
        self.caps: dict[str, int] = {}  # fair shares that bind in this decision (policy.fairness)
        self.fair_wake: float | None = None  # when a waiting user's fair_wait_s runs out
        self.absorb: int | None = None  # what the admitted jobs absorb, once the suspensions summed it
        self.population: Population | None = None  # taken once the decision's measured points are settled
        self.believed: dict[str, Believed] = {}  # what the policy believes of each admitted job, made once
        self.pooled_costs: tuple[float, float] | None = None  # the admitted jobs' pauses pooled, once asked for
        self.total_nodes = view.free_count + sum(len(j.nodes) for j in view.jobs)  # every node the driver holds

    def note(self, kind: EventKind, job: str, **detail: object) -> None:
        self.events.append(PolicyEvent(kind, job, detail))

    def release(self, nodes: tuple[str, ...]) -> None:
        """``nodes`` are free from now on (their job stopped, was suspended or preempted)."""
        self.released.extend(n for n in nodes if n not in self.released)
