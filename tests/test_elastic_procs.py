"""Real-process tests of the torch runtime: grow, shrink, recall, leave; no orphans.

Each test plays the job manager with :class:`tests.clusters.localjob.LocalJob`:
TorchRuntime in this process, workers spawned from their LaunchSpecs in their
own sessions, reports collected on a PULL socket.
"""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.clusters.localjob import LocalJob, Worker, example_command
from malletrain.runtimes.torch_elastic import TorchRuntime
from scavenger.base import AgentGone, AgentUp
from scavenger.hub import AgentHub, WorkerExitedEvent
from scavenger.base import PilotRequest
from scavenger.local import LocalBackend

pytestmark = pytest.mark.slow

BATCH = 4


def _sessions_alive(workers: list[Worker]) -> list[int]:
    """Pids of live processes in any worker's session (a worker leads its own session)."""
    leaders = {w.proc.pid for w in workers}
    alive = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.pid) in leaders and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return alive


def _assert_ranks_agree(workers: list[Worker]) -> None:
    """In every generation, every rank has the same parameters after every step."""
    hashes: dict[tuple[int, int], set[str]] = defaultdict(set)
    for w in workers:
        for e in w.steps():
            hashes[(e["gen"], e["step"])].add(e["hash"])
    split = {k: v for k, v in hashes.items() if len(v) > 1}
    assert not split, f"ranks disagree on parameters at (generation, step): {sorted(split)[:5]}"


def _first_step(w: Worker, gen: int) -> int:
    return w.steps(gen)[0]["step"]


def _last_step(w: Worker, gen: int) -> int:
    return w.steps(gen)[-1]["step"]


def _assert_monotone(w: Worker) -> None:
    steps = [e["step"] for e in w.steps()]
    assert steps == sorted(steps) and len(set(steps)) == len(steps), f"{w.id}: steps not strictly increasing"


def _assert_reports_match(job: LocalJob, worlds: dict[int, int]) -> None:
    assert not job.bad_frames, job.bad_frames
    assert job.reports, "no report reached the monitor"
    for _, rep in job.reports:
        assert rep.job == job.job
        if rep.generation in worlds:
            assert rep.world_size == worlds[rep.generation], rep
        assert rep.samples == BATCH * rep.world_size, rep
    for gen in worlds:
        assert job.reports_in(gen), f"no report from generation {gen}"


def test_grow_shrink_recall_and_leave() -> None:
    cmd = example_command("--model", "mlp", "--width", "64", "--batch", str(BATCH),
                          "--samples", str(10**9), "--trace", "--step-sleep", "0.02")
    with LocalJob("j1", cmd) as job:
        # all started ahead: a worker waits until a generation lists it
        w0, w1, w2, w3 = (job.spawn(w) for w in ("w0", "w1", "w2", "w3"))
        g1, _ = job.set_members(["w0"])
        job.wait_steps("w0", g1, 3)

        # grow 1 -> 2
        g2, _ = job.set_members(["w0", "w1"])
        job.wait_steps("w1", g2, 3)

        # grow 2 -> 3
        g3, _ = job.set_members(["w0", "w1", "w2"])
        job.wait_steps("w2", g3, 3)
        job.wait_steps("w0", g3, 3)

        # planned shrink 3 -> 2: w1 leaves cleanly
        g4, _ = job.set_members(["w0", "w2"])
        assert job.wait_exit("w1") == 0
        job.wait_steps("w2", g4, 3)

        # recall of rank 0: survivors roll back to the last commit and rejoin
        job.kill("w0")
        g5, _ = job.set_members(["w2"])
        job.wait_steps("w2", g5, 3)

        # grow again from the survivor
        g6, _ = job.set_members(["w2", "w3"])
        job.wait_steps("w3", g6, 3)

        # the job ends: everybody leaves with exit 0
        job.set_members([])
        assert job.wait_exit("w2") == 0
        assert job.wait_exit("w3") == 0
        assert w0.proc.returncode == -signal.SIGKILL
        workers = [w0, w1, w2, w3]

        _assert_ranks_agree(workers)
        for w in workers:
            _assert_monotone(w)
        # planned rescales continue from the step where the old world stopped
        assert _first_step(w0, g2) == _last_step(w0, g1) + 1
        assert _first_step(w1, g2) == _first_step(w0, g2)
        assert _first_step(w2, g3) == _first_step(w0, g3) == _last_step(w0, g2) + 1
        assert _first_step(w2, g4) == _last_step(w2, g3) + 1
        # the recall loses at most the step in flight: training resumes after the last commit
        assert _first_step(w2, g5) == _last_step(w2, g4) + 1
        assert _first_step(w3, g6) == _first_step(w2, g6) == _last_step(w2, g5) + 1
        # samples: the counter carried across worlds equals the sum of global batches
        last = w2.steps(g5)[-1]
        assert last["samples"] == sum(BATCH * e["world"] for e in _history(workers, last["step"]))

        kinds = {(w.id, e["kind"]) for w in workers for e in w.rescales()}
        assert {("w0", "up"), ("w2", "down"), ("w2", "recover"), ("w2", "up")} <= kinds
        _assert_reports_match(job, {g1: 1, g2: 2, g3: 3, g4: 2, g5: 1, g6: 2})
    assert _sessions_alive(workers) == []


