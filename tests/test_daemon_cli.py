"""The CLI against a real daemon subprocess; kill -9 and restart loses no job and re-adopts workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


from procs import procs_mentioning
from malletrain.daemon.store import Store
from stepping import wait_until


CONFIG = """
state_dir = "{state}"
runtime = "toy"
loop_interval = 0.05
agent_heartbeat = 0.2
agent_dead_after = 15.0
backend = "local"
[local]
nodes = 2
trace = "none"
"""

JOB = """
name = "{name}"
command = ["{python}", "-m", "malletrain.worker.toy", "--rate", "1000"]
min_nodes = 1
max_nodes = 1
scaling = {{ 1 = 10.0 }}
"""


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "malletrain", *args], capture_output=True, text=True, timeout=timeout)


def start_daemon(cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "malletrain", "daemon", "--config", str(cfg)],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def status(state: Path) -> dict[str, Any]:
    res = cli("status", "--json", "--state-dir", str(state))
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def job(data: dict[str, Any], jid: str) -> dict[str, Any]:
    return next(j for j in data["jobs"] if j["id"] == jid)


@pytest.mark.slow
def test_cli_and_kill_9_restart_loses_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cfg = tmp_path / "daemon.toml"
    cfg.write_text(CONFIG.format(state=state))
    for name in ("a", "b"):
        (tmp_path / f"{name}.toml").write_text(JOB.format(name=name, python=sys.executable))
    log = tmp_path / "daemon.log"
    d = start_daemon(cfg, log)
    try:
        wait_until(lambda: (state / "daemon.json").exists(), "daemon.json")
        res = cli("submit", str(tmp_path / "a.toml"), "--state-dir", str(state))
        assert res.returncode == 0, res.stderr
        a = res.stdout.strip()
        assert a == "j000001"
        wait_until(lambda: job(status(state), a)["state"] == "running" and job(status(state), a)["samples"] > 0, "a runs")
        table = cli("status", "--state-dir", str(state)).stdout
        assert "JOBID" in table and a in table and "running" in table and "NODE" in table
        nodes = cli("nodes", "--state-dir", str(state))
        assert nodes.returncode == 0 and "held" in nodes.stdout and a in nodes.stdout
        node_a = job(status(state), a)["nodes"][0]

        # kill -9: agents and workers live on; submit while the daemon is down
        d.send_signal(signal.SIGKILL)
        d.wait(timeout=10)
        assert procs_mentioning(str(state)), "agents should outlive the daemon for a while"
        res = cli("submit", str(tmp_path / "b.toml"), "--state-dir", str(state))
        b = res.stdout.strip()
        off = status(state)
        assert off["daemon"] is False and job(off, b)["state"] == "pending"
        samples_before = Store.open(state / "store.db").require(a).samples

        d = start_daemon(cfg, log)
        wait_until(lambda: job(status(state), b)["state"] == "running", "b runs after the restart", timeout=40)
        data = status(state)
        assert job(data, a)["state"] == "running" and job(data, a)["nodes"] == [node_a]
        adopted = [e for e in Store.open(state / "store.db").events("adopt")]
        assert [e["job"] for e in adopted] == [a]  # the same worker, not a new one
        wait_until(lambda: job(status(state), a)["samples"] > samples_before + 500, "a keeps training")

        res = cli("cancel", a, "--state-dir", str(state))
        assert res.returncode == 0 and "cancel requested" in res.stdout
        wait_until(lambda: job(status(state), a)["state"] == "cancelled", "a cancelled")
        assert cli("cancel", "j000042", "--state-dir", str(state)).returncode != 0
    finally:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
            d.wait(timeout=30)
    assert d.returncode == 0, log.read_text()[-2000:]
    wait_until(lambda: not procs_mentioning(str(state)), "no orphans", timeout=15)
    final = Store.open(state / "store.db")
    assert final.require(b).state.value == "suspended"  # stopped with the daemon; resumes next time
    assert os.path.exists(state / "store.db") and not (state / "daemon.json").exists()


def test_cli_errors_name_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('command = "python train.py"\n')
    res = cli("submit", str(bad), "--state-dir", str(tmp_path / "s"))
    assert res.returncode == 2 and str(bad) in res.stderr and "command must be a list" in res.stderr
    cfg = tmp_path / "c.toml"
    cfg.write_text('runtime = "mpi"\n')
    res = cli("daemon", "--config", str(cfg))
    assert res.returncode == 2 and "runtime must be one of" in res.stderr and str(cfg) in res.stderr
    res = cli("nodes", "--state-dir", str(tmp_path / "s"))
    assert res.returncode == 1 and "no daemon" in res.stderr


FAILING = """
name = "fails"
command = ["python", "-c", "import sys, time; print('boom: cannot train'); time.sleep(1); sys.exit(3)"]
scaling = { 1 = 10.0 }
"""

SHORT = """
name = "short"
command = ["python", "-m", "malletrain.worker.toy", "--rate", "4000", "--exit-after-samples", "500"]
samples = 100000
scaling = { 1 = 10.0 }
"""


@pytest.mark.slow
def test_status_says_why_a_job_failed_and_where_its_log_is(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cfg = tmp_path / "daemon.toml"
    cfg.write_text(CONFIG.format(state=state).replace('backend = "local"', 'max_failures = 1\nbackend = "local"'))
    (tmp_path / "fails.toml").write_text(FAILING)
    (tmp_path / "short.toml").write_text(SHORT)
    log = tmp_path / "daemon.log"
    d = start_daemon(cfg, log)
    try:
        fails = cli("submit", str(tmp_path / "fails.toml"), "--state-dir", str(state)).stdout.strip()
        short = cli("submit", str(tmp_path / "short.toml"), "--state-dir", str(state)).stdout.strip()
        res = cli("wait", fails, "--timeout", "120", "--state-dir", str(state), timeout=180)
        assert res.returncode == 1 and f"{fails} ended" in res.stderr and "boom: cannot train" in res.stderr
        res = cli("wait", short, "--samples", "100000", "--timeout", "120", "--state-dir", str(state), timeout=180)
        assert res.returncode == 1 and "the command exited 0 at" in res.stderr

        table = cli("status", "--state-dir", str(state)).stdout
        assert f"{fails} failed: " in table and "exit 3" in table
        assert f"log: {state}/logs/{fails}." in table and "| boom: cannot train" in table
        assert f"{short} completed: the command exited 0 at " in table and "of 100,000 samples" in table
        data = status(state)
        assert job(data, fails)["logs"] and job(data, fails)["note"]
        assert job(data, fails)["command"][0] == sys.executable  # `python` is the submitting interpreter
        assert job(data, short)["state"] == "completed" and job(data, short)["samples"] < 100000
    finally:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
            d.wait(timeout=30)
    wait_until(lambda: not procs_mentioning(str(state)), "no orphans", timeout=15)


def test_status_escapes_what_jobs_wrote(tmp_path: Path) -> None:
    from malletrain.cli.daemon import format_details, format_jobs, job_note

    evil = {"id": "j000001", "name": "x\n\x1b[2Jfake", "state": "failed", "nodes": [], "min_nodes": 1,
            "max_nodes": 1, "samples": 0, "target": None, "message": "exit 1\x1b[31m", "logs": []}
    evil["note"] = job_note(evil)
    text = format_jobs([evil]) + format_details([evil], str(tmp_path))
    assert "\x1b" not in text and "x\\n\\x1b[2Jf" in text and "exit 1\\x1b[31m" in text


def test_submit_refuses_a_job_bigger_than_the_machine(tmp_path: Path) -> None:
    state = tmp_path / "s"
    store = Store.open(state / "store.db")
    store.set_machine_nodes(6)
    store.close()
    f = tmp_path / "big.toml"
    f.write_text('command = ["python", "t.py"]\nmax_nodes = 7\n')
    (tmp_path / "t.py").write_text("")  # (submit looks for the script first)
    res = cli("submit", str(f), "--state-dir", str(state))
    assert res.returncode == 2 and "max_nodes 7 is more than the machine's 6 nodes" in res.stderr
    (state / "store.db").write_bytes(b"")
    res = cli("status", "--state-dir", str(state))
    assert res.returncode == 2 and "empty file" in res.stderr and str(state / "store.db") in res.stderr


NOBODY = 65534


def as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI run by another local user (``setpriv`` drops root to uid/gid 65534)."""
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           sys.executable, "-m", "malletrain", *args],
                          capture_output=True, text=True, timeout=60, cwd="/")


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_user_submits_and_cancels_through_the_daemon_only_their_own(tmp_path: Path) -> None:
    """Issue E #1 end to end: a root daemon; another user's CLI reaches it over the control socket
    (the state dir is traversable, never listable), owns what it submits, cannot cancel root's job,
    and cannot read the store."""
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="mt-shared-"))  # pytest's tmp_path is 0700: nobody could not pass
    try:
        os.chmod(top, 0o755)
        state = top / "state"
        cfg = top / "daemon.toml"
        cfg.write_text(CONFIG.format(state=state))
        job_file = top / "job.toml"  # a command every user can run (this venv's Python may not be)
        job_file.write_text('name = "x"\ncommand = ["/bin/sh", "-c", "sleep 60"]\n')
        os.chmod(job_file, 0o644)
        d = start_daemon(cfg, tmp_path / "daemon.log")
        try:
            wait_until(lambda: (state / "daemon.json").exists(), "daemon.json")
            mine = cli("submit", str(job_file), "--state-dir", str(state)).stdout.strip()
            res = as_nobody("submit", str(job_file), "--state-dir", str(state))
            assert res.returncode == 0, res.stderr
            theirs = res.stdout.strip()
            jobs = {j["id"]: j for j in status(state)["jobs"]}
            assert jobs[mine]["owner_uid"] == 0 and jobs[theirs]["owner_uid"] == NOBODY

            res = as_nobody("cancel", mine, "--state-dir", str(state))
            assert res.returncode == 1 and f"job {mine} belongs to uid 0" in res.stderr
            res = as_nobody("cancel", theirs, "--state-dir", str(state))
            assert res.returncode == 0, res.stderr
            wait_until(lambda: job(status(state), theirs)["state"] == "cancelled", "their job cancelled")
            assert job(status(state), mine)["state"] not in ("cancelled", "failed")

            st = state.stat()
            assert st.st_mode & 0o777 == 0o711  # pass through to the socket, never list
            for private in ("store.db", "monitor.key", "daemon.json"):
                assert (state / private).stat().st_mode & 0o077 == 0, private
            res = as_nobody("status", "--state-dir", str(state))
            assert res.returncode == 0 and mine in res.stdout  # through the daemon, not the store
        finally:
            d.send_signal(signal.SIGTERM)
            d.wait(timeout=30)
        res = as_nobody("status", "--state-dir", str(state))  # no daemon: the store is not theirs
        assert res.returncode == 2 and "store.db" in res.stderr and "Traceback" not in res.stderr
    finally:
        wait_until(lambda: not procs_mentioning(str(top)), "no orphans", timeout=15)
        import shutil

        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_a_root_daemon_runs_each_job_as_its_owner(tmp_path: Path) -> None:
    """Issue E #1: a job another user submitted to a root daemon read /etc/shadow; now its
    workers run as that user, and its log is theirs alone (0600)."""
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="mt-owner-"))
    try:
        os.chmod(top, 0o755)
        state = top / "state"
        (top / "daemon.toml").write_text(CONFIG.format(state=state))
        job_file = top / "job.toml"
        job_file.write_text('name = "peek"\ncommand = ["/bin/sh", "-c", "id -u; id -g; cat /etc/shadow; sleep 60"]\n')
        os.chmod(job_file, 0o644)
        d = start_daemon(top / "daemon.toml", tmp_path / "daemon.log")
        try:
            wait_until(lambda: (state / "daemon.json").exists(), "daemon.json")
            res = as_nobody("submit", str(job_file), "--state-dir", str(state))
            assert res.returncode == 0, res.stderr
            jid = res.stdout.strip()
            logs = lambda: sorted((state / "logs").glob(f"{jid}.*.log"))  # noqa: E731
            wait_until(lambda: logs() and "shadow" in logs()[0].read_text(), "the worker's output", timeout=60)
            log = logs()[0]
            out = log.read_text().split()
            assert out[:2] == [str(NOBODY), str(NOBODY)]  # uid and gid of the owner, not root
            assert "Permission denied" in log.read_text() and "root:" not in log.read_text()
            st = log.stat()
            assert (st.st_uid, st.st_mode & 0o777) == (NOBODY, 0o600)
            assert as_nobody("cancel", jid, "--state-dir", str(state)).returncode == 0
        finally:
            d.send_signal(signal.SIGTERM)
            d.wait(timeout=30)
    finally:
        wait_until(lambda: not procs_mentioning(str(top)), "no orphans", timeout=15)
        shutil.rmtree(top, ignore_errors=True)


def test_status_on_a_state_dir_that_does_not_exist_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    res = cli("status", "--state-dir", str(missing))
    assert res.returncode == 2 and f"no state dir at {missing}" in res.stderr, res.stderr
    assert not missing.exists()  # not created
