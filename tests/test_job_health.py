"""A job that hangs or crashes is named quickly, and every queued job says why it waits.

The rules (:mod:`policy.health`) as pure functions, then the daemon on fakes with the test's clock:
a silent job is shown as stalled with how long, restarted at twice its bound and failed after its
restarts; a worker that fails twice before a first step fails the job at once; a queued job whose
workers start says so; RATE/S is blank while a job restarts; a job asking for more workers a node
than the machine's nodes have is refused at submit, naming the node shape.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from malletrain.daemon.control import Caller, Submit
from malletrain.daemon.jobspec import JobSpecError, JobState
from malletrain.cli.status_view import format_jobs, job_note
from policy import PolicyConfig
from policy.health import (
    Stall, StallRule, failed_for_good, pending_reason, rate_is_current, reports_progress, silent_for,
    stall_verdict,
)
from scavenger.hub import WorkerExitedEvent
from tests.test_conformance import LINEAR, NODES, Harness

RULE = StallRule(after_s=100.0, restarts=1)


# ---------------------------------------------------------------- the rules, pure
def test_silence_counts_from_the_later_of_the_workers_start_and_the_last_progress() -> None:
    assert silent_for(500.0, None, None) == 0.0  # no worker: not silent
    assert silent_for(500.0, 100.0, None) == 400.0
    assert silent_for(500.0, 100.0, 450.0) == 50.0
    assert silent_for(500.0, 480.0, 450.0) == 20.0  # restarted after its last progress


def test_a_silent_job_is_stalled_then_restarted_then_failed() -> None:
    assert stall_verdict(99.0, RULE, 0) is Stall.NONE
    assert stall_verdict(100.0, RULE, 0) is Stall.STALLED
    assert stall_verdict(199.0, RULE, 0) is Stall.STALLED
    assert stall_verdict(200.0, RULE, 0) is Stall.RESTART
    assert stall_verdict(200.0, RULE, 1) is Stall.FAIL  # its one restart is used
    assert stall_verdict(5000.0, RULE, 0, reports=False) is Stall.NONE  # cannot report: its silence says nothing
    assert not reports_progress(True, None, False) and reports_progress(True, None, True)
    assert reports_progress(True, 32, False) and reports_progress(False, None, False)
    with pytest.raises(ValueError, match="after_s > 0"):
        StallRule(0.0, 1)


def test_two_failures_before_a_first_step_fail_a_job_at_once() -> None:
    assert failed_for_good(1, 1, 5) is None
    assert failed_for_good(2, 2, 5) == "failed 2 times in a row before its first step"
    assert failed_for_good(2, 1, 5) is None  # the first one came after a step
    assert failed_for_good(5, 0, 5) == "5 workers failed without progress"


def test_every_queued_job_has_a_reason() -> None:
    assert pending_reason("behind j000001 in the FCFS queue", 2, 0, True, False) == "behind j000001 in the FCFS queue"
    assert pending_reason("", 3, 1, True, False) == "starting: workers importing (1 of 3 ready)"
    assert pending_reason("", 0, 0, True, True).startswith("the daemon waits for the last daemon's agents")
    assert pending_reason("", 0, 0, True, False).startswith("submitted")
    assert pending_reason("", 0, 0, False, False).startswith("submitted")


def test_a_rate_is_shown_only_for_the_world_a_job_runs_in() -> None:
    assert rate_is_current(True, False, 4, 4)
    assert not rate_is_current(True, False, 3, 4)  # its new world has not reported yet (a restart)
    assert not rate_is_current(False, False, 4, 4)  # rescaling, suspended, queued
    assert not rate_is_current(True, True, 4, 4)  # stalled


# ---------------------------------------------------------------- the daemon, on fakes
def _status(h: Harness, jid: str) -> dict:
    return next(d for d in h.daemon.api.status_jobs() if d["id"] == jid)


def test_a_silent_job_is_shown_stalled_then_restarted_then_failed(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"), stall_after=10.0, stall_restarts=1)
    try:
        h.cluster.became_idle(*NODES[:1])
        jid = h.submit("hangs", LINEAR, max_nodes=1)  # the fake reports nothing before it is done
        h.run_until(5.0)
        run = h.daemon.runs[jid]
        assert run.members and not run.stalled and "stalled" not in _status(h, jid)
        first = run.workers[NODES[0]]
        h.run_until(14.0)
        st = _status(h, jid)
        assert st["state"] == "running" and st["stalled"].startswith("stalled: no progress for 1")
        assert 10.0 <= st["stalled_s"] <= 14.0  # --json: the seconds too
        assert "is restarted from its checkpoint at 20 s" in st["stalled"]
        assert job_note(st) == st["stalled"] and "stalled" in format_jobs([st])
        h.run_until(24.0)
        assert [e["job"] for e in h.events("stall_restart")] == [jid]
        assert (NODES[0], first) in h.cluster.stopped and run.workers[NODES[0]] != first  # a new worker
        assert h.daemon.store.require(jid).state is not JobState.FAILED
        h.run_until(60.0)
        rec = h.daemon.store.require(jid)
        assert rec.state is JobState.FAILED and rec.message.startswith("stalled: no progress for"), rec.message
        assert len(h.events("stall_restart")) == 1
    finally:
        h.close()


def test_a_job_file_sets_its_own_stall_bound(tmp_path: Path) -> None:
    from malletrain.daemon.jobspec import parse_spec

    spec = parse_spec({"command": ["true"], "stall_after": 30}, "job.toml")
    assert spec.stall_after == 30 and parse_spec({"command": ["true"]}).stall_after is None
    with pytest.raises(JobSpecError, match="job.toml: stall_after must be an integer >= 1"):
        parse_spec({"command": ["true"], "stall_after": 0}, "job.toml")
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"), stall_after=1000.0)
    try:
        h.cluster.became_idle(*NODES[:1])
        jid = h.daemon.store.submit(spec)
        h.monitor.curves[jid] = dict(LINEAR)
        h.run_until(40.0)
        assert h.daemon.runs[jid].stalled.startswith("stalled: no progress for")  # 30 s, not 1000 s
    finally:
        h.close()


def _fail_worker(h: Harness, jid: str, node: str, t: float) -> None:
    wid = h.daemon.runs[jid].workers[node]
    h.cluster.workers[node].discard(wid)
    h.cluster.hub_events.append(WorkerExitedEvent(node, wid, 3))
    h.step(t)


def test_a_script_that_fails_twice_before_its_first_step_fails_at_once(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"), max_failures=5)
    try:
        h.cluster.became_idle(*NODES[:2])
        jid = h.submit("crashes", LINEAR, max_nodes=1)
        h.run_until(3.0)
        node = h.daemon.runs[jid].members[0]
        _fail_worker(h, jid, node, 4.0)
        assert h.daemon.store.require(jid).state is not JobState.FAILED  # once may be bad luck
        h.run_until(8.0)
        node = next(iter(h.daemon.runs[jid].workers))
        _fail_worker(h, jid, node, 9.0)
        h.step(10.0)
        rec = h.daemon.store.require(jid)
        assert rec.state is JobState.FAILED, rec.state
        assert rec.message.startswith("failed 2 times in a row before its first step; last ") and "exit 3" in rec.message
        assert [e["before_first_step"] for e in h.events("worker_failed")] == [True, True]
    finally:
        h.close()


def test_a_queued_job_whose_workers_start_says_so(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    h.runtime.ready = lambda job_id, worker_id: False  # type: ignore[method-assign]  # still importing
    try:
        h.cluster.became_idle(*NODES[:2])
        jid = h.submit("slow-import", LINEAR, max_nodes=2)
        second = h.submit("queued", LINEAR, min_nodes=3, max_nodes=3)
        h.run_until(3.0)
        st = _status(h, jid)
        assert st["state"] == "pending" and st["waiting"] == "starting: workers importing (0 of 2 ready)"
        assert job_note(st) == "waiting: starting: workers importing (0 of 2 ready)"
        assert _status(h, second)["waiting"]  # the policy's reason
        third = h.daemon.store.submit(h.daemon.runs[jid].spec)  # in the store, not read by the daemon yet
        assert _status(h, third)["waiting"].startswith("submitted")
    finally:
        h.close()


def test_rate_is_blank_while_a_job_restarts(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    try:
        h.cluster.became_idle(*NODES[:1])
        jid = h.submit("runs", LINEAR, max_nodes=1)
        h.run_until(30.0, dt=0.5)
        assert _status(h, jid).get("rate")  # running in its world: a rate
        stats = h.monitor.jobs[jid]
        stats.worlds = {stats.generation + 1: 1}  # a newer world published, none of its reports yet
        assert _status(h, jid).get("rate") is None
        assert format_jobs([_status(h, jid)]).splitlines()[1].split()[8] == "-"
    finally:
        h.close()


def test_more_workers_per_node_than_the_nodes_have_is_refused_at_submit(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    try:
        h.step(0.0)
        spec = {"name": "wide", "command": ["true"], "workers_per_node": 4}
        with pytest.raises(JobSpecError, match=r"workers_per_node 4 is more than this machine's nodes have: "
                                               r"1 worker slot a node \("):
            h.daemon.api.handle(Submit(spec, 0, 0), Caller(0, 0, True))
        ok = h.daemon.api.handle(Submit({**spec, "workers_per_node": 1}, 0, 0), Caller(0, 0, True))
        assert ok["ok"]
    finally:
        h.close()


def test_a_new_state_dir_is_made_private_without_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    h = Harness(tmp_path / "new" / "state", PolicyConfig(profiling="never"))
    h.close()
    assert not (tmp_path / "new" / "state").stat().st_mode & 0o066  # 0700 (0711 for a root daemon)
    assert not [r for r in caplog.records if "open to other users" in r.getMessage()]
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    h = Harness(open_dir, PolicyConfig(profiling="never"))  # one really open: tightened, and said
    h.close()
    assert [r for r in caplog.records if "open to other users (mode 755)" in r.getMessage()]


def test_an_ended_jobs_runtime_state_goes_once_its_workers_have_left(tmp_path: Path) -> None:
    """A cancelled worker writes its checkpoint on the SIGTERM: the runtime must still know the job then,
    or it refuses the write with a warning in the daemon's log and the worker's."""
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    forgotten: list[tuple[str, bool, bool]] = []
    real = h.runtime.forget

    def forget(job_id: str, keep_state: bool = True) -> None:
        run = h.daemon.runs.get(job_id)
        forgotten.append((job_id, keep_state, bool(run is not None and run.leaving)))
        real(job_id, keep_state)

    h.runtime.forget = forget  # type: ignore[method-assign]
    try:
        h.cluster.became_idle(*NODES[:1])
        jid = h.submit("runs", LINEAR, max_nodes=1)
        h.run_until(5.0)
        h.daemon.store.request_cancel(jid)
        h.run_until(8.0)
        assert h.daemon.store.require(jid).state is JobState.CANCELLED
        ended = [f for f in forgotten if not f[1]]
        assert ended and not any(leaving for _, _, leaving in ended)  # never while its worker was leaving
    finally:
        h.close()


def test_the_node_shape_is_checked_at_submit_when_no_daemon_runs(tmp_path: Path) -> None:
    """The daemon records its nodes' shape in the store: a submit straight into the store (no daemon
    running) is checked against it too."""
    from malletrain.daemon.jobspec import NODE_SLOTS_KEY, node_slots, parse_spec
    from malletrain.daemon.store import Store

    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    h.step(0.0)
    h.close()
    store = Store.open(tmp_path / "d" / "store.db")
    try:
        assert node_slots(store.get_meta(NODE_SLOTS_KEY)) == (1, "1 worker slot a node (no GPUs reported and no "
                                                                "[scavenger] workers_per_node: 1)")
        with pytest.raises(JobSpecError, match="workers_per_node 2 is more than this machine's nodes have: 1 "):
            store.submit(parse_spec({"command": ["true"], "workers_per_node": 2}))
    finally:
        store.close()
