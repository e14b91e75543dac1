"""Which queued jobs a driver shows the policy: the policy's rule (:mod:`policy.queueview`), which the
simulator follows and the daemon meets by showing every job."""

from __future__ import annotations

from policy.queueview import QUEUE_VIEW_CAP, shown_queue


def test_every_queued_job_is_shown_up_to_the_cap() -> None:
    queued = [f"j{i:05d}" for i in range(QUEUE_VIEW_CAP)]
    assert shown_queue(queued, ["j00999"], want=10) == queued


def test_beyond_the_cap_the_jobs_the_policy_put_at_the_front_come_first_then_the_head() -> None:
    queued = [f"j{i:05d}" for i in range(3 * QUEUE_VIEW_CAP)]
    front = ["j02500", "gone", "j01200"]  # preempted or suspended: re-admitted first ("gone" is no longer queued)
    shown = shown_queue(queued, front, want=10)
    assert shown[:2] == ["j02500", "j01200"]
    assert shown[2:] == queued[: QUEUE_VIEW_CAP - 2]
    more = shown_queue(queued, front, want=QUEUE_VIEW_CAP + 5)  # a Pjmax above the cap: its slots and the front
    assert len(more) == QUEUE_VIEW_CAP + 5 + 2 and more[2:] == queued[: QUEUE_VIEW_CAP + 5]
