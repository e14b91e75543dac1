"""The limits a user sets on a job: over its ``budget_node_hours``, or still training at its ``deadline``, it is
stopped for good with a :class:`policy.model.Stop` in ``Decision.stop``, which drivers carry out, never parse."""

from __future__ import annotations

from policy.model import EventKind, JobView, Stop, StopReason
from policy.profiling import end_profile
from policy.round import Round
from policy.state import PolicyState


def stop_over_budget(st: PolicyState, r: Round) -> None:
    """A job that has used its budget is stopped and never admitted again (``st.over_budget``)."""
    for job in r.jobs.values():
        if job.budget_node_hours is None or job.id in st.over_budget:
            continue
        if job.used_node_hours >= job.budget_node_hours:
            st.over_budget.add(job.id)
            take_out(st, r, job, "over budget")
            r.note(EventKind.OVER_BUDGET, job.id, used_node_hours=job.used_node_hours,
                   budget_node_hours=job.budget_node_hours)
    for job_id in st.over_budget:
        job = r.jobs[job_id]
        budget = job.budget_node_hours if job.budget_node_hours is not None else job.used_node_hours
        r.stop[job_id] = Stop(StopReason.OVER_BUDGET, job.used_node_hours, budget)


def stop_past_deadline(st: PolicyState, r: Round) -> None:
    """A job still to train when its deadline comes is stopped (time only goes on: it is never admitted
    again); the next deadline still ahead (``r.next_deadline``) is when to decide again at the latest."""
    for job in r.jobs.values():
        deadline = job.deadline
        if deadline is None or job.id in r.stop or job.work_left == 0:
            continue
        if deadline > r.now:
            r.next_deadline = min(r.next_deadline, deadline)
            continue
        take_out(st, r, job, "past deadline")
        r.note(EventKind.PAST_DEADLINE, job.id, deadline=deadline, late_s=r.now - deadline)
        r.stop[job.id] = Stop(StopReason.PAST_DEADLINE, r.now, deadline)


def take_out(st: PolicyState, r: Round, job: JobView, why: str) -> None:
    """``job`` is stopped for good: out of its slot (its profile ended, for ``why``) or the queue's front."""
    if job.id in st.admitted:
        st.admitted.remove(job.id)
        st.assigned.pop(job.id, None)
        if job.id in st.profiles:
            end_profile(st, r, job.id, None, why)
    if job.id in st.queue_front:
        st.queue_front.remove(job.id)
    r.release(job.nodes)
