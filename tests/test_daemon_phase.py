"""A job's phase is one enum (:class:`JobPhase`) with one transition table (:data:`JOB_PHASES`): the
states the store keeps, and the two only a running daemon knows (ADOPTED, ENDING). It changes only
by :meth:`JobRun.move`, which refuses a move the table does not allow and names it; the store keeps
what it always kept, so a state folder written before loads as it did."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from malletrain.daemon import JobRun
from malletrain.daemon.jobspec import JOB_TRANSITIONS, JobSpec, JobState
from malletrain.daemon.records import JOB_PHASES, JobPhase, PhaseError
from policy import PolicyConfig
from tests.test_conformance import LINEAR, Harness, _crash

ENDS = {JobPhase.COMPLETED, JobPhase.FAILED, JobPhase.CANCELLED}


def test_the_table_covers_every_phase_and_the_stores_table_is_its_stored_part() -> None:
    assert set(JOB_PHASES) == set(JobPhase)
    for phase, targets in JOB_PHASES.items():
        assert targets <= set(JobPhase) and phase not in targets
        if phase in ENDS:
            assert not targets, phase  # an ended job never moves
        else:
            assert ENDS <= targets, phase  # every live phase can end
    assert JOB_PHASES[JobPhase.ENDING] == ENDS  # an end asked is carried out, never taken back
    assert all({JobPhase.PENDING, JobPhase.ADOPTED}.isdisjoint(t) for t in JOB_PHASES.values())  # only starts
    assert {p for p in JobPhase if p.stored is None} == {JobPhase.ADOPTED, JobPhase.ENDING}
    assert set(JOB_TRANSITIONS) == set(JobState)
    assert all(JOB_TRANSITIONS[s] == {t for t in JobState if JobPhase(t.value) in JOB_PHASES[JobPhase(s.value)]}
               for s in JobState)


def test_an_illegal_move_is_refused_naming_it_and_the_stored_state_moves_with_the_phase() -> None:
    run = JobRun("j000001", JobSpec("j", ("true",), 1, 2), JobState.PENDING)
    assert run.phase is JobPhase.PENDING
    assert run.move(JobPhase.RUNNING) and run.state is JobState.RUNNING
    assert not run.move(JobPhase.RUNNING)  # staying put is no move
    with pytest.raises(PhaseError, match="job j000001: no move from running to pending"):
        run.move(JobPhase.PENDING)
    assert run.end(JobState.CANCELLED, "cancelled by user")
    assert (run.phase, run.state, run.ending) == (JobPhase.ENDING, JobState.RUNNING,
                                                   (JobState.CANCELLED, "cancelled by user"))
    assert not run.end(JobState.FAILED, "later")  # the first reason wins
    with pytest.raises(PhaseError, match="no move from ending to suspended"):
        run.move(JobPhase.SUSPENDED)
    assert run.move(JobPhase.CANCELLED) and run.state is JobState.CANCELLED
    with pytest.raises(PhaseError, match="no move from cancelled to running"):
        run.move(JobPhase.RUNNING)
    assert not run.end(JobState.FAILED, "after its end")
    adopted = JobRun("j000002", JobSpec("j", ("true",), 1, 2), JobState.RESCALING, adopted=True)
    assert (adopted.phase, adopted.state) == (JobPhase.ADOPTED, JobState.RESCALING)


def _crashed_with_a_running_job(tmp_path: Path) -> tuple[Harness, str, list[str]]:
    h = Harness(tmp_path / "d", PolicyConfig(), agent_dead_after=30.0)
    h.cluster.became_idle("n01", "n02")
    jid = h.submit("A", LINEAR, max_nodes=2)
    h.run_until(3.0)
    nodes = list(h.daemon.runs[jid].members)
    _crash(h)
    return h, jid, nodes


def test_a_state_folder_written_before_loads_its_running_job_as_adopted_then_running(tmp_path: Path) -> None:
    """The store keeps a job's state as it always did (the JobState's name, its nodes): a running job's
    row loads ADOPTED, stored RUNNING, on the nodes the row names, and runs on when its workers are back."""
    h, jid, nodes = _crashed_with_a_running_job(tmp_path)
    with sqlite3.connect(tmp_path / "d" / "store.db") as db:  # the row, as the store has always written it
        assert db.execute("SELECT state, nodes FROM jobs WHERE id=?", (jid,)).fetchone() == (
            "running", '["' + '", "'.join(nodes) + '"]')
    h2 = Harness(tmp_path / "d", PolicyConfig(), cluster=h.cluster, now=4.0, agent_dead_after=30.0)
    try:
        run = h2.daemon.runs[jid]
        assert (run.phase, run.state, run.left_on) == (JobPhase.ADOPTED, JobState.RUNNING, tuple(nodes))
        h.cluster.reconnect_agents()
        h2.run_until(6.0)
        assert (run.phase, run.state, run.left_on) == (JobPhase.RUNNING, JobState.RUNNING, None)
        assert {s for s, _, _ in h2.daemon.store.history(jid)} <= {s.value for s in JobState}  # never a daemon's own
    finally:
        h2.close()


def test_a_job_cancelled_while_its_adoption_is_open_is_taken_over_then_ended(tmp_path: Path) -> None:
    """ADOPTED, then ENDING (a cancel while the window is open): the window's end still hands its workers
    to the runtime, and act ends it."""
    h, jid, _ = _crashed_with_a_running_job(tmp_path)
    h2 = Harness(tmp_path / "d", PolicyConfig(), cluster=h.cluster, now=4.0, agent_dead_after=30.0)
    try:
        taken: list[str] = []
        h2.runtime.readopt = lambda job, command, workers: taken.append(job)  # type: ignore[method-assign]
        h2.daemon.store.request_cancel(jid)
        h2.step(4.5)
        run = h2.daemon.runs[jid]
        assert (run.phase, run.state) == (JobPhase.ENDING, JobState.RUNNING) and not taken  # the window is open
        h.cluster.reconnect_agents()
        h2.run_until(6.0)
        assert taken == [jid] and h2.daemon.store.require(jid).state is JobState.CANCELLED
        assert jid not in h2.daemon.runs or h2.daemon.runs[jid].phase is JobPhase.CANCELLED
    finally:
        h2.close()