def _history(workers: list[Worker], upto: int) -> list[dict[str, Any]]:
    """The committed history up to step ``upto``: one entry per step (newest generation wins).

    Any rank's line stands for its step: the ranks of a generation agree on its world, and a rank
    killed mid-step (the recalled rank 0 here) may die after the gradients were averaged but before
    it printed the step its survivors committed.
    """
    by_step: dict[int, dict[str, Any]] = {}
    for w in workers:
        for e in w.steps():
            if e["step"] <= upto:
                prev = by_step.get(e["step"])
                if prev is None or e["gen"] > prev["gen"]:
                    by_step[e["step"]] = e
    return [by_step[s] for s in sorted(by_step)]


def test_join_ahead_then_hung_peer_times_out() -> None:
    """A joining worker does not stall the running one; a stopped (not dead) peer times out.

    Runs the cnn with hand-made gradient averaging instead of DDP.
    """
    cmd = example_command("--model", "cnn", "--batch", str(BATCH), "--samples", str(10**9),
                          "--trace", "--step-sleep", "0.02", "--manual-allreduce")
    with LocalJob("j2", cmd, collective_timeout_s=2.0) as job:
        w0 = job.spawn("w0")
        g0, _ = job.set_members(["w0"])
        job.wait_steps("w0", g0, 3)

        # grow 1 -> 2: w1 starts (imports torch) while w0 keeps training in g0
        w1 = job.spawn("w1")
        g1, t_g1 = job.set_members(["w0", "w1"])
        job.wait_steps("w1", g1, 3)
        assert any(e["t"] > t_g1 for e in w0.steps(g0)), "w0 stopped training while w1 was starting"
        assert _first_step(w0, g1) == _last_step(w0, g0) + 1

        os.killpg(w1.proc.pid, signal.SIGSTOP)  # hangs: no connection reset, only the timeout
        g2, _ = job.set_members(["w0"])
        job.wait_steps("w0", g2, 3)
        assert w0.rescales("recover"), "w0 did not go through recovery"
        assert _first_step(w0, g2) == _last_step(w0, g1) + 1
        job.kill("w1")

        job.set_members([])
        assert job.wait_exit("w0") == 0
        _assert_ranks_agree([w0, w1])
        _assert_monotone(w0)
        workers = [w0, w1]
    assert _sessions_alive(workers) == []


def test_job_finishes_on_all_ranks() -> None:
    """Reaching --samples ends the job: every rank exits 0 with the same parameters."""
    cmd = example_command("--model", "linear", "--batch", str(BATCH), "--samples", "400", "--trace")
    with LocalJob("j3", cmd) as job:
        w0, w1 = job.spawn("w0"), job.spawn("w1")
        job.set_members(["w0", "w1"])
        assert job.wait_exit("w0") == 0
        assert job.wait_exit("w1") == 0
        workers = [w0, w1]
        job.wait_for("the done lines", lambda: all(e["ev"] == "done" for w in workers for e in w.events[-1:]))
        done = [w.events[-1] for w in workers]
        assert done[0]["hash"] == done[1]["hash"]
        assert done[0]["samples"] == done[1]["samples"] == 400 and done[0]["step"] == 50
        assert sum(r.samples for r in job.reports_in(1)) == 400
    assert _sessions_alive(workers) == []


def test_suspend_and_resume_keeps_the_state() -> None:
    """A job whose only worker is stopped (SIGTERM), suspended, forgotten and resumed on a new worker."""
    cmd = example_command("--model", "mlp", "--width", "64", "--batch", str(BATCH),
                          "--samples", str(10**9), "--trace", "--step-sleep", "0.02")
    with LocalJob("j4", cmd) as job:
        w0, w1 = job.spawn("w0"), job.spawn("w1")  # w1 waits ahead, through the suspension
        g1, _ = job.set_members(["w0"])
        job.wait_steps("w0", g1, 5)

        job.kill("w0", signal.SIGTERM)  # a stop or a recall: rank 0 stores its last commit
        assert w0.proc.returncode == 143
        assert job.runtime.checkpoint_generation(job.job) == g1
        job.set_members([])
        job.runtime.forget(job.job)

        g3, _ = job.set_members(["w1"])
        job.wait_steps("w1", g3, 3)
        last = w0.steps(g1)[-1]
        first = w1.steps(g3)[0]
        # the stored state is the last commit: at most the step in flight is done again
        assert first["step"] in (last["step"], last["step"] + 1)
        assert first["samples"] - BATCH in (last["samples"] - BATCH, last["samples"])

        job.set_members([])
        assert job.wait_exit("w1") == 0
        workers = [w0, w1]
    assert _sessions_alive(workers) == []


