"""Which queued jobs a driver shows the policy: the queue's order is the policy's rule, not a driver's.

A job the policy took a slot from (a recall left it below its min, or adaptive admission suspended
it) goes back to the **front** of the queue with its progress: :class:`policy.state.PolicyState`'s
``queue_front``, re-admitted first. A driver keeps its queued jobs in submission order and shows the
policy every one of them, up to :data:`QUEUE_VIEW_CAP` (a job file with thousands of arrivals at once
would cost that much per decision; FCFS needs only the head). Beyond the cap it shows the front
jobs and then the head of the rest: ``want`` jobs beyond the front ones, if that is more.
"""

from __future__ import annotations

from typing import Sequence

QUEUE_VIEW_CAP = 1000  # queued jobs shown to the policy at most (FCFS needs only the head)


def shown_queue(queued: Sequence[str], front: Sequence[str], want: int) -> list[str]:
    """The ids of ``queued`` (in submission order) the policy is shown: all of them up to
    :data:`QUEUE_VIEW_CAP`; beyond it, the ones in ``front`` (the policy's ``queue_front``) first, then
    the head of the others, ``max(QUEUE_VIEW_CAP, want + len(front jobs))`` in all."""
    if len(queued) <= QUEUE_VIEW_CAP:
        return list(queued)
    waiting = set(queued)
    first = [j for j in front if j in waiting]
    taken = set(first)
    rest = [j for j in queued if j not in taken]
    return first + rest[: max(QUEUE_VIEW_CAP, want + len(first)) - len(first)]
