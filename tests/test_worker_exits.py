"""How the daemon reads a worker's exit, on fakes with the test's clock.

A worker killed by a signal (a recall, a stop, a ``kill -9``) is replaced, never counted toward
``max_failures``; a crash of the job's own code is. A member whose worker changed is published
again, whatever the job's size (the lone worker of a one-node job too).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from malletrain.daemon import stopped_from_outside
from malletrain.daemon.jobspec import JobState
from policy import PolicyConfig
from tests.test_conformance import LINEAR, Harness


def _one_node_job(tmp_path: Path, **cfg: object) -> tuple[Harness, str, str]:
    h = Harness(tmp_path / "d", PolicyConfig(), **cfg)
    h.cluster.became_idle("n01")
    jid = h.submit("A", LINEAR, max_nodes=1)
    h.run_until(3.0)
    run = h.daemon.runs[jid]
    assert run.members == ["n01"] and h.runtime.members[jid] == [run.workers["n01"]]
    return h, jid, run.workers["n01"]


def test_the_lone_worker_of_a_one_node_job_is_replaced_and_published(tmp_path: Path) -> None:
    """Before: the node stayed in the published list, so the replacement waited forever for a list with it."""
    h, jid, first = _one_node_job(tmp_path)
    try:
        gen = h.runtime.generation[jid]
        h.cluster.exit_worker("n01", first, -9, stopped=True)  # killed by its agent; the node is still ours
        h.run_until(6.0)
        second = h.daemon.runs[jid].workers["n01"]
        assert second != first and ("n01", second) in h.cluster.started
        assert h.runtime.members[jid] == [second] and h.runtime.generation[jid] > gen
        assert h.daemon.runs[jid].state is JobState.RUNNING
    finally:
        h.close()


def test_a_dead_member_of_a_larger_job_is_replaced(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig())
    try:
        h.cluster.became_idle("n01", "n02")
        jid = h.submit("A", LINEAR, max_nodes=2)
        h.run_until(3.0)
        run = h.daemon.runs[jid]
        assert sorted(run.members) == ["n01", "n02"]
        dead = run.workers["n02"]
        h.cluster.exit_worker("n02", dead, 137)
        h.run_until(6.0)
        assert dead not in h.runtime.members[jid] and run.workers["n02"] in h.runtime.members[jid]
        assert len(h.runtime.members[jid]) == 2
    finally:
        h.close()


def test_a_failed_worker_gives_its_node_up_in_the_ledger_and_a_job_at_its_min_is_stopped(tmp_path: Path) -> None:
    """The daemon keeps no plan of its own: a crash takes the node from the job in its trainer's ledger
    (the node stays ours), and a job that falls below its min there is stopped by the ledger, so the
    policy sees it stopped (preempted) and places it again; act follows the ledger."""
    h = Harness(tmp_path / "d", PolicyConfig())
    try:
        h.cluster.became_idle("n01", "n02")
        jid = h.submit("A", LINEAR, min_nodes=2, max_nodes=2)
        h.run_until(3.0)
        run = h.daemon.runs[jid]
        ledger = next(iter(h.daemon.trainers.values())).ledger
        assert sorted(run.members) == ["n01", "n02"] and sorted(ledger.nodes_of(jid)) == ["n01", "n02"]
        dead = run.workers["n02"]
        h.cluster.exit_worker("n02", dead, 1)  # the job's own code failed there
        h.step(4.0)
        assert run.failures == 1 and [e["code"] for e in h.events("worker_failed")] == [1]
        assert ledger.job(jid).last_interrupted == 4.0 and ledger.idle_since("n02") is not None
        assert [e["job"] for e in h.events("preempted")] == [jid]  # the policy saw it stopped
        h.run_until(8.0)
        assert sorted(h.daemon.decide.nodes_of(jid)) == ["n01", "n02"] and sorted(run.members) == ["n01", "n02"]
        assert run.workers["n02"] != dead and run.state is JobState.RUNNING
    finally:
        h.close()


def test_recalls_and_stops_are_never_failures(tmp_path: Path) -> None:
    """Before: every recalled worker was a ``worker_failed``; a job recalled often enough was FAILED."""
    h, jid, worker = _one_node_job(tmp_path, max_failures=2)
    try:
        t = 3.0
        for code in (143, -15, -9, 137, 75):  # SIGTERM'd (handled or not), SIGKILLed, store lost
            h.cluster.exit_worker("n01", worker, code, stopped=True)  # by its agent (a stop, a recall)
            t += 3.0
            h.run_until(t)
            worker = h.daemon.runs[jid].workers["n01"]
        assert h.daemon.runs[jid].failures == 0 and not h.events("worker_failed")
        assert len(h.events("worker_stopped")) == 5
        assert h.daemon.runs[jid].state is JobState.RUNNING
        h.cluster.exit_worker("n01", worker, 1)  # the job's own code fails: that counts
        h.run_until(t + 3.0)
        assert [e["code"] for e in h.events("worker_failed")] == [1]
    finally:
        h.close()


@pytest.mark.parametrize("code", [143, 137, 130, 129, 75, -15])
def test_a_stop_code_the_job_returns_by_itself_is_a_failure(tmp_path: Path, code: int) -> None:
    """A stop we caused is known by us (its agent stopped the worker), not read from the exit code.
    Before: a job exiting 143 by itself was taken for a stop: restarted forever (272 starts in 40 s),
    never FAILED, and its event rows could rotate out what a restarted daemon reads."""
    h, jid, worker = _one_node_job(tmp_path, max_failures=3)
    try:
        t = 3.0
        for _ in range(3):
            h.cluster.exit_worker("n01", worker, code)  # the job's own code exits so; nobody stopped it
            t += 3.0
            h.run_until(t)
            worker = h.daemon.runs[jid].workers.get("n01", worker) if jid in h.daemon.runs else worker
        # counted as failures: the job never trained a step, so its second one in a row ends it
        assert len(h.events("worker_failed")) == 2 and not h.events("worker_stopped")
        assert h.daemon.store.get(jid).state is JobState.FAILED
    finally:
        h.close()


def test_exit_75_of_a_worker_an_earlier_daemon_started_is_the_store_lost_not_a_failure() -> None:
    from malletrain.daemon import stopped_by_us

    assert stopped_by_us(75, agent_stopped=False, inherited=True)
    assert not stopped_by_us(75, agent_stopped=False, inherited=False)
    assert not stopped_by_us(143, agent_stopped=False, inherited=True)
    assert stopped_by_us(143, agent_stopped=True, inherited=False)
    assert not stopped_by_us(1, agent_stopped=True, inherited=False)


@pytest.mark.parametrize("code,stopped", [(143, True), (-15, True), (-9, True), (137, True), (130, True),
                                          (75, True), (1, False), (-11, False), (134, False), (2, False)])
def test_which_exits_are_stops(code: int, stopped: bool) -> None:
    assert stopped_from_outside(code) is stopped


def test_a_restarted_daemon_takes_its_workers_back_as_soon_as_every_agent_is_back(tmp_path: Path) -> None:
    """Before: after a kill -9 the new daemon waited the whole ``agent_dead_after`` (here 30 s) before
    anything moved, although every agent said hello at once."""
    from tests.test_conformance import _crash

    h = Harness(tmp_path / "d", PolicyConfig(), agent_dead_after=30.0)
    h.cluster.became_idle("n01", "n02")
    jid = h.submit("A", LINEAR, max_nodes=2)
    h.run_until(3.0)
    workers = sorted(h.daemon.runs[jid].workers.values())
    assert sorted(h.runtime.members[jid]) == workers
    _crash(h)
    h2 = Harness(tmp_path / "d", PolicyConfig(), cluster=h.cluster, now=4.0, agent_dead_after=30.0)
    try:
        h.cluster.reconnect_agents()
        h2.run_until(6.0)
        assert sorted(h2.runtime.members.get(jid, [])) == workers  # the same workers, republished
        assert h2.daemon.runs[jid].state is JobState.RUNNING
        assert not [n for n, w in h.cluster.started if w not in workers]  # none started afresh
    finally:
        h2.close()