def _hub_events_until(hub: AgentHub, backend: LocalBackend, pred: Any, timeout_s: float = 90.0) -> list[Any]:
    seen: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while not pred(seen):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met; events: {seen}")
        seen.extend(hub.poll(50))
        seen.extend(backend.poll())
    return seen


def test_agent_and_worker_logs_say_what_happened(tmp_path: Path) -> None:
    """A real agent runs a real torch worker to its end: both log files tell the story."""
    logs = tmp_path / "logs"
    hub = AgentHub(dead_after_s=30.0)
    backend = LocalBackend(1, hub.address, agent_args=("--heartbeat", "0.2", "--key-file", hub.key_file),
                           log_dir=str(logs))
    runtime = TorchRuntime("127.0.0.1", 0)
    runtime.start()
    try:
        backend.submit(PilotRequest(("node00",)))
        _hub_events_until(hub, backend, lambda ev: AgentUp("node00") in ev)
        cmd = example_command("--model", "linear", "--batch", str(BATCH), "--samples", "80")
        spec = runtime.launch_spec("j5", cmd, "w0", "node00")
        hub.start_worker("node00", "w0", spec.argv, spec.env, spec.cwd)
        runtime.set_members("j5", ["w0"])
        ev = _hub_events_until(hub, backend, lambda ev: any(isinstance(e, WorkerExitedEvent) for e in ev))
        assert [e.code for e in ev if isinstance(e, WorkerExitedEvent)] == [0]
        backend.recall("node00")  # SIGTERM on the agent
        _hub_events_until(hub, backend, lambda ev: any(isinstance(e, AgentGone) for e in ev))
        deadline = time.monotonic() + 10
        while backend.agent_pids() and time.monotonic() < deadline:
            backend.poll()
            time.sleep(0.05)
    finally:
        backend.close()
        hub.close()
        runtime.close()

    worker_log = (logs / "w0.log").read_text()
    for line in ("worker w0: connected to the daemon's store", "worker w0: start (job j5, elastic)",
                 "worker w0: join generation 0 -> 1, world 0 -> 1, rank 0",
                 "worker w0: exit at step 20, generation 1: the training function returned"):
        assert line in worker_log, f"{line!r} not in the worker's log:\n{worker_log}"
    agent_log = (logs / "agent-node00.log").read_text()
    for line in ("node node00: agent start", f"daemon {hub.address}", "node node00: worker w0 started, pid",
                 "node node00: worker w0 (pid", "exited with code 0", "SIGTERM: the node is recalled",
                 "agent exit 143, reason: recalled"):
        assert line in agent_log, f"{line!r} not in the agent's log:\n{agent_log}"


def test_a_recall_of_alternate_ranks_fails_every_survivor_at_once() -> None:
    """Ranks 0 and 2 of 4 recalled (SIGTERM): the survivors' collectives fail on the closed connections,
    and the survivor whose peer gave up (not died) is told so at once by that peer's closed group; no
    survivor waits for its collective timeout (before: rank 3 waited it out, 3 s of every such recall)."""
    cmd = example_command("--model", "linear", "--batch", str(BATCH), "--samples", str(10**9),
                          "--trace", "--step-sleep", "0.05")
    with LocalJob("j6", cmd, collective_timeout_s=60.0) as job:
        workers = [job.spawn(w) for w in ("w0", "w1", "w2", "w3")]
        g1, _ = job.set_members(["w0", "w1", "w2", "w3"])
        for w in ("w0", "w1", "w2", "w3"):
            job.wait_steps(w, g1, 3)
        for w in ("w0", "w2"):
            os.killpg(job.workers[w].proc.pid, signal.SIGTERM)
        g2, _ = job.set_members(["w1", "w3"])
        job.wait_steps("w1", g2, 3)
        job.wait_steps("w3", g2, 3)
        why = [line for w in ("w1", "w3") for line in job.workers[w].stderr if "failed (" in line]
        assert len(why) == 2, why
        assert not [line for line in why if "timed out" in line.lower()], why
        job.set_members([])
        assert job.wait_exit("w1") == 0 and job.wait_exit("w3") == 0
    assert _sessions_alive(workers) == []
