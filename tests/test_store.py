"""The SQLite job store: submit, states, restart recovery, concurrent writers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from malletrain.daemon.jobspec import JobSpec, JobSpecError, JobState, load_spec, parse_spec
from malletrain.daemon.store import Store, StoreError

SPEC = JobSpec("toy", ("python", "-c", "pass"), 1, 3, True, {1: 10.0, 2: 19.0}, 1000)


def test_submit_and_reopen_keeps_everything(tmp_path: Path) -> None:
    db = tmp_path / "s" / "store.db"
    s = Store.open(db)
    a = s.submit(SPEC)
    b = s.submit(JobSpec("other", ("true",)))
    assert (a, b) == ("j000001", "j000002")
    s.set_state(a, JobState.RUNNING, "placed")
    s.set_nodes(a, ["node00", "node01"])
    s.set_samples(a, 500)
    s.set_samples(a, 400)  # progress never goes back
    s.log_event("refined", a, points={"2": 19.5})  # the policy's event names what was measured
    s.record_rescale(a, 1, 2, 0.4, "up")
    s.close()
    s2 = Store.open(db)
    rec = s2.require(a)
    assert rec.spec == SPEC and rec.state is JobState.RUNNING
    assert rec.nodes == ("node00", "node01") and rec.samples == 500
    assert s2.scaling(a) == {2: 19.5}
    assert s2.rescales(a)[0]["pause_s"] == pytest.approx(0.4)
    assert [s for s, _, _ in s2.history(a)] == ["pending", "running"]
    assert s2.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert [e["kind"] for e in s2.events()] == ["submit", "submit", "state", "refined"]


def test_states_terminal_and_cancel(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "db")
    a = s.submit(SPEC)
    assert s.request_cancel(a) is JobState.CANCELLED
    with pytest.raises(StoreError, match=f"job {a} is cancelled"):
        s.set_state(a, JobState.RUNNING)
    b = s.submit(SPEC)
    s.set_state(b, JobState.RUNNING)
    s.set_nodes(b, ["node00"])
    assert s.request_cancel(b) is JobState.RUNNING
    assert s.require(b).cancel_requested
    s.set_state(b, JobState.SUSPENDED, "recalled")
    assert s.require(b).nodes == ()  # a job that does not run holds no nodes
    with pytest.raises(StoreError, match="no job 'j999999'"):
        s.set_state("j999999", JobState.RUNNING)


def test_concurrent_submitters_get_distinct_ids(tmp_path: Path) -> None:
    db = tmp_path / "db"
    Store.open(db).close()
    code = (
        "import sys; from malletrain.daemon.store import Store; from malletrain.daemon.jobspec import JobSpec;"
        "s = Store.open(sys.argv[1]);"
        "[s.submit(JobSpec('x', ('true',))) for _ in range(25)]"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(db)]) for _ in range(3)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    ids = [r.id for r in Store.open(db).jobs()]
    assert len(ids) == 75 and len(set(ids)) == 75


def test_job_file_errors_name_the_file_and_field(tmp_path: Path) -> None:
    f = tmp_path / "job.toml"
    f.write_text('name = "a"\ncommand = ["python", "t.py"]\nmin_nodes = 2\nmax_nodes = 4\nscaling = { 1 = 5.0, 2 = 9.5 }\n')
    spec = load_spec(f)
    assert spec.scaling == {1: 5.0, 2: 9.5} and spec.cwd == str(tmp_path.resolve())
    bad = {
        'command = "python t.py"': "command must be a list",
        'command = ["a"]\nmin_nodes = 0': "min_nodes must be an integer >= 1",
        'command = ["a"]\nmin_nodes = 3\nmax_nodes = 2': "max_nodes 2 < min_nodes 3",
        'command = ["a"]\nprofile = "yes"': "profile must be true or false",
        'command = ["a"]\nscaling = { x = 1.0 }': "scaling key 'x'",
        'command = ["a"]\ncolour = 1': "unknown field",
        'command = [': "not valid TOML",
    }
    for text, why in bad.items():
        f.write_text(text)
        with pytest.raises(JobSpecError, match=why) as info:
            load_spec(f)
        assert str(f) in str(info.value)
    j = tmp_path / "job.json"
    j.write_text(json.dumps({"command": ["a"], "samples": -1}))
    with pytest.raises(JobSpecError, match="samples must be"):
        load_spec(j)
    assert parse_spec({"command": ["x", "train.py"]}).name == "train"


# -- robustness: empty, corrupt, foreign, full, read-only stores; privacy; a bounded event log -------

def test_empty_garbage_and_foreign_files_are_errors_naming_the_file(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "store.db"
    db.write_bytes(b"")
    with pytest.raises(StoreError, match="empty file") as info:
        Store.open(db)
    assert str(db) in str(info.value) and db.stat().st_size == 0  # left as it was
    db.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="not a SQLite database"):
        Store.open(db)
    db.unlink()
    other = sqlite3.connect(db)
    other.execute("CREATE TABLE t (x)")
    other.commit()
    other.close()
    with pytest.raises(StoreError, match="not a malletrain store"):
        Store.open(db)


def test_corrupt_store_is_an_error(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    s = Store.open(db)
    for i in range(300):
        s.submit(JobSpec(f"job{i}", ("true",), env={"PAD": "x" * 500}))
    s.close()
    data = bytearray(db.read_bytes())
    for off in range(4096, len(data), 4096):  # scribble over every page but the header's
        data[off + 8:off + 200] = b"\xff" * 192
    db.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="corrupt") as info:
        Store.open(db)
    assert str(db) in str(info.value)


def test_state_dir_and_files_are_private(tmp_path: Path) -> None:
    import os
    import stat

    state = tmp_path / "state"
    s = Store.open(state / "store.db")
    s.submit(SPEC)
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    assert mode(state) == 0o700 and mode(state / "store.db") == 0o600
    for extra in ("store.db-wal", "store.db-shm"):  # SQLite copies the database file's mode
        assert mode(state / extra) == 0o600
    s.close()
    assert not [p.name for p in state.iterdir() if ".new-" in p.name]  # no temporary left
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    os.chmod(old, 0o755)
    Store.open(old / "store.db").close()
    os.chmod(old / "store.db", 0o644)
    Store.open(old / "store.db").close()  # an existing store of an older malletrain is tightened
    assert mode(old) == 0o700 and mode(old / "store.db") == 0o600


def test_event_log_is_bounded(tmp_path: Path) -> None:
    from malletrain.daemon.store import PRUNE_EVERY

    s = Store.open(tmp_path / "store.db", max_events=50, max_samples=20)
    a = s.submit(SPEC)
    for i in range(3 * PRUNE_EVERY):
        s.log_event("nodes", idle=i)
        if i % 10 == 0:
            s.log_event("plan", a, step=i)
    count = lambda kind: sum(1 for _ in s.events(kind))  # noqa: E731
    assert count("nodes") <= 20 + PRUNE_EVERY and count(None) <= 70 + PRUNE_EVERY
    s.prune_events()
    assert count("nodes") == 20 and count(None) - count("nodes") == 50
    assert [e["idle"] for e in s.events("nodes")][-1] == 3 * PRUNE_EVERY - 1  # the newest are kept
    assert s.require(a).state is JobState.PENDING and s.history(a)  # jobs and their history are not events


def test_full_disk_is_a_clear_error_and_loses_nothing(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    s = Store.open(db)
    kept = [s.submit(SPEC) for _ in range(3)]
    s.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    pages = s.conn.execute("PRAGMA page_count").fetchone()[0]
    s.conn.execute(f"PRAGMA max_page_count = {pages}")  # the database cannot grow: a full disk
    with pytest.raises(StoreError, match="disk full") as info:
        for _ in range(1000):
            s.submit(JobSpec("big", ("true",), env={"PAD": "x" * 30_000}))
    assert str(db) in str(info.value)
    before = s.dropped_events
    for _ in range(200):
        s.log_event("nodes", pad="y" * 3000)  # events are dropped, never raised
    assert s.dropped_events > before
    s.close()
    again = Store.open(db)
    assert [r.id for r in again.jobs()][:3] == kept and all(again.require(j).spec == SPEC for j in kept)


def test_read_only_store_is_a_clear_error_and_loses_nothing(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    s = Store.open(db)
    a = s.submit(SPEC)
    s.conn.execute("PRAGMA query_only = ON")  # writes fail as on a read-only file system
    with pytest.raises(StoreError, match="read-only") as info:
        s.set_state(a, JobState.RUNNING, "placed")
    assert str(db) in str(info.value)
    s.log_event("nodes", idle=1)  # dropped, not raised
    assert s.dropped_events == 1
    s.close()
    assert Store.open(db).require(a).state is JobState.PENDING


@pytest.mark.skipif(__import__("os").geteuid() == 0, reason="root writes to read-only directories")
def test_read_only_state_dir(tmp_path: Path) -> None:
    import os

    state = tmp_path / "ro"
    state.mkdir()
    os.chmod(state, 0o500)
    try:
        with pytest.raises(StoreError) as info:
            Store.open(state / "store.db")
        assert str(state) in str(info.value)
    finally:
        os.chmod(state, 0o700)


def test_a_stored_job_that_breaks_todays_rules_fails_on_open(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    s = Store.open(db)
    good = s.submit(SPEC)
    bad = s.submit(SPEC)
    poison = json.loads(SPEC.to_json())
    poison.update(max_nodes=9223372036854775807, name="x\n\x1b[31m", env={"A=B": "1"})
    s.conn.execute("UPDATE jobs SET spec=? WHERE id=?", (json.dumps(poison), bad))
    s.close()
    again = Store.open(db)
    rec = again.require(bad)
    assert rec.state is JobState.FAILED and rec.message.startswith("refused: job ") and "non-printable" in rec.message
    assert "\n" not in rec.message and "\x1b" not in rec.message  # the reason is safe to print
    assert rec.spec.name == "x[31m" and rec.spec.max_nodes == 1  # a stub: readable, never run
    assert again.require(good).state is JobState.PENDING


def test_jobs_record_their_owner_and_old_stores_gain_the_columns(tmp_path: Path) -> None:
    import os
    import sqlite3

    s = Store.open(tmp_path / "store.db")
    mine = s.submit(SPEC)
    theirs = s.submit(SPEC, owner_uid=1234, owner_gid=99)
    assert (s.require(mine).owner_uid, s.require(mine).owner_gid) == (os.geteuid(), os.getegid())
    assert (s.require(theirs).owner_uid, s.require(theirs).owner_gid) == (1234, 99)
    assert s.require(theirs).as_dict()["owner_uid"] == 1234
    s.close()
    old = tmp_path / "old.db"  # a store written before owners existed
    conn = sqlite3.connect(old)
    conn.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('schema_version', '1');"
        "CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, name TEXT NOT NULL,"
        " spec TEXT NOT NULL, state TEXT NOT NULL, samples INTEGER NOT NULL DEFAULT 0,"
        " nodes TEXT NOT NULL DEFAULT '[]', cancel_requested INTEGER NOT NULL DEFAULT 0,"
        " message TEXT NOT NULL DEFAULT '', submitted REAL NOT NULL, updated REAL NOT NULL);"
    )
    conn.execute("INSERT INTO jobs (id, name, spec, state, submitted, updated) VALUES ('j000001', 'toy', ?, 'pending', 1, 1)",
                 (SPEC.to_json(),))
    conn.commit()
    conn.close()
    again = Store.open(old)
    assert again.require("j000001").owner_uid is None and again.require("j000001").spec == SPEC
    assert again.submit(SPEC) == "j000002"


def test_a_shared_folder_given_as_state_dir_is_not_chmodded(tmp_path: Path) -> None:
    import os
    import stat

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    (shared / "someone-elses-file").write_text("x")
    Store.open(shared / "store.db").close()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755  # left alone (a warning is logged)
    assert stat.S_IMODE((shared / "store.db").stat().st_mode) == 0o600  # our own file is still private


def test_fuzz_store_files_give_store_errors_only(tmp_path: Path) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from malletrain.daemon.store import SQLITE_MAGIC

    good = tmp_path / "good.db"
    s = Store.open(good)
    s.submit(SPEC)
    s.close()
    valid = good.read_bytes()
    db = tmp_path / "fuzz" / "store.db"
    db.parent.mkdir()

    @settings(max_examples=400, deadline=None)
    @given(st.binary(max_size=600) | st.binary(max_size=600).map(lambda b: SQLITE_MAGIC + b)
           | st.tuples(st.integers(0, len(valid) - 1), st.binary(min_size=1, max_size=64)).map(
               lambda cut: valid[:cut[0]] + cut[1] + valid[cut[0] + len(cut[1]):]))
    def check(data: bytes) -> None:
        for extra in (db.with_name("store.db-wal"), db.with_name("store.db-shm")):
            extra.unlink(missing_ok=True)
        db.write_bytes(data)
        try:
            store = Store.open(db)
        except StoreError as exc:
            assert str(db) in str(exc)
            return
        try:
            store.jobs()  # a damaged row reads as an error naming the store, never a traceback
        except StoreError as exc:
            assert str(db) in str(exc)
        finally:
            store.close()

    check()


def test_a_damaged_row_is_an_error_naming_the_store(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    s = Store.open(db)
    a = s.submit(SPEC)
    s.conn.execute("UPDATE jobs SET nodes='[[[', state='bogus' WHERE id=?", (a,))
    with pytest.raises(StoreError, match=f"job '{a}': damaged row") as info:
        s.jobs()
    assert str(db) in str(info.value)


def test_job_states_follow_the_one_transition_table(tmp_path) -> None:
    from malletrain.daemon.jobspec import JOB_TRANSITIONS, JobSpec, JobState
    from malletrain.daemon.store import Store, StoreError

    assert set(JOB_TRANSITIONS) == set(JobState)
    assert all(not JOB_TRANSITIONS[s] for s in JobState if s.terminal)
    assert all(JobState.PENDING not in targets for targets in JOB_TRANSITIONS.values())
    store = Store.open(tmp_path / "store.db")
    jid = store.submit(JobSpec("t", ("true",)))
    assert store.set_state(jid, JobState.RUNNING, "placed")
    with pytest.raises(StoreError, match="cannot become pending"):
        store.set_state(jid, JobState.PENDING)
    assert store.set_state(jid, JobState.SUSPENDED, "below min_nodes")
    assert store.set_state(jid, JobState.COMPLETED, "done")
    with pytest.raises(StoreError, match="is completed; cannot become running"):
        store.set_state(jid, JobState.RUNNING)
    store.close()
