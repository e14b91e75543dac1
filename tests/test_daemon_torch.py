"""The daemon with the real `torch` runtime and the example trainer (CPU, gloo).

A job starts on 2 nodes; the main scheduler recalls one (SIGTERM on its agent);
the survivor keeps training from its last commit (its step counter goes on,
it does not restart) at world size 1; no process is left behind.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from malletrain.daemon.config import DaemonConfig, LocalConfig  # noqa: E402
from malletrain.daemon import Daemon  # noqa: E402
from malletrain.worker.examples.tracelog import steps as steps_of  # noqa: E402
from malletrain.daemon.jobspec import JobSpec, JobState  # noqa: E402
from stepping import wait_until


@pytest.mark.slow
def test_torch_job_shrinks_on_recall_and_keeps_training(tmp_path: Path) -> None:
    try:  # the sibling test module, however pytest put tests/ on the path
        from test_daemon import procs_mentioning, until
    except ImportError:
        from tests.test_daemon import procs_mentioning, until  # type: ignore[no-redef]

    state = tmp_path / "state"
    cfg = DaemonConfig(state_dir=str(state), runtime="torch", local=LocalConfig(nodes=2, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=5.0, loop_interval=0.05)
    cmd = (sys.executable, "-m", "malletrain.worker.examples.train", "--model", "linear", "--samples", "100000000",
           "--trace", "--step-sleep", "0.02")
    d = Daemon(cfg)
    try:
        jid = d.store.submit(JobSpec("lin", cmd, 1, 2, False, {1: 100.0, 2: 200.0}, env={"OMP_NUM_THREADS": "1"}))
        until(d, lambda: len(d.runs[jid].members) == 2 and d.monitor.jobs.get(jid) is not None
              and d.monitor.jobs[jid].world_size == 2 and d.monitor.jobs[jid].reports > 20, timeout=90)
        victim, survivor = d.runs[jid].members[1], d.runs[jid].members[0]
        survivor_log = state / "logs" / f"{d.runs[jid].workers[survivor]}.log"
        d.backend.recall(victim)
        until(d, lambda: d.runs[jid].members == [survivor])
        t_recall = time.time()
        until(d, lambda: d.monitor.jobs[jid].world_size == 1 and d.monitor.jobs[jid].last_time > t_recall + 1,
              timeout=30)
        assert d.store.require(jid).state is JobState.RUNNING
        steps = steps_of(survivor_log)
        two = [s["step"] for s in steps if s["world"] == 2]
        one = [s["step"] for s in steps if s["world"] == 1]
        assert two and one and min(one) > max(two) - 2, (two[-3:], one[:3])  # went on from its last commit
        pauses = [r for r in d.store.rescales(jid) if (r["from_nodes"], r["to_nodes"]) == (2, 1)]
        assert pauses and pauses[0]["pause_s"] >= 0.0  # measured (its size is a benchmark figure, not a test)
    finally:
        d.close()
    deadline = time.monotonic() + 10
    while procs_mentioning(str(state)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert procs_mentioning(str(state)) == []


CONFIG = """
state_dir = "{state}"
runtime = "torch"
loop_interval = 0.05
agent_heartbeat = 0.2
agent_dead_after = 10.0
store_grace = 45.0
backend = "local"
[local]
nodes = 2
trace = "none"
"""

JOB = """
name = "lin"
command = ["{python}", "-m", "malletrain.worker.examples.train", "--model", "linear", "--samples", "1000000000",
           "--trace", "--step-sleep", "0.05"]
