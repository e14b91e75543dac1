"""The daemon with the ``horovod`` runtime and the local backend, all real processes.

Elastic Horovod job (malletrain/worker/examples/hvd_train.py) on local nodes: it
starts on the 2 idle nodes, grows to 3 when a third node becomes idle, shrinks
back to 2 when the main scheduler recalls one, and training goes on at each
size; the job completes when its script exits 0, and no process is left.
Skipped without ``horovod.torch`` (``bash .ci/build-horovod.sh`` builds it).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("horovod.torch")

from malletrain.daemon.config import DaemonConfig, LocalConfig  # noqa: E402
from malletrain.daemon import Daemon  # noqa: E402
from malletrain.daemon.jobspec import JobSpec, JobState  # noqa: E402
from malletrain.runtimes.horovod_elastic import HorovodRuntime  # noqa: E402
from stepping import wait_until

pytestmark = pytest.mark.slow


def read_progress(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def size_runs(records: list[dict[str, Any]]) -> list[int]:
    """The world sizes in the order they appear, one entry per run of equal sizes."""
    sizes = [r["size"] for r in records]
    return [s for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] != s]


def test_horovod_job_grows_shrinks_and_completes_under_the_daemon(tmp_path: Path) -> None:
    try:  # the sibling test module, however pytest put tests/ on the path
        from test_daemon import procs_mentioning, until
    except ImportError:
        from tests.test_daemon import procs_mentioning, until  # type: ignore[no-redef]

    state = tmp_path / "state"
    progress, stop = tmp_path / "progress.jsonl", tmp_path / "stop"
    cfg = DaemonConfig(state_dir=str(state), runtime="horovod", local=LocalConfig(nodes=3, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=5.0, loop_interval=0.05)
    cmd = (sys.executable, "-m", "malletrain.worker.examples.hvd_train", "--steps", "1000000", "--step-sleep", "0.05",
           "--progress", str(progress), "--stop-file", str(stop))
    d = Daemon(cfg)
    assert isinstance(d.runtime, HorovodRuntime)
    try:
        d.backend.recall("node02")  # busy in the main queue for now
        jid = d.store.submit(JobSpec("hvd", cmd, 1, 3, False, {1: 100.0, 2: 190.0, 3: 270.0},
                                     env={"OMP_NUM_THREADS": "1"}))

        def steps_at(size: int, after: int = 0) -> Callable[[], bool]:
            return lambda: sum(r["size"] == size for r in read_progress(progress)[after:]) >= 5

        until(d, lambda: len(d.runs[jid].members) == 2, timeout=30)
        until(d, steps_at(2), timeout=120)
        assert d.store.require(jid).state is JobState.RUNNING

        d.backend.make_idle("node02")  # a node arrives: the job grows onto it
        until(d, lambda: len(d.runs[jid].members) == 3, timeout=30)
        until(d, steps_at(3), timeout=120)

        seen = len(read_progress(progress))
        victim = d.runs[jid].members[0]
        d.backend.recall(victim)  # the main scheduler takes a node back: the job shrinks
        until(d, lambda: len(d.runs[jid].members) == 2 and victim not in d.runs[jid].members, timeout=30)
        until(d, steps_at(2, seen), timeout=120)
        assert d.store.require(jid).state is JobState.RUNNING

        stats = d.monitor.jobs.get(jid)
        assert stats is not None and stats.reports > 0  # hvd_train reports to the daemon's monitor
        stop.touch()  # the script ends on every rank: exit 0 -> the job completes
        until(d, lambda: d.store.require(jid).state is JobState.COMPLETED, timeout=60)
    finally:
        d.close()

    records = read_progress(progress)
    assert size_runs(records) == [2, 3, 2], size_runs(records)
    steps = [r["step"] for r in records]
    assert all(b >= a for a, b in zip(steps, steps[1:])), "steps went back more than one commit"
    assert records[-1]["loss"] < records[0]["loss"]
    deadline = time.monotonic() + 20
    while procs_mentioning(str(state)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert procs_mentioning(str(state)) == []


CONFIG = """
state_dir = "{state}"
runtime = "horovod"
loop_interval = 0.05
agent_heartbeat = 0.2
agent_dead_after = 10.0
backend = "local"
[local]
nodes = 2
trace = "none"
"""

JOB = """
name = "hvd"
command = ["{python}", "-m", "malletrain.worker.examples.hvd_train", "--steps", "1000000", "--step-sleep", "0.05",
           "--progress", "{progress}"]
min_nodes = 1
max_nodes = 2
scaling = {{ 1 = 100.0, 2 = 190.0 }}
env = {{ OMP_NUM_THREADS = "1" }}
"""


def test_horovod_job_survives_daemon_kill_9(tmp_path: Path) -> None:
    """The driver outlives a daemon kill -9; the restarted daemon re-adopts it and training goes on."""
    try:
        from test_daemon_cli import cli, job, procs_mentioning, start_daemon, status
    except ImportError:
        from tests.test_daemon_cli import cli, job, procs_mentioning, start_daemon, status  # type: ignore[no-redef]
    import signal

    from malletrain.daemon.store import Store

    state, progress = tmp_path / "state", tmp_path / "progress.jsonl"
    cfg = tmp_path / "daemon.toml"
    cfg.write_text(CONFIG.format(state=state))
    (tmp_path / "job.toml").write_text(JOB.format(python=sys.executable, progress=progress))
    log = tmp_path / "daemon.log"
    d = start_daemon(cfg, log)
    try:
        wait_until(lambda: (state / "daemon.json").exists(), "daemon.json")
        jid = cli("submit", str(tmp_path / "job.toml"), "--state-dir", str(state)).stdout.strip()
        wait_until(lambda: sum(r["size"] == 2 for r in read_progress(progress)) >= 5, "5 steps on 2 nodes", timeout=120)
        nodes = job(status(state), jid)["nodes"]

        d.send_signal(signal.SIGKILL)
        d.wait(timeout=10)
        t_kill = time.time()
        d = start_daemon(cfg, log)
        wait_until(lambda: any(e["job"] == jid for e in Store.open(state / "store.db").events("readopted")),
             "the restarted daemon re-adopts the job", timeout=40)
        t_adopted = time.time()
        wait_until(lambda: any(r["t"] > t_adopted + 1 for r in read_progress(progress)), "training goes on", timeout=30)
        after = status(state)
        assert [j["id"] for j in after["jobs"]] == [jid]
        assert job(after, jid)["state"] == "running" and sorted(job(after, jid)["nodes"]) == sorted(nodes)
        records = read_progress(progress)
        steps = [r["step"] for r in records]
        assert all(b >= a for a, b in zip(steps, steps[1:])), "the job restarted or rolled back"
        assert any(t_kill < r["t"] < t_adopted for r in records), "it trained while the daemon was away"
        assert size_runs(records) == [2]
        db = Store.open(state / "store.db")
        gens = [e["generation"] for e in db.events("members") if e["job"] == jid]
        assert gens == sorted(gens) and len(set(gens)) == len(gens) and len(gens) >= 2
        assert len(list((state / "horovod").iterdir())) == 1  # one job directory: no second driver
    finally:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
            d.wait(timeout=60)
    assert d.returncode == 0, log.read_text()[-2000:]
    wait_until(lambda: not procs_mentioning(str(state)), "no orphans (the adopted driver is stopped too)", timeout=30)
