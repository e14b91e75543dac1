"""Which queued jobs a driver shows the policy (the queue's order is the policy's rule, not a driver's), and why an
admitted job was given no node. A job that lost its slot goes to the queue's front (``PolicyState.queue_front``)."""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

from policy.model import Decision, View

QUEUE_VIEW_CAP = 1000  # queued jobs shown to the policy at most (FCFS needs only the head)

T = TypeVar("T")


def _same(job: object) -> str:
    return str(job)


def shown_queue(queued: Sequence[T], front: Sequence[str], want: int, id_of: Callable[[T], str] = _same) -> list[T]:
    """The jobs of ``queued`` (submission order; ``id_of`` gives a job's id) the policy is shown: all up to
    :data:`QUEUE_VIEW_CAP`; beyond it, those in ``front`` first, then the head of the others,
    ``max(QUEUE_VIEW_CAP, want + len(front jobs))`` in all."""
    if len(queued) <= QUEUE_VIEW_CAP:
        return list(queued)
    by_id = {id_of(j): j for j in queued}
    first = [by_id[j] for j in front if j in by_id]
    taken = {id_of(j) for j in first}
    rest = [j for j in queued if id_of(j) not in taken]
    return first + rest[: max(QUEUE_VIEW_CAP, want + len(first)) - len(first)]


def unplaced_reasons(view: View, decision: Decision) -> dict[str, str]:
    """Why each job ``decision`` admits but gives no node waits: no node held, fewer than its min_nodes held, or its
    min_nodes not free beside the other jobs."""
    total = view.free_count + sum(j.count for j in view.jobs)
    free = max(0, total - sum(len(nodes) for nodes in decision.assignment.values()))
    min_nodes = {j.id: j.min_nodes for j in view.jobs}
    out: dict[str, str] = {}
    for job_id, nodes in decision.assignment.items():
        if nodes or job_id not in min_nodes:
            continue
        need = min_nodes[job_id]
        if total == 0:
            out[job_id] = "no nodes: none is idle and held for this trainer yet"
        elif total < need:
            out[job_id] = f"min_nodes {need}: only {total} nodes held"
        elif free < need:
            out[job_id] = f"min_nodes {need}: {free} of {total} held nodes free, the rest run other jobs"
        else:
            out[job_id] = f"admitted; this decision gives it none of the {free} free nodes (reserved or kept back)"
    return out
