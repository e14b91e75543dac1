"""The store keeps the policy's beliefs once (issue L): in the saved policy state, which a restarted
daemon resumes from. The ``scalability`` table of schema version 1 is gone; a version-1 store is
migrated and its rows stay readable; what was measured when is in the event log."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from malletrain.daemon import POLICY_STATE_KEY, read_policy_states
from malletrain.daemon.jobspec import JobSpec, JobState
from malletrain.daemon.store import Store
from malletrain.daemon.store_schema import LEGACY_SCALING_TABLE, SCHEMA_VERSION
from policy import PolicyConfig
from tests.test_conformance import NODES, Harness

TRUE = {1: 100.0, 2: 190.0, 4: 340.0}  # what the job really trains at
BELIEVED = {1: 100.0, 2: 200.0, 4: 400.0}  # what its user said: linear


def _tables(store: Store) -> set[str]:
    return {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _learning(state_dir: Path) -> tuple[Harness, str]:
    h = Harness(state_dir, PolicyConfig(profiling="never"))
    h.cluster.became_idle(*NODES[:4])
    jid = h.submit("A", TRUE, user_curve=BELIEVED, max_nodes=4)
    for t in range(1, 40):
        h.step(float(t), decide=True)
        if h.daemon.policy.state.measured.get(jid):
            break
    return h, jid


def test_a_restart_resumes_the_learned_curves_from_the_one_record(tmp_path: Path) -> None:
    h, jid = _learning(tmp_path / "d")
    learned = dict(h.daemon.policy.state.measured.get(jid, {}))
    assert learned, "the daemon never refined the job's curve from its evidence"
    assert h.daemon.runs[jid].state in (JobState.RUNNING, JobState.RESCALING)
    store = h.daemon.store
    assert "scalability" not in _tables(store)  # one record of beliefs: the policy state
    text = store.get_meta(POLICY_STATE_KEY)
    assert text is not None
    saved = read_policy_states(text, "default")
    assert saved["default"].measured[jid] == learned
    assert store.scaling(jid) == dict(sorted(learned.items()))  # what was measured, from the events
    h.close()
    h2 = Harness(tmp_path / "d", PolicyConfig(profiling="never"), cluster=h.cluster, now=h.now + 1.0)
    try:
        pol = h2.daemon.policy
        assert pol.state.measured[jid] == learned  # resumed, not learned again
        h2.daemon.decide.feed_ledgers(h2.now)  # what the restarted daemon holds (a view feeds nothing)
        job = next(j for j in h2.daemon.decide.view(h2.now).jobs if j.id == jid)
        curve = pol.believed_curve(job)  # through the learned points, not the user's linear curve
        assert all(abs(curve[n] - rate) <= 1e-6 * rate for n, rate in learned.items()), (curve, learned)
        assert any(abs(curve[n] - BELIEVED[n]) > 1.0 for n in learned), (curve, learned)
    finally:
        h2.close()


def test_a_version_1_store_is_migrated_and_its_scalability_rows_stay_readable(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    s = Store.open(db)
    jid = s.submit(JobSpec("toy", ("true",), 1, 4))
    s.close()
    conn = sqlite3.connect(db)  # as a daemon of schema version 1 left it
    conn.executescript(
        "CREATE TABLE scalability (job TEXT NOT NULL, nodes INTEGER NOT NULL, rate REAL NOT NULL,"
        " time REAL NOT NULL, PRIMARY KEY (job, nodes));"
        "UPDATE meta SET value='1' WHERE key='schema_version';"
    )
    conn.executemany("INSERT INTO scalability VALUES (?, ?, ?, 0)", [(jid, 1, 10.0), (jid, 2, 18.0)])
    conn.commit()
    conn.close()
    s = Store.open(db)
    try:
        assert s.get_meta("schema_version") == str(SCHEMA_VERSION) == "2"
        assert "scalability" not in _tables(s) and LEGACY_SCALING_TABLE in _tables(s)
        assert s.scaling(jid) == {1: 10.0, 2: 18.0}
        s.log_event("refined", jid, points={"2": 19.0, "4": 30.0})  # a newer daemon measures again
        assert s.scaling(jid) == {1: 10.0, 2: 19.0, 4: 30.0}
        assert s.require(jid).spec.name == "toy"
    finally:
        s.close()
    again = Store.open(db)  # migrated once: opening again changes nothing
    try:
        assert again.scaling(jid) == {1: 10.0, 2: 19.0, 4: 30.0}
    finally:
        again.close()


def test_an_unknown_schema_version_names_the_file(tmp_path: Path) -> None:
    import pytest

    from malletrain.daemon.store import StoreError

    db = tmp_path / "store.db"
    Store.open(db).close()
    conn = sqlite3.connect(db)
    conn.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match=r"store\.db: schema version '3'"):
        Store.open(db)


def test_measured_points_come_from_the_policys_events_in_order(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "store.db")
    try:
        jid = s.submit(JobSpec("toy", ("true",), 1, 4))
        s.log_event("profile_done", jid, measured={"4": 40.0, "2": 21.0})
        s.log_event("refined", jid, points={"2": 22.0})
        s.log_event("refined", "j999999", points={"2": 1.0})  # another job's
        s.log_event("plan", jid, nodes=["n1"])  # not a measurement
        assert s.scaling(jid) == {2: 22.0, 4: 40.0}
        assert json.loads(json.dumps(s.scaling("j999999"))) == {"2": 1.0}
    finally:
        s.close()
