"""Nodes that come back together join a running world in one rescale, but a ready worker does not wait
long for a slow one: past ``JOIN_BATCH_S`` the ready ones join and the rest follow. A job's first world
still waits for all its workers (the daemon on fakes, the test's clock)."""

from __future__ import annotations

from pathlib import Path

from malletrain.daemon.records import JOIN_BATCH_S
from policy import PolicyConfig
from tests.test_conformance import LINEAR, NODES, Harness


def _harness(tmp_path: Path, ready: set[str]) -> Harness:
    h = Harness(tmp_path / "d", PolicyConfig(max_running=1, profiling="never", admission="fixed"))
    h.runtime.ready = lambda job, worker: worker in ready  # type: ignore[method-assign]
    return h


def test_ready_workers_wait_briefly_for_the_others_then_join_the_running_world(tmp_path: Path) -> None:
    ready: set[str] = set()
    h = _harness(tmp_path, ready)
    try:
        h.cluster.became_idle(NODES[0])
        jid = h.submit("j", LINEAR, max_nodes=3)
        h.run_until(2.0, dt=0.1)
        run = h.daemon.runs[jid]
        ready.add(run.workers[NODES[0]])
        h.run_until(3.0, dt=0.1)
        assert run.members == [NODES[0]]  # the job runs on one node
        h.cluster.became_idle(*NODES[1:3])  # two nodes come back
        h.run_until(6.0, dt=0.1)
        assert sorted(h.daemon.decide.nodes_of(jid)) == sorted(NODES[:3]) and run.members == [NODES[0]]
        second, third = run.workers[NODES[1]], run.workers[NODES[2]]
        ready.add(second)
        h.step(h.now + 0.1)
        assert run.members == [NODES[0]]  # one of the two is ready: it waits for the other ...
        h.step(h.now + JOIN_BATCH_S / 2)
        assert run.members == [NODES[0]]
        h.step(h.now + JOIN_BATCH_S)  # ... but not longer than JOIN_BATCH_S
        assert run.members == list(NODES[:2]) and h.runtime.members[jid][1] == second
        ready.add(third)
        h.step(h.now + 0.1)  # the last one joins the running world
        assert run.members == list(NODES[:3]) and h.runtime.members[jid][2] == third
    finally:
        h.close()


def test_a_jobs_first_world_waits_for_all_its_workers(tmp_path: Path) -> None:
    ready: set[str] = set()
    h = _harness(tmp_path, ready)
    try:
        h.cluster.became_idle(*NODES[:3])
        jid = h.submit("j", LINEAR, max_nodes=3)
        h.run_until(2.0, dt=0.1)
        run = h.daemon.runs[jid]
        ready.update(run.workers[n] for n in NODES[:2])
        h.run_until(2.0 + 4 * JOIN_BATCH_S, dt=0.1)
        assert run.members == []  # two of three ready: no world of two first
        ready.add(run.workers[NODES[2]])
        h.step(h.now + 0.1)
        assert sorted(run.members) == sorted(NODES[:3]) and h.runtime.generation[jid] == 1
    finally:
        h.close()
