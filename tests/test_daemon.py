"""The daemon with real agents and real worker processes (toy runtime: no torch needed).

Elastic behaviour (grow on arrival, shrink on recall, keep training), the
profiler on a real job, completion/failure/cancel, and no orphan processes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest

from procs import procs_mentioning
from malletrain.daemon.config import DaemonConfig, LocalConfig
from malletrain.daemon import Daemon, DaemonError
from malletrain.daemon.jobspec import JobSpec, JobState
from policy import PolicyConfig
from tests.stepping import step_until

TOY = (sys.executable, "-m", "malletrain.worker.toy")


def config(tmp: Path, nodes: int = 3, **kw) -> DaemonConfig:
    return DaemonConfig(state_dir=str(tmp / "state"), runtime="toy", local=LocalConfig(nodes=nodes, trace="none"),
                        agent_heartbeat=0.2, agent_dead_after=4.0, loop_interval=0.05, **kw)


def until(d: Daemon, pred: Callable[[], bool], timeout: float = 20.0) -> None:
    step_until(d, pred, timeout)


@pytest.fixture
def daemon(tmp_path: Path):
    made: list[Daemon] = []

    def make(**kw) -> Daemon:
        d = Daemon(config(tmp_path, **kw))
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()
    assert procs_mentioning(str(tmp_path / "state")) == []


@pytest.mark.slow
def test_job_grows_on_arrival_shrinks_on_recall_and_keeps_training(daemon) -> None:
    d = daemon()
    spec = JobSpec("toy", TOY + ("--rate", "2000"), 1, 3, False, {1: 100.0, 2: 190.0, 3: 270.0})
    jid = d.store.submit(spec)
    run = lambda: d.runs[jid]  # noqa: E731
    # reports at 3 workers, not only a published list of 3: a recall before the first step at 3
    # would leave the monitor nothing at 3 to see a 3 -> 2 rescale from
    until(d, lambda: len(run().members) == 3 and run().last_progress > 0 and d.monitor.jobs[jid].world_size == 3)
    assert d.store.require(jid).state is JobState.RUNNING
    gen = d.runtime.generation(jid)
    # the main scheduler takes a node back: SIGTERM on its agent, the job shrinks and goes on
    victim = run().members[-1]
    d.backend.recall(victim)
    until(d, lambda: len(run().members) == 2)
    assert d.runtime.generation(jid) == gen + 1
    before = run().last_progress
    until(d, lambda: run().last_progress > before + 1000 and d.monitor.jobs[jid].world_size == 2)
    until(d, lambda: d.store.require(jid).samples > before)  # progress persisted
    # the node comes back idle: held again, the job grows to 3
    d.backend.make_idle(victim)
    until(d, lambda: len(run().members) == 3 and d.monitor.jobs[jid].world_size == 3)
    until(d, lambda: {(3, 2), (2, 3)} <= {(r["from_nodes"], r["to_nodes"]) for r in d.store.rescales(jid)})
    rescales = [(r["from_nodes"], r["to_nodes"]) for r in d.store.rescales(jid)]
    assert rescales.index((3, 2)) < len(rescales) - 1 - rescales[::-1].index((2, 3))  # the shrink, then the grow
    assert all(r["pause_s"] >= 0 for r in d.store.rescales(jid))
    states = [s for s, _, _ in d.store.history(jid)]
    assert states[:2] == ["pending", "running"] and "rescaling" in states


@pytest.mark.slow
def test_profiler_runs_on_a_real_job_then_allocator_uses_it(daemon) -> None:
    d = daemon(nodes=4, policy=PolicyConfig(profile_time_cap_s=8.0))
    until(d, lambda: len(d.scav.usable()) == 4)  # every node held: the profile can start at 4
    jid = d.store.submit(JobSpec("prof", TOY + ("--rate", "3000", "--alpha", "0.5"), 1, 4, True))
    until(d, lambda: d.runs[jid].state is JobState.PROFILING)
    assert jid in d.policy.state.profiles  # the policy runs the profile; the daemon acts on it
    until(d, lambda: d.runs[jid].state is JobState.RUNNING and jid not in d.policy.state.profiles, timeout=60)
    measured = d.store.scaling(jid)
    assert {1, 2, 4} <= set(measured), measured  # inverse order: 4, then 2, then 1
    # alpha = 0.5: the toy job's rate grows with its node count (its size is the toy's, not a test figure)
    assert measured[1] < measured[2] < measured[4], measured
    done = [e for e in d.store.events("profile_done") if e["job"] == jid]
    assert done and {int(n) for n in done[0]["measured"]} == {1, 2, 4}  # the policy's event names what it measured
    kinds = [e["kind"] for e in d.store.events() if e["job"] == jid]
    assert kinds.index("profile_start") < kinds.index("profile_done")
    steps = [e["count"] for e in d.store.events("profile_step")]
    assert steps == [2, 1]


@pytest.mark.slow
def test_completion_failure_and_cancel(daemon) -> None:
    d = daemon(max_failures=2)
    done = d.store.submit(JobSpec("done", TOY + ("--rate", "4000"), 1, 1, False, {1: 10.0}, samples=2000))
    exits = d.store.submit(JobSpec("exits", TOY + ("--rate", "4000", "--exit-after-samples", "500"), 1, 1, False, {1: 10.0}))
    bad = d.store.submit(JobSpec("bad", (sys.executable, "-c", "import sys; sys.exit(3)"), 1, 1, False, {1: 10.0}))
    until(d, lambda: all(d.store.require(j).state.terminal for j in (done, exits, bad)), timeout=40)
    assert d.store.require(done).state is JobState.COMPLETED and d.store.require(done).samples >= 2000
    assert d.store.require(exits).state is JobState.COMPLETED
    assert d.store.require(bad).state is JobState.FAILED
    assert "exit 3" in d.store.require(bad).message
    long = d.store.submit(JobSpec("long", TOY + ("--rate", "500"), 1, 3, False, {1: 10.0, 3: 30.0}))
    until(d, lambda: len(d.runs[long].members) == 3)
    d.store.request_cancel(long)  # as the CLI does, maybe while the daemon is down
    until(d, lambda: d.store.require(long).state is JobState.CANCELLED and not d.runs.get(long))
    until(d, lambda: all(not d.hub.workers(n) for n in d.hub.alive()))


def test_second_daemon_on_same_state_dir_is_refused(daemon) -> None:
    daemon(nodes=1)
    with pytest.raises(DaemonError, match="another daemon"):
        daemon(nodes=1)


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    from malletrain.daemon.config import ConfigError, load_config

    f = tmp_path / "d.toml"
    cases = {
        'runtime = "mpi"': "runtime must be one of",
        "tfwd = 60": "tfwd moved to \\[policy\\] tfwd_s",
        "[policy]\ntfwd_s = -1": "policy.tfwd_s must be a finite number > 0",
        "[policy]\nprofiling = \"sometimes\"": "policy.profiling 'sometimes': choose one of never, requested, always",
        "[local]\nnodes = 0": "local.nodes must be >= 1",
        "[local]\nnodes = true": "local.nodes must be an integer",
        "[ports]\ncontrol = 70000": "ports.control must be <= 65535",
        "[ports]\nrendezvous = 70000": "ports.rendezvous must be <= 65535",
        "store_grace = 0": "store_grace must be >=",
        "colour = 1": "unknown key",
        "[local]\nspeed = 1": "local.speed",
        "store_grace = ": "not valid TOML",
    }
    for text, why in cases.items():
        f.write_text(text)
        with pytest.raises(ConfigError, match=why) as info:
            load_config(f)
        assert str(f) in str(info.value)
    f.write_text('runtime = "toy"\n[policy]\ntfwd_s = 30\n[local]\nnodes = 2\ntime_scale = 10\n[ports]\nagents = 5555\n')
    cfg = load_config(f)
    assert (cfg.runtime, cfg.policy.tfwd_s, cfg.local.nodes, cfg.local.time_scale, cfg.ports.agents) == \
        ("toy", 30.0, 2, 10.0, 5555)
    f.write_text('store_grace = 20\n[ports]\nrendezvous = 29500\n')
    cfg = load_config(f)
    assert (cfg.store_grace, cfg.ports.rendezvous) == (20.0, 29500)


def test_generations_are_kept_and_never_go_backwards(tmp_path: Path) -> None:
    from malletrain.daemon.store import Store

    store = Store.open(tmp_path / "store.db")
    assert store.generation("j000001") == 0
    store.set_generation("j000001", 3)
    store.set_generation("j000001", 2)  # a late writer never moves it back
    store.set_generation("j000002", 1)
    store.close()
    again = Store.open(tmp_path / "store.db")
    assert (again.generation("j000001"), again.generation("j000002")) == (3, 1)


def test_rescale_across_a_suspension_is_a_resume_not_a_pause() -> None:
    from malletrain.daemon import rescale_kind
    from profiler.estimators import RescaleEvent

    waited = RescaleEvent(from_size=1, to_size=2, pause_s=38.0, timestamp=100.0, gap_s=38.5)
    assert rescale_kind(waited, emptied_at=110.0) == "resume"
    assert rescale_kind(waited, emptied_at=None) == "up"
    assert rescale_kind(waited, emptied_at=90.0) == "up"  # emptied before: an older suspension
    shrink = RescaleEvent(from_size=3, to_size=2, pause_s=0.1, timestamp=200.0, gap_s=0.2)
    assert rescale_kind(shrink, emptied_at=110.0) == "down"
