"""Objective ``completion``: once every job is admitted, a node goes where it saves the most completion
time (each job's work weighted by the median remaining work over its own); while jobs wait, work."""

from __future__ import annotations

from policy import Policy, PolicyConfig
from policy.model import JobView
from tests.test_policy import Cluster, names

SAME = ((1, 10.0), (2, 18.0), (4, 30.0), (8, 40.0))  # both jobs scale alike: only their lengths differ


def _counts(objective: str, *jobs: JobView, nodes: int = 6) -> dict[str, int]:
    c = Cluster(Policy(PolicyConfig(prior=SAME, objective=objective, profiling="never")), names("n", nodes))
    c.submit(*jobs)
    c.step(0.0)
    return {j: c.count(j) for j in c.jobs}


def test_completion_gives_the_nodes_to_the_job_that_finishes_sooner():
    short, long = JobView("short", 1, 8, order=0, work_left=1e4), JobView("long", 1, 8, order=1, work_left=1e7)
    work = _counts("work", short, long)
    done = _counts("completion", short, long)
    assert sum(work.values()) == sum(done.values()) == 6
    assert done["short"] > work["short"]  # the nodes go to the job that finishes sooner (shortest first)


def test_completion_is_work_while_jobs_wait():
    cfg = dict(prior=SAME, max_running=2, admission="fixed", profiling="never")
    jobs = (JobView("short", 1, 8, order=0, work_left=1e4), JobView("long", 1, 8, order=1, work_left=1e7),
            JobView("queued", 1, 8, order=2, work_left=1e4))
    counts = []
    for objective in ("work", "completion"):
        c = Cluster(Policy(PolicyConfig(objective=objective, **cfg)), names("n", 6))
        c.submit(*jobs)
        d = c.step(0.0)
        assert "queued" in d.waiting
        counts.append((c.count("short"), c.count("long")))
    assert counts[0] == counts[1]
