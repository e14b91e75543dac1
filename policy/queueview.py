"""Which queued jobs a driver shows the policy: the queue's order is the policy's rule, not a driver's.

A job the policy took a slot from (a recall left it below its min, or adaptive admission suspended
it) goes back to the **front** of the queue with its progress: :class:`policy.state.PolicyState`'s
``queue_front``, re-admitted first. A driver keeps its queued jobs in submission order and shows the
policy every one of them, up to :data:`QUEUE_VIEW_CAP` (a job file with thousands of arrivals at once
would cost that much per decision; FCFS needs only the head). Beyond the cap it shows the front
jobs and then the head of the rest: ``want`` jobs beyond the front ones, if that is more.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

QUEUE_VIEW_CAP = 1000  # queued jobs shown to the policy at most (FCFS needs only the head)

T = TypeVar("T")


def _same(job: object) -> str:
    return str(job)


def shown_queue(queued: Sequence[T], front: Sequence[str], want: int,
                id_of: Callable[[T], str] = _same) -> list[T]:
    """The jobs of ``queued`` (in submission order; ``id_of`` gives a job's id, a job is its id by
    default) the policy is shown: all of them up to :data:`QUEUE_VIEW_CAP`; beyond it, the ones in
    ``front`` (the policy's ``queue_front``) first, then the head of the others,
    ``max(QUEUE_VIEW_CAP, want + len(front jobs))`` in all."""
    if len(queued) <= QUEUE_VIEW_CAP:
        return list(queued)
    by_id = {id_of(j): j for j in queued}
    first = [by_id[j] for j in front if j in by_id]
    taken = {id_of(j) for j in first}
    rest = [j for j in queued if id_of(j) not in taken]
    return first + rest[: max(QUEUE_VIEW_CAP, want + len(first)) - len(first)]
