"""The SQLite job store: submit, states, restart recovery, concurrent writers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from malletrain.jobspec import JobSpec, JobSpecError, JobState, load_spec, parse_spec
from malletrain.store import Store, StoreError

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
    s.record_scaling(a, 2, 19.5)
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
    assert [e["kind"] for e in s2.events()] == ["submit", "submit", "state"]


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
        "import sys; from malletrain.store import Store; from malletrain.jobspec import JobSpec;"
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