min_nodes = 2
max_nodes = 2
scaling = {{ 1 = 100.0, 2 = 200.0 }}
env = {{ OMP_NUM_THREADS = "1" }}
"""


def job_logs(state: Path, jid: str) -> list[Path]:
    return sorted((state / "logs").glob(f"{jid}.*.log"))


@pytest.mark.slow
def test_torch_job_rides_through_daemon_kill_9(tmp_path: Path) -> None:
    """kill -9 of the daemon: the torch workers train on, the restarted daemon re-adopts them
    and republishes a newer generation, and their step counters go on (no restart from 0)."""
    try:
        from test_daemon_cli import cli, job, procs_mentioning, start_daemon, status
    except ImportError:
        from tests.test_daemon_cli import cli, job, procs_mentioning, start_daemon, status  # type: ignore[no-redef]
    import signal

    from malletrain.daemon.store import Store

    state = tmp_path / "state"
    cfg = tmp_path / "daemon.toml"
    cfg.write_text(CONFIG.format(state=state))
    (tmp_path / "job.toml").write_text(JOB.format(python=sys.executable))
    log = tmp_path / "daemon.log"
    d = start_daemon(cfg, log)
    try:
        wait_until(lambda: (state / "daemon.json").exists(), "daemon.json")
        res = cli("submit", str(tmp_path / "job.toml"), "--state-dir", str(state))
        assert res.returncode == 0, res.stderr
        jid = res.stdout.strip()

        def two_training() -> bool:
            logs = job_logs(state, jid)
            return len(logs) == 2 and all(sum(s["world"] == 2 for s in steps_of(p)) >= 10 for p in logs)

        wait_until(two_training, "the job trains on 2 nodes", timeout=120)
        before = status(state)
        nodes = job(before, jid)["nodes"]
        assert job(before, jid)["state"] == "running" and len(nodes) == 2
        logs = job_logs(state, jid)
        gen_before = max(s["gen"] for p in logs for s in steps_of(p))

        d.send_signal(signal.SIGKILL)
        d.wait(timeout=10)
        t_kill = time.time()
        last_before = {p: max(s["step"] for s in steps_of(p) if s["t"] <= t_kill) for p in logs}
        time.sleep(1.5)
        samples_at_kill = Store.open(state / "store.db").require(jid).samples
        t_restart = time.time()
        d = start_daemon(cfg, log)

        def switched() -> bool:
            return all(any(s["gen"] > gen_before for s in steps_of(p)) for p in logs)

        wait_until(switched, "the re-adopted workers switch to the republished generation", timeout=60)
        wait_until(lambda: job(status(state), jid)["samples"] > samples_at_kill, "progress is counted again", timeout=20)
        after = status(state)
        assert [j["id"] for j in after["jobs"]] == [jid]  # no job lost, none added
        assert job(after, jid)["state"] == "running" and sorted(job(after, jid)["nodes"]) == sorted(nodes)
        assert job_logs(state, jid) == logs  # the same two workers: none was restarted
        db = Store.open(state / "store.db")
        assert sorted(e["node"] for e in db.events("adopt") if e["job"] == jid) == sorted(nodes)
        gens = [e["generation"] for e in db.events("members") if e["job"] == jid]
        assert gens == sorted(gens) and len(set(gens)) == len(gens) and gens[-1] > gen_before
        assert db.generation(jid) == gens[-1]
        for p in logs:
            steps = steps_of(p)
            numbers = [s["step"] for s in steps]
            # never back further than the last commit: a step may repeat once after a failure, no more
            assert all(b >= a for a, b in zip(numbers, numbers[1:])), (p.name, numbers)
            # trained on while the daemon was down: steps beyond the last one before the kill, made
            # before the new daemon started (an ordering of events, not a time window)
            assert any(s["step"] > last_before[p] and s["t"] < t_restart for s in steps), \
                "trained on while the daemon was down"
            new = [s["step"] for s in steps if s["gen"] > gen_before]
            assert new and min(new) > last_before[p], (p.name, last_before[p], new[:3])
            assert "StoreLost" not in p.read_text() and "exiting with code" not in p.read_text()
    finally:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
            d.wait(timeout=30)
    assert d.returncode == 0, log.read_text()[-2000:]
    wait_until(lambda: not procs_mentioning(str(state)), "no orphans", timeout=20)
    assert Store.open(state / "store.db").require(jid).state is JobState.SUSPENDED  # stopped with the daemon
