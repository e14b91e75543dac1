"""The Lightning and Hugging Face examples under the daemon with ``launcher = "torchrun"``.

Each example (``malletrain.worker.examples.lightning_train``, ``malletrain.worker.examples.hf_train``, with the
framework's malletrain callback) runs as a job on 2 local nodes, through ``python -m
malletrain.worker.launch`` as the runtime wraps it: it trains at 2 nodes, is shrunk by a recall of one,
grown back when the node comes back, and COMPLETED with no failure counted. Each change of its
world restarts every rank; the callback saves on the SIGTERM and the next start resumes at the
next step, so every step is trained, and reported, exactly once: the monitor accepts exactly
``--max-steps`` reports (a lost step would be trained and reported again; a refused report would
fall short). The plain DDP script without a callback, which loses at most the steps since its own
last checkpoint, is ``tests/test_torchrun_launcher.py``'s.

``WORKERS_PER_NODE``: the ranks each node runs (the job file's ``workers_per_node``, and as many
worker slots a local node); a world of N nodes has N x that many ranks, the rank agent of each
node starting its K ranks.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from malletrain.daemon.jobspec import JobSpec, JobState, Launcher
from malletrain.daemon.monitor import JobStats
from malletrain.daemon.store import JobRecord

PY = sys.executable
PACED = str(Path(__file__).parent / "fixtures" / "scripts" / "paced.py")
WORKERS_PER_NODE = [1, 2]
NODES = 2
STEPS = 600
BATCH = 8
HOOK_BATCH = 1000  # the job's worker_batch: were the launcher's hook counting too, the totals would show it
PACE_S = 0.05  # each optimizer step lasts at least this: the test sees every world before the job ends
PLAIN_STEPS = 1500  # a script without the callback restarts from its last checkpoint: more steps, so the grow
# (a returning node's rank servers import transformers first) comes before the job's end at one node


@dataclass(frozen=True)
class Example:
    module: str
    dir_flag: str  # where its checkpoints go
    extra: str  # the pip extra that installs the framework
    framework: str  # the module importorskip looks for


EXAMPLES = {
    "lightning": Example("malletrain.worker.examples.lightning_train", "--ckpt-dir", "lightning", "lightning"),
    "hf": Example("malletrain.worker.examples.hf_train", "--output-dir", "huggingface", "transformers"),
}


def shrink_grow_complete(spec: JobSpec, state: Path) -> tuple[list[int], JobStats, JobRecord, str]:
    """``spec`` under the daemon on 2 local nodes (``spec.workers_per_node`` slots each): trained at 2 nodes,
    shrunk by a recall of one, grown back when it returns, run to its end (COMPLETED, no worker failed,
    no process left). The world sizes its reports came from in order, the monitor's statistics of it,
    its record and its workers' logs."""
    from malletrain.daemon.config import DaemonConfig, LocalConfig
    from malletrain.daemon import Daemon
    from procs import procs_mentioning
    from tests.stepping import step_until

    cfg = DaemonConfig(state_dir=str(state), runtime="toy", local=LocalConfig(nodes=NODES, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=5.0, loop_interval=0.05)
    if spec.workers_per_node > 1:  # local nodes report no GPUs: give each that many worker slots
        cfg = replace(cfg, scavenger=replace(cfg.scavenger, workers_per_node=spec.workers_per_node))
    d = Daemon(cfg)
    worlds: list[int] = []  # the world sizes the job's reports came from, in order
    held: list[JobStats] = []  # the monitor's statistics of the job (kept past its end)

    def trains_at(nodes: int) -> bool:
        stats = d.monitor.jobs.get(jid)
        if stats is not None and not held:
            held.append(stats)
        if stats is not None and stats.reports and (not worlds or worlds[-1] != stats.world_size):
            worlds.append(stats.world_size)
        return bool(worlds) and worlds[-1] == nodes  # the monitor counts a world at the daemon's size, in nodes

    try:
        jid = d.store.submit(spec)
        step_until(d, lambda: trains_at(NODES), 600, f"the job trains at {NODES} nodes")
        victim = d.runs[jid].members[-1]
        d.backend.recall(victim)
        step_until(d, lambda: trains_at(NODES - 1), 600, "the job trains at 1 node after a recall")
        d.backend.make_idle(victim)
        step_until(d, lambda: trains_at(NODES), 600, f"the job trains at {NODES} nodes again")
        step_until(d, lambda: trains_at(NODES) and d.store.require(jid).state.terminal, 900, "the job ends")
        rec = d.store.require(jid)
        assert rec.state is JobState.COMPLETED, rec.message
        events = [e["kind"] for e in d.store.events() if e.get("job") == jid]
        assert "worker_failed" not in events
    finally:
        d.close()
    assert procs_mentioning(str(state)) == []
    logs = "".join(p.read_text(errors="replace") for p in (state / "logs").glob(f"{jid}.*.log"))
    return worlds, held[0], rec, logs


@pytest.mark.slow
@pytest.mark.parametrize("per_node", WORKERS_PER_NODE)
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_framework_job_shrinks_grows_and_completes_losing_no_step(name: str, per_node: int,
                                                                     tmp_path: Path) -> None:
    ex = EXAMPLES[name]
    pytest.importorskip(ex.framework, reason=f"the [{ex.extra}] extra is not installed")
    cmd = (PY, PACED, str(PACE_S), ex.module, "--samples", "1000000", "--batch", str(BATCH),
           "--max-steps", str(STEPS), ex.dir_flag, str(tmp_path / "ckpt"))
    spec = JobSpec(name, cmd, 1, NODES, False, {1: 10.0, 2: 20.0}, env={"OMP_NUM_THREADS": "1"},
                   launcher=Launcher.TORCHRUN, worker_batch=HOOK_BATCH, workers_per_node=per_node)
    worlds, stats, rec, logs = shrink_grow_complete(spec, tmp_path / "state")
    full, less = NODES, NODES - 1  # it may have started at 1 node and grown first
    assert full in worlds and less in worlds[worlds.index(full):], worlds
    assert full in worlds[worlds.index(less, worlds.index(full)):], worlds  # shrunk, then grown back
    # every step reported once: none lost at a restart (trained again), none refused, the hook silent
    assert stats.reports == STEPS, (stats.reports, stats.samples, worlds)
    assert STEPS * BATCH * per_node < stats.samples < STEPS * BATCH * NODES * per_node
    assert stats.samples % (BATCH * per_node) == 0 and rec.samples == stats.samples
    assert logs.count("recall: saved step") >= 2, logs[-4000:]  # the callback saved at each restart
    assert f"done: step {STEPS}" in logs


@pytest.mark.slow
def test_an_unchanged_hf_trainer_script_shrinks_grows_and_completes_without_a_sigkill(tmp_path: Path) -> None:
    """A Hugging Face Trainer script with nothing of malletrain in it (``hf_plain``: its own checkpoints, no
    callback), 2 ranks a node: it trains at 2 nodes, 1, then 2 again, and completes; every change stops its
    ranks within the grace (SIGTERM raises SystemExit in it, from the launcher) and each start resumes
    from its last checkpoint, so each step is reported at least once (those since the last checkpoint twice)."""
    pytest.importorskip("transformers", reason="the [huggingface] extra is not installed")
    cmd = (PY, "-m", "malletrain.worker.examples.hf_plain", "--output-dir", str(tmp_path / "ckpt"),
           "--max-steps", str(PLAIN_STEPS), "--batch", str(BATCH), "--step-sleep", str(PACE_S))
    spec = JobSpec("hf-plain", cmd, 1, NODES, False, {1: 10.0, 2: 20.0}, env={"OMP_NUM_THREADS": "1"},
                   launcher=Launcher.TORCHRUN, worker_batch=BATCH, workers_per_node=2)
    worlds, stats, _, logs = shrink_grow_complete(spec, tmp_path / "state")
    assert NODES in worlds and NODES - 1 in worlds[worlds.index(NODES):], worlds
    assert NODES in worlds[worlds.index(NODES - 1, worlds.index(NODES)):], worlds
    assert "SIGKILL" not in logs, logs[-4000:]
    assert stats.reports >= PLAIN_STEPS and f"done: step {PLAIN_STEPS}" in logs
