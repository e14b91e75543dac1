"""What a job, or any local user, can do to the daemon, to other jobs and to the node (the third
round of probes): each test replays the attack or the fault, and fails on the code before its fix.

Tests that act as another local user need root (they drop to ``nobody``); they are skipped otherwise.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from malletrain.jobspec import JobSpec, JobState
from procs import procs_mentioning
from tests.stepping import step_until

ROOT = os.geteuid() == 0
NOBODY = 65534
TOY = (sys.executable, "-m", "malletrain.toy_runtime")


@pytest.fixture
def toy_daemon(tmp_path: Path) -> Iterator[Any]:
    from malletrain.config import DaemonConfig, LocalConfig
    from malletrain.daemon import Daemon

    d = Daemon(DaemonConfig(state_dir=str(tmp_path / "state"), runtime="toy",
                            local=LocalConfig(nodes=1, trace="none"), agent_heartbeat=0.2,
                            agent_dead_after=4.0, loop_interval=0.05))
    try:
        yield d
    finally:
        d.close()
    assert procs_mentioning(str(tmp_path / "state")) == []


# ---- a generation a job writes ----------------------------------------------------------------


def test_a_resume_generation_of_2_63_from_a_worker_is_ignored_not_stored() -> None:
    """A worker set its ``resume`` key to 2^63-1: the next generation overflowed SQLite and killed the daemon."""
    from malletrain.elastic.keys import resume_key
    from malletrain.elastic.wire import StoreClient
    from malletrain.runtimes.torch_elastic import MAX_RESUMED_GENERATION, TorchRuntime
    rt = TorchRuntime("127.0.0.1", 0, monitor="tcp://127.0.0.1:5999")
    rt.start()
    try:
        rt.launch_spec("j", ["x"], "w", "n")
        client = StoreClient(("127.0.0.1", rt.port), "j", "w", rt.secret_for("j"))
        for bad in (str(2**63 - 1), str(MAX_RESUMED_GENERATION + 1), "-5", "1e9", "9" * 4300):
            client.set(resume_key("j", "w"), bad)
            gen = rt.set_members("j", ["w"])
            assert gen <= 16, bad
        client.set(resume_key("j", "w"), "41")  # a real one is still taken
        assert rt.set_members("j", ["w"]) == 42
    finally:
        rt.close()


def test_an_overflow_acting_on_one_job_fails_that_job_and_the_daemon_goes_on(toy_daemon: Any) -> None:
    d = toy_daemon
    real = d.runtime.set_members

    def overflowing(job_id: str, members: Any) -> int:
        if members and job_id == bad:
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        return real(job_id, members)

    d.runtime.set_members = overflowing
    bad = d.store.submit(JobSpec("bad", TOY + ("--rate", "1000"), 1, 1))
    step_until(d, lambda: d.store.require(bad).state is JobState.FAILED, 60)
    assert "OverflowError" in (d.store.require(bad).message or "")
    good = d.store.submit(JobSpec("good", TOY + ("--rate", "1000"), 1, 1))
    step_until(d, lambda: d.runs[good].last_progress > 0, 60)  # the same daemon runs the next job
