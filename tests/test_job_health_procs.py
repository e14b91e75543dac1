"""Real processes on local nodes: a script that hangs is shown stalled, restarted, then FAILED, freeing its
node; a script that crashes at start is FAILED after two tries under either launcher (not after
``max_failures``, nor after the torchrun rank agents' wait for a newer world); and in the demo's first
seconds every queued job says why it waits, "starting: workers importing" included.

Small: one or two local nodes, the toy runtime, no torch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from malletrain.daemon.config import DaemonConfig, LocalConfig
from malletrain.daemon import Daemon
from malletrain.daemon.jobspec import JobSpec, JobState, Launcher
from procs import procs_mentioning
from tests.stepping import step_until

PY = sys.executable

HANGS = """import time
from contract.workerenv import WorkerEnv
env = WorkerEnv.from_environ()
(env.require_toy_dir() / f"{env.require_job()}.ready.{env.require_worker()}").touch()  # joins its world ...
print("ready; now hanging", flush=True)
time.sleep(600)  # ... and never trains a step
"""

CRASHES = "import sys\nprint('broken on purpose', flush=True)\nsys.exit(3)\n"


def _config(state: Path, nodes: int, **kw: object) -> DaemonConfig:
    return DaemonConfig(state_dir=str(state), runtime="toy", local=LocalConfig(nodes=nodes, trace="none"),
                        agent_heartbeat=0.2, agent_dead_after=5.0, loop_interval=0.05, max_failures=5,
                        **kw)  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_hung_job_is_shown_stalled_restarted_then_failed_and_frees_its_node(tmp_path: Path) -> None:
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    state = tmp_path / "state"
    d = Daemon(_config(state, 1, stall_restarts=1))
    seen: list[str] = []

    def look() -> None:
        seen.extend(j["stalled"] for j in d.api.status_jobs() if j.get("stalled"))

    try:
        jid = d.store.submit(JobSpec("hangs", (PY, str(script)), 1, 1, False, {1: 1.0}, stall_after=3))
        step_until(d, lambda: d.store.require(jid).state.terminal, 120, "the hung job ends", check=look)
        rec = d.store.require(jid)
        assert rec.state is JobState.FAILED and rec.message.startswith("stalled: no progress for"), rec.message
        assert seen and seen[0].startswith("stalled: no progress for") and "(bound 3 s)" in seen[0]
        assert len(list(d.store.events("stall_restart"))) == 1
        assert list(d.store.events("members"))  # it ran (a world formed) before it stalled
        step_until(d, lambda: not d.runs, 30, "its workers gone")
        assert not any(n["job"] for n in d.api.status_nodes())  # its node is free
    finally:
        d.close()
    assert procs_mentioning(str(state)) == []


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [Launcher.ELASTIC, Launcher.TORCHRUN])
def test_a_script_that_crashes_at_start_fails_after_two_tries(launcher: Launcher, tmp_path: Path) -> None:
    """Under torchrun the rank agents keep their default wait for a newer world (20 s): a world whose
    every rank failed does not wait for it."""
    script = tmp_path / "broken.py"
    script.write_text(CRASHES)
    state = tmp_path / "state"
    d = Daemon(_config(state, 2))
    try:
        jid = d.store.submit(JobSpec("broken", (PY, str(script)), 1, 1, False, {1: 1.0}, launcher=launcher))
        step_until(d, lambda: d.store.require(jid).state.terminal, 120, "the broken job ends")
        rec = d.store.require(jid)
        assert rec.state is JobState.FAILED and "before its first step" in rec.message and "exit 3" in rec.message, \
            rec.message
        assert len(list(d.store.events("worker_failed"))) == 2
    finally:
        d.close()
    assert procs_mentioning(str(state)) == []


@pytest.mark.slow
def test_in_the_demos_first_seconds_every_queued_job_says_why_it_waits(tmp_path: Path) -> None:
    from malletrain.cli.demo import demo_config, demo_jobs

    state = tmp_path / "state"
    d = Daemon(demo_config(state, 6, "toy"))
    reasons: list[str] = []
    missing: list[dict] = []

    def look(daemon: Daemon) -> None:
        for j in daemon.api.status_jobs():
            if j["state"] == "pending":
                (reasons.append(j["waiting"]) if j.get("waiting") else missing.append(j))

    try:
        for spec in demo_jobs("toy"):
            d.store.submit(spec)
        d.run(20.0, on_tick=look)
    finally:
        d.close()
    assert reasons and not missing, missing
    assert any(r.startswith("starting: workers importing") for r in reasons), sorted(set(reasons))
    assert procs_mentioning(str(state.resolve())) == []
