"""Adaptive admission, out of the box, holds no job back while nodes would stay idle: no cap on how
many jobs it admits (a cap only made jobs wait on a machine with nodes to spare)."""

from __future__ import annotations

from policy import Policy, PolicyConfig
from test_policy import Cluster, jv, names


def test_the_default_admits_every_job_the_idle_nodes_can_take_however_many():
    c = Cluster(Policy(PolicyConfig(profiling="never")), names("n", 150))
    c.submit(*(jv(f"j{k}", 1, 1, order=k) for k in range(120)))
    d = c.step(0.0)
    assert len(d.admitted) == 120 and not d.waiting
    assert all(c.count(f"j{k}") == 1 for k in range(120))


def test_with_fewer_nodes_than_jobs_the_default_admits_what_the_nodes_take_and_the_rest_wait_fcfs():
    c = Cluster(Policy(PolicyConfig(profiling="never")), names("n", 130))
    c.submit(*(jv(f"j{k}", 1, 1, order=k) for k in range(140)))
    d = c.step(0.0)
    assert d.admitted == tuple(f"j{k}" for k in range(130))
    assert sorted(d.waiting) == sorted(f"j{k}" for k in range(130, 140))
