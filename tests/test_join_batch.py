"""Nodes that come back together join in one rescale, but a ready worker does not wait long for a slow
one: past ``JOIN_BATCH_S`` the ready ones join and the rest follow (the daemon on fakes, the test's clock)."""

from __future__ import annotations

from pathlib import Path

from malletrain.daemon.records import JOIN_BATCH_S
from policy import PolicyConfig
from tests.test_conformance import LINEAR, NODES, Harness


def test_ready_workers_wait_briefly_for_the_others_then_join_without_them(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(max_running=1, profiling="never", admission="fixed"))
    ready: set[str] = set()
    h.runtime.ready = lambda job, worker: worker in ready  # type: ignore[method-assign]
    try:
        h.cluster.became_idle(*NODES[:3])
        jid = h.submit("j", LINEAR, max_nodes=3)
        h.run_until(2.0, dt=0.1)
        run = h.daemon.runs[jid]
        assert sorted(run.target) == sorted(NODES[:3]) and run.members == []  # nobody ready: nothing published
        first, second, third = (run.workers[n] for n in NODES[:3])
        ready |= {first, second}
        h.step(h.now + 0.1)
        assert run.members == []  # two of three ready: they wait for the third ...
        h.step(h.now + JOIN_BATCH_S / 2)
        assert run.members == []
        h.step(h.now + JOIN_BATCH_S)  # ... but not longer than JOIN_BATCH_S
        assert run.members == list(NODES[:2]) and h.runtime.members[jid] == [first, second]
        ready.add(third)
        h.step(h.now + 0.1)  # the last one joins the running world
        assert run.members == list(NODES[:3]) and h.runtime.members[jid] == [first, second, third]
        assert h.runtime.generation[jid] == 2
    finally:
        h.close()


def test_workers_ready_together_join_in_one_rescale(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(max_running=1, profiling="never", admission="fixed"))
    ready: set[str] = set()
    h.runtime.ready = lambda job, worker: worker in ready  # type: ignore[method-assign]
    try:
        h.cluster.became_idle(*NODES[:3])
        jid = h.submit("j", LINEAR, max_nodes=3)
        h.run_until(2.0, dt=0.1)
        run = h.daemon.runs[jid]
        ready |= set(run.workers.values())
        h.step(h.now + 0.1)
        assert sorted(run.members) == sorted(NODES[:3]) and h.runtime.generation[jid] == 1
    finally:
        h.close()
