"""A queued job says why it waits, from the first decision after it was submitted: no nodes held,
fewer than its min_nodes, its min_nodes not free beside other jobs, or the admission rules; in
``status --json`` (``waiting``) and in ``malletrain status``'s lines under the table."""

from __future__ import annotations

from pathlib import Path

from malletrain.daemon.jobspec import JobState
from malletrain.cli.status_view import format_details, job_note
from policy import PolicyConfig
from tests.test_conformance import LINEAR, NODES, Harness


def _status(h: Harness, jid: str) -> dict:
    return next(d for d in h.daemon.api.status_jobs() if d["id"] == jid)


def test_a_job_with_no_nodes_held_says_so_at_the_first_decision(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    try:
        jid = h.submit("j", LINEAR, max_nodes=2)
        assert h.step(0.0) is not None  # the first decision after the submit
        assert _status(h, jid)["state"] == "pending"
        assert _status(h, jid).get("waiting", "").startswith("no nodes")
    finally:
        h.close()


def test_a_job_whose_min_nodes_are_not_held_says_how_many_are(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    try:
        h.cluster.became_idle(*NODES[:2])
        jid = h.submit("big", LINEAR, min_nodes=3, max_nodes=4)
        h.run_until(5.0)
        assert h.daemon.store.require(jid).state is JobState.PENDING
        assert _status(h, jid).get("waiting") == "min_nodes 3: only 2 nodes held"
    finally:
        h.close()


def test_a_job_whose_min_nodes_run_other_jobs_says_so(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    try:
        h.cluster.became_idle(*NODES[:3])
        first = h.submit("first", LINEAR, min_nodes=2, max_nodes=2)
        h.run_until(3.0)
        second = h.submit("second", LINEAR, min_nodes=2, max_nodes=2)
        h.run_until(6.0)
        assert h.daemon.store.require(second).state is JobState.PENDING and len(h.daemon.runs[first].members) == 2
        assert _status(h, second).get("waiting") == "min_nodes 2: 1 of 3 held nodes free, the rest run other jobs"
    finally:
        h.close()


def test_status_prints_why_a_queued_job_waits() -> None:
    pending = {"id": "j000002", "state": "pending", "message": "", "waiting": "min_nodes 3: only 2 nodes held",
               "logs": []}
    pending["note"] = job_note(pending)
    assert pending["note"] == "waiting: min_nodes 3: only 2 nodes held"
    text = format_details([pending], "/state/logs")
    assert "j000002 pending: waiting: min_nodes 3: only 2 nodes held" in text
    assert "log: none" not in text  # a queued job has run nowhere yet
    suspended = {"state": "suspended", "message": "below min_nodes", "waiting": "no nodes: none is idle"}
    assert job_note(suspended) == "below min_nodes; waiting: no nodes: none is idle"
