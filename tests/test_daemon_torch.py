"""The daemon with the real `torch` runtime and the example trainer (CPU, gloo).

A job starts on 2 nodes; the main scheduler recalls one (SIGTERM on its agent);
the survivor keeps training from its last commit (its step counter goes on,
it does not restart) at world size 1; no process is left behind.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from malletrain.config import DaemonConfig, LocalConfig  # noqa: E402
from malletrain.daemon import Daemon  # noqa: E402
from malletrain.jobspec import JobSpec, JobState  # noqa: E402


def steps_of(log: Path) -> list[dict]:
    out = []
    for line in log.read_text().splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("ev") == "step":
            out.append(obj)
    return out


@pytest.mark.slow
def test_torch_job_shrinks_on_recall_and_keeps_training(tmp_path: Path) -> None:
    try:  # the sibling test module, however pytest put tests/ on the path
        from test_daemon import procs_mentioning, until
    except ImportError:
        from tests.test_daemon import procs_mentioning, until  # type: ignore[no-redef]

    state = tmp_path / "state"
    cfg = DaemonConfig(state_dir=str(state), runtime="torch", local=LocalConfig(nodes=2, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=5.0, loop_interval=0.05)
    cmd = (sys.executable, "-m", "malletrain.examples.train", "--model", "linear", "--samples", "100000000",
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
