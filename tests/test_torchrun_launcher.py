"""``launcher = "torchrun"``: a plain DDP script written for torchrun runs under the daemon unchanged.

Unit tests of the daemon side (the command wrapping, rank places, the world key) and the rank
agent's moves, then the real thing: the example script (``malletrain.worker.examples.torchrun_ddp``,
gloo on CPU) on 3 local nodes, shrunk by a recall, grown back, restarted with its own
checkpoint each time, and COMPLETED with no failure counted and no process left behind.
"""

from __future__ import annotations

import os
import sys
from typing import Any
from pathlib import Path

import pytest

from contract.storekeys import BadKey, DAEMON_KINDS, KeyKind, arrive_key, done_key, parse_key, world_key
from malletrain.worker.examples.tracelog import torchrun_steps
from malletrain.daemon.jobspec import JobSpec, JobState, Launcher
from malletrain.runtimes.torchrun import LAUNCH_MODULE, launch_module_present, wrap_python_command
from contract.world import World, rank_places
from malletrain.worker.torchrun_agent import RANK_TRANSITIONS, RankState, exit_code
from contract.workerenv import RankPlace
from stepping import wait_until

PY = sys.executable
WORKERS_PER_NODE = [1, 2]
"""The ranks each node runs in the daemon test (the job file's ``workers_per_node``)."""


def test_python_commands_run_through_the_launch_module_once_it_exists() -> None:
    assert wrap_python_command((PY, "train.py", "--lr", "1"), True) == (PY, "-m", LAUNCH_MODULE, "train.py", "--lr", "1")
    assert wrap_python_command(("python3", "-m", "pkg.train", "-x"), True) == \
        ("python3", "-m", LAUNCH_MODULE, "-m", "pkg.train", "-x")
    assert wrap_python_command((PY, "train.py"), False) == (PY, "train.py")  # not installed: as given
    assert wrap_python_command(("bash", "run.sh"), True) == ("bash", "run.sh")
    assert wrap_python_command((PY, "-u", "train.py"), True) == (PY, "-u", "train.py")  # interpreter flags


def test_ranks_are_numbered_node_by_node_as_torchrun_does() -> None:
    one = rank_places([("w0", "n3"), ("w1", "n1"), ("w2", "n2")])
    assert [one[w].rank for w in ("w0", "w1", "w2")] == [0, 1, 2]
    assert one["w1"] == RankPlace(group_rank=1, group_world_size=3, local_rank=0, local_world_size=1)
    two = rank_places([("a0", "n1"), ("b0", "n2"), ("a1", "n1"), ("b1", "n2")])  # K = 2 workers a node
    assert {w: (p.rank, p.local_rank, p.group_rank, p.world_size) for w, p in two.items()} == {
        "a0": (0, 0, 0, 4), "a1": (1, 1, 0, 4), "b0": (2, 0, 1, 4), "b1": (3, 1, 1, 4)}
    with pytest.raises(ValueError, match="same number of workers"):
        rank_places([("a0", "n1"), ("a1", "n1"), ("b0", "n2")])


def test_the_world_key_round_trips_and_a_bad_one_is_named() -> None:
    world = World(3, rank_places([("w0", "n1"), ("w1", "n2")]))
    assert World.parse(world.to_json(), "k") == world
    for bad in (b"{", b'{"restart_count": -1, "places": {}}', b'{"restart_count": 0, "places": {"w": [1, 1, 0, 1]}}'):
        with pytest.raises(ValueError, match="mt/j1/world/2: not a torchrun world"):
            World.parse(bad, "mt/j1/world/2")


def test_the_world_key_is_the_daemons_and_done_is_the_workers() -> None:
    assert parse_key(world_key("j1", 4)).kind is KeyKind.WORLD and KeyKind.WORLD in DAEMON_KINDS
    assert parse_key(done_key("j1", 4)).kind is KeyKind.DONE and KeyKind.DONE not in DAEMON_KINDS
    with pytest.raises(BadKey):
        parse_key("mt/j1/world/x")


def test_a_newer_world_can_take_a_rank_agent_from_any_state() -> None:
    for state, moves in RANK_TRANSITIONS.items():
        assert RankState.FORMING in moves, state
    assert RankState.RUNNING not in RANK_TRANSITIONS[RankState.WAITING]  # never without forming a world
    assert exit_code(-15) == 143 and exit_code(3) == 3


def rank0_steps(logs: Path, job: str) -> list[tuple[int, int, int]]:
    """(step, world, restart) of every step rank 0 printed, in the order of restarts then steps."""
    out = [(s["step"], s["world"], s["restart"]) for path in logs.glob(f"{job}.*.log")
           for s in torchrun_steps(path) if s["rank"] == 0]
    return sorted(out, key=lambda s: (s[2], s[0]))


@pytest.mark.slow
@pytest.mark.parametrize("per_node", WORKERS_PER_NODE)
def test_a_plain_ddp_script_shrinks_on_recall_grows_back_and_completes(per_node: int, tmp_path: Path) -> None:
    """3 nodes of ``per_node`` ranks each (local nodes report no GPUs: ``[scavenger] workers_per_node``
    gives them the slots, the job file's ``workers_per_node`` asks for them): worlds of 3 x and 2 x
    ``per_node`` ranks."""
    from dataclasses import replace

    pytest.importorskip("torch")
    from malletrain.daemon.config import DaemonConfig, LocalConfig
    from malletrain.daemon import Daemon
    from procs import procs_mentioning
    from tests.stepping import step_until

    state = tmp_path / "state"
    cfg = DaemonConfig(state_dir=str(state), runtime="toy", local=LocalConfig(nodes=3, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=5.0, loop_interval=0.05)
    if per_node > 1:
        cfg = replace(cfg, scavenger=replace(cfg.scavenger, workers_per_node=per_node))
    # enough steps that a node's return under load (a new pilot importing torch: 20-30 s at load 20)
    # comes before the job ends at 2 nodes: with 400 it finished first 2 runs in 3 at load 20-26
    steps, every = 900, 10
    cmd = (PY, "-m", "malletrain.worker.examples.torchrun_ddp", "--steps", str(steps), "--batch", "4",
           "--checkpoint", str(tmp_path / "ddp.pt"), "--checkpoint-every", str(every), "--step-sleep", "0.1")
    spec = JobSpec("ddp", cmd, 1, 3, False, {1: 10.0, 2: 20.0, 3: 30.0}, env={"OMP_NUM_THREADS": "1"},
                   launcher=Launcher.TORCHRUN, worker_batch=4, workers_per_node=per_node)
    full, less = 3 * per_node, 2 * per_node
    d = Daemon(cfg)
    logs = state / "logs"
    try:
        jid = d.store.submit(spec)
        seen = lambda world: any(w == world for _, w, _ in rank0_steps(logs, jid))  # noqa: E731
        step_until(d, lambda: len(d.runs[jid].members) == 3 and seen(full), 240, "the job trains at 3 nodes")
        victim = d.runs[jid].members[-1]
        d.backend.recall(victim)
        step_until(d, lambda: seen(less), 240, "the job trains at 2 nodes after a recall")
        d.backend.make_idle(victim)
        step_until(d, lambda: any(w == full and r >= 2 for _, w, r in rank0_steps(logs, jid)), 240,
                   "the job trains at 3 nodes again")
        step_until(d, lambda: d.store.require(jid).state.terminal, 600, "the job ends")
        rec = d.store.require(jid)
        assert rec.state is JobState.COMPLETED, rec.message
        samples = max(rec.samples, d.runs[jid].last_progress) if jid in d.runs else rec.samples
        events = [e["kind"] for e in d.store.events() if e.get("job") == jid]
        assert "worker_failed" not in events
    finally:
        d.close()
    ran = rank0_steps(logs, jid)
    worlds = [w for _, w, _ in ran]
    assert full in worlds and less in worlds and worlds.index(less) > worlds.index(full) and worlds[-1] == full
    assert ran[-1][0] == steps  # it trained every step
    by_restart: dict[int, list[int]] = {}
    for step, _, restart in ran:
        by_restart.setdefault(restart, []).append(step)
    counts = sorted(by_restart)
    assert counts[0] == 0 and len(counts) >= 3  # each world a restart, counted up
    for before, after in zip(counts, counts[1:]):
        last, first = max(by_restart[before]), min(by_restart[after])
        # resumed from its own checkpoint: at most the steps since it, never from the start
        assert last - every <= first - 1 <= last, (before, last, after, first)
    assert procs_mentioning(str(state)) == []
    if launch_module_present():  # the progress hook: rank 0 reports worker_batch x world size a step
        trained = sum(4 * world for _, world, _ in ran)
        assert abs(samples - trained) <= 0.01 * trained, (samples, trained)


class FakeRendezvous:
    """The store keys a rank agent uses, in a dict (the daemon's side written by the test)."""

    def __init__(self, worker: str = "w0") -> None:
        self.job, self.worker = "j1", worker
        self.keys: dict[str, bytes] = {}
        self.counters: dict[str, int] = {}
        self.gen = 0

    def publish(self, members: list[str], restart: int, nodes: dict[str, str] | None = None) -> None:
        self.gen += 1
        places = rank_places([(w, (nodes or {}).get(w, w)) for w in members])
        self.keys[world_key(self.job, self.gen)] = World(restart, places).to_json().encode()
        self.keys[f"members/{self.gen}"] = ",".join(members).encode()

    def generation(self) -> int:
        return self.gen

    def published(self, gen: int) -> bool:
        return f"members/{gen}" in self.keys

    def members(self, gen: int) -> tuple[str, ...] | None:
        raw = self.keys.get(f"members/{gen}")
        return tuple(raw.decode().split(",")) if raw is not None else None

    def read(self, key: str) -> bytes | None:
        return self.keys.get(key)

    def add(self, key: str, delta: int) -> int:
        self.counters[key] = self.counters.get(key, 0) + delta
        return self.counters[key]

    def mark_ready(self) -> None:
        pass

    def local_host(self) -> str:
        return "127.0.0.1"

    def publish_group(self, gen: int, host: str, port: int, token: str) -> None:
        self.keys[f"pg/{gen}"] = f"{host} {port} {token}".encode()

    def wait_group(self, gen: int, wait_s: float) -> tuple[str, int, str] | None:
        raw = self.keys.get(f"pg/{gen}")
        if raw is None:
            return None
        host, port, token = raw.decode().split(" ")
        return host, int(port), token


def _agent(rdzv: FakeRendezvous, code: str, tmp_path: Path, failure_wait_s: float = 600.0):
    from malletrain.worker.torchrun_agent import RankAgent

    script = tmp_path / "rank.py"
    script.write_text(code)
    return RankAgent(rdzv, (PY, str(script)), stop_grace_s=5.0, failure_wait_s=failure_wait_s)  # type: ignore[arg-type]


def _tick_until(agent, state: RankState, limit: int = 2000) -> None:
    import time

    for _ in range(limit):
        assert agent.tick() is None
        if agent.state is state:
            return
        time.sleep(0.01)
    raise AssertionError(f"agent stayed {agent.state}, not {state}")


ENV_TO_FILE = """import os, sys
with open(sys.argv[0] + ".env", "a") as fh:
    fh.write(" ".join(os.environ[k] for k in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "MASTER_PORT")) + "\\n")
sys.exit(int(os.environ["TORCHELASTIC_RESTART_COUNT"]) == 0 and 3 or 0)
"""


def test_a_rank_whose_command_failed_waits_for_a_newer_world_and_restarts_in_it(tmp_path: Path) -> None:
    rdzv = FakeRendezvous()
    agent = _agent(rdzv, ENV_TO_FILE, tmp_path)
    rdzv.publish(["w0"], 0)
    _tick_until(agent, RankState.FAILED)  # exit 3 (a peer recalled, say): not reported yet
    rdzv.publish(["w0"], 1)  # the daemon's newer world
    _tick_until(agent, RankState.FINISHED)
    starts = [line.split() for line in (tmp_path / "rank.py.env").read_text().splitlines()]
    assert [s[:3] for s in starts] == [["0", "1", "0"], ["0", "1", "1"]]  # restart counted up
    assert starts[0][3] != "" and agent.tick() == 0  # every rank (one) exited 0: complete


WORKER_TO_FILE = """import os, sys
with open(sys.argv[0] + ".worker", "a") as fh:
    fh.write(os.environ["MALLETRAIN_WORKER"] + " " + os.environ["MALLETRAIN_INCARNATION"] + "\\n")
sys.exit(int(os.environ["TORCHELASTIC_RESTART_COUNT"]) == 0 and 3 or 0)
"""


def test_each_start_of_a_rank_reports_as_a_new_incarnation_of_its_name(tmp_path: Path) -> None:
    """A restarted rank's reports are numbered from 1 again: as the same sender the monitor would refuse
    them as replays, and the daemon's sample count would miss every world after the first. Its name stays
    the rank's; the incarnation (the world's restart count) tells the starts apart."""
    from malletrain.daemon.monitor import ReplayWindow

    rdzv = FakeRendezvous()
    agent = _agent(rdzv, WORKER_TO_FILE, tmp_path)
    agent._env["MALLETRAIN_WORKER"] = "w0"
    rdzv.publish(["w0"], 0)
    _tick_until(agent, RankState.FAILED)
    rdzv.publish(["w0"], 1)
    _tick_until(agent, RankState.FINISHED)
    senders = [line.split() for line in (tmp_path / "rank.py.worker").read_text().splitlines()]
    assert senders == [["w0", "0"], ["w0", "1"]]  # one name, two incarnations
    window = ReplayWindow()
    for t, (name, incarnation) in enumerate(senders):
        assert window.admit(name, 1, float(t), int(incarnation)) == 0  # each start's first report is accepted


def test_a_failure_counts_once_no_newer_world_comes(tmp_path: Path) -> None:
    rdzv = FakeRendezvous()
    agent = _agent(rdzv, "import sys; sys.exit(3)", tmp_path, failure_wait_s=0.0)
    rdzv.publish(["w0"], 0)
    _tick_until(agent, RankState.FAILED)
    assert agent.tick() == 3


def test_a_failure_on_every_rank_counts_at_once_without_waiting_for_a_newer_world(tmp_path: Path) -> None:
    """A script that crashes at start crashes on every rank: no newer world can help, so the failure
    counts at once, not after ``failure_wait_s``; with a rank still running it waits as before."""
    rdzv = FakeRendezvous()
    agent = _agent(rdzv, "import sys; sys.exit(3)", tmp_path, failure_wait_s=600.0)
    rdzv.publish(["w0"], 0)
    _tick_until(agent, RankState.FAILED)
    assert agent.tick() == 3
    two = FakeRendezvous("a")
    first = _agent(two, "import sys; sys.exit(3)", tmp_path, failure_wait_s=600.0)
    two.publish(["a", "b"], 0, {"a": "n1", "b": "n2"})
    first.tick()
    two.add(f"mt/j1/arrive/{two.gen}", 1)  # b arrives
    _tick_until(first, RankState.FAILED)
    assert first.tick() is None  # b still runs: a lost peer's world may come
    two.add(f"mt/j1/failed/{two.gen}", 1)  # b failed too
    assert first.tick() == 3
    stopped = _agent(FakeRendezvous(), "import os, signal; os.kill(os.getpid(), signal.SIGTERM)", tmp_path,
                     failure_wait_s=600.0)
    stopped.rdzv.publish(["w0"], 0)
    _tick_until(stopped, RankState.FAILED)
    assert stopped.tick() is None  # a stop (a recall's SIGTERM) is no crash: it waits for a newer world


def test_a_world_without_it_stops_its_command_and_it_waits(tmp_path: Path) -> None:
    rdzv = FakeRendezvous()
    agent = _agent(rdzv, "import time; time.sleep(600)", tmp_path)
    rdzv.publish(["w0"], 0)
    _tick_until(agent, RankState.RUNNING)
    child = agent.child
    rdzv.publish(["w9"], 1)
    assert agent.tick() is None and agent.state is RankState.WAITING
    assert child is not None and child.returncode == -15  # SIGTERM, within the grace


def test_a_world_that_forms_at_once_starts_its_ranks_in_the_look_that_sees_it(tmp_path: Path) -> None:
    """A newer world goes on forming in the same look of the agent (before, it waited for the next one, a
    pause of the whole job at every change), and the agent looks again sooner while a world forms."""
    from malletrain.worker.torchrun_agent import POLL_S

    rdzv = FakeRendezvous()
    agent = _agent(rdzv, "import time; time.sleep(600)", tmp_path)
    rdzv.publish(["w0"], 0)
    assert agent.tick() is None and agent.state is RankState.RUNNING  # named, nothing to stop: started
    assert agent.pause() == POLL_S
    rdzv.publish(["w0", "w1"], 1)
    assert agent.tick() is None and agent.state is RankState.FORMING  # w1 has not arrived
    assert agent.pause() < POLL_S
    rdzv.add(arrive_key("j1", rdzv.gen), 1)
    _tick_until(agent, RankState.RUNNING)
    assert agent.pause() == POLL_S
    agent.stop_child()


def test_a_rank_that_finished_waits_for_every_other_rank(tmp_path: Path) -> None:
    rdzv = FakeRendezvous("a")
    agent = _agent(rdzv, "pass", tmp_path)
    rdzv.publish(["a", "b"], 0, {"a": "n1", "b": "n2"})
    assert agent.tick() is None and agent.state is RankState.FORMING
    assert agent.tick() is None and agent.state is RankState.FORMING  # rank 0 waits for b at the barrier
    rdzv.add(f"mt/j1/arrive/{rdzv.gen}", 1)  # b arrives
    _tick_until(agent, RankState.FINISHED)
    assert agent.tick() is None  # b still trains
    rdzv.add(done_key("j1", rdzv.gen), 1)
    assert agent.tick() == 0


def test_the_job_file_launcher_chooses_the_runtime_whatever_the_trainers(tmp_path: Path) -> None:
    """On fakes: a torchrun job's workers are rank agents of the torchrun runtime (the daemon's own
    runtime is a fake), told the job's worker_batch; its world's places reach the store once its
    agents are ready; an in-process job beside it runs its command as given."""
    from contract.storekeys import ready_key
    from malletrain.runtimes.torchrun import AGENT_MODULE
    from contract.workerenv import ENV_RUNTIME, ENV_WORKER_BATCH
    from policy import PolicyConfig
    from tests.test_conformance import LINEAR, NODES, Harness

    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    started: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {}
    real = h.daemon.hub.start_worker

    def record(node, worker, argv, env, cwd, uid=None, gid=None, slots=1, umask=None,  # type: ignore[no-untyped-def]
               starts_own_ranks=False):
        started[worker] = (tuple(argv), dict(env))
        real(node, worker, argv, env, cwd, uid, gid, slots=slots, umask=umask, starts_own_ranks=starts_own_ranks)

    h.daemon.hub.start_worker = record  # type: ignore[method-assign]
    try:
        h.cluster.became_idle(*NODES[:3])
        ddp = h.daemon.store.submit(JobSpec("ddp", (PY, "train.py"), 2, 2, launcher=Launcher.TORCHRUN, worker_batch=16))
        plain = h.daemon.store.submit(JobSpec("plain", ("true",), 1, 1))
        for jid in (ddp, plain):
            h.monitor.curves[jid] = dict(LINEAR)
        h.run_until(5.0)
        ours = {w: v for w, v in started.items() if w.startswith(ddp)}
        assert len(ours) == 2
        for argv, env in ours.values():
            assert argv[1:3] == ("-m", AGENT_MODULE) and argv[argv.index("--") + 1:] == wrap_python_command((PY, "train.py"))
            assert env[ENV_RUNTIME] == "torchrun" and env[ENV_WORKER_BATCH] == "16"
        assert [argv for w, (argv, _) in started.items() if w.startswith(plain)] == [("true",)]
        store = h.daemon.torchrun._require_store()  # type: ignore[attr-defined]
        for worker in ours:
            store.set(ready_key(ddp, worker), "1")  # the agents connected
        h.run_until(8.0)
        run = h.daemon.runs[ddp]
        assert len(run.members) == 2
        gen = h.daemon.torchrun.torch.generation(ddp)  # type: ignore[attr-defined]
        world = World.parse(store.get(world_key(ddp, gen)), "world")
        assert world.restart_count == 0
        assert sorted(p.rank for p in world.places.values()) == [0, 1]
        assert [world.places[w].rank for w in run.published] == [0, 1]  # one worker a node: the list's order
    finally:
        h.close()


def test_a_recall_after_every_rank_finished_completes_the_job_and_starts_nothing(tmp_path: Path) -> None:
    """On fakes (the torchrun runtime real): every rank of a job's world exited 0 (the world's done count
    is full) but its rank agents have not exited yet, as on a loaded node; a node of the job is recalled
    in that gap. The job ends COMPLETED from the count and no worker of it starts again (before, the
    recall published a new world and the work ran again)."""
    from policy import PolicyConfig
    from tests.test_conformance import NODES, Harness

    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    try:
        h.cluster.became_idle(*NODES[:3])
        jid, store, run, gen = _training_on_two_nodes(h, "element")
        store.add(done_key(jid, gen), 2)  # both ranks exited 0; their agents still run
        started = list(h.cluster.started)
        h.cluster.recall(run.members[0])
        h.run_until(20.0)
        rec = h.daemon.store.require(jid)
        assert rec.state is JobState.COMPLETED, rec.message
        assert "exited 0" in rec.message
        assert h.cluster.started == started  # nothing started again
        assert not any(e.get("job") == jid and e["generation"] > gen and e.get("nodes")
                       for e in h.events("members"))  # no new world published
    finally:
        h.close()


def _training_on_two_nodes(h: Any, name: str) -> tuple[str, Any, Any, int]:
    """On the fakes' harness with idle nodes: a 2-node torchrun job submitted, its agents connected and its
    world published and running; (job id, the launcher's store, its run, the world's generation)."""
    from contract.storekeys import ready_key
    from tests.test_conformance import LINEAR

    jid = h.daemon.store.submit(JobSpec(name, (PY, "train.py"), 2, 2, launcher=Launcher.TORCHRUN))
    h.monitor.curves[jid] = dict(LINEAR)
    h.run_until(5.0)
    store = h.daemon.torchrun._require_store()
    for _, worker in h.cluster.started:
        store.set(ready_key(jid, worker), "1")  # the agents connected
    h.run_until(8.0)
    run = h.daemon.runs[jid]
    assert len(run.members) == 2 and h.daemon.store.require(jid).state is JobState.RUNNING
    return jid, store, run, h.daemon.torchrun.torch.generation(jid)


@pytest.mark.parametrize("nodes", [2, 3], ids=["suspended", "moved"])
def test_a_last_rank_exiting_0_between_observe_and_act_completes_the_job_and_starts_nothing(
        tmp_path: Path, nodes: int) -> None:
    """On fakes (the torchrun runtime real), one loop step driven piece by piece: a node of a running
    torchrun job is recalled, observe looks (the world's done count is not full yet), then the job's
    last rank exits 0 (its count becomes full) before act carries out the plan that takes the recalled
    node away (the job below its min: suspended; or moved onto a free node). The job ends COMPLETED,
    no worker of it starts again and no new world of it is published (before, act suspended or moved
    the world and the work ran again once it was placed)."""
    from policy import PolicyConfig
    from tests.test_conformance import NODES, Harness

    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    try:
        h.cluster.became_idle(*NODES[:nodes])
        jid, store, run, gen = _training_on_two_nodes(h, "trial")
        started = list(h.cluster.started)
        store.add(done_key(jid, gen), 1)  # one rank exited 0: not done yet when observe looks
        act, plans = h.daemon.act.act, []

        def last_rank_exits_then_act(now: float, plan):  # type: ignore[no-untyped-def]
            if not plans:  # the step of the recall: observe and decide are over, act is next
                assert h.daemon.runs[jid].ending is None  # observe saw the job as running
                assert set(plan.nodes.get(jid, ())) != set(run.members)  # the plan changes its world
                store.add(done_key(jid, gen), 1)  # the last rank exits 0 now
            plans.append(plan)
            return act(now, plan)

        h.daemon.act.act = last_rank_exits_then_act  # type: ignore[method-assign]
        h.cluster.recall(run.members[0])
        h.run_until(20.0)
        rec = h.daemon.store.require(jid)
        assert rec.state is JobState.COMPLETED, rec.message
        assert "exited 0" in rec.message
        assert h.cluster.started == started  # nothing started again
        assert not any(e.get("job") == jid and e["generation"] > gen and e.get("nodes")
                       for e in h.events("members"))  # no new world published
        assert [e["to"] for e in h.events("state") if e.get("job") == jid][-1:] == ["completed"]
        assert "suspended" not in [e["to"] for e in h.events("state") if e.get("job") == jid]
        assert [e["job"] for e in h.events("world_done")] == [jid]  # act saw it done, once, and left it
    finally:
        h.close()


def test_the_torchrun_runtime_is_built_on_a_torch_runtime_it_holds() -> None:
    """Composition, not inheritance: the torchrun launcher's runtime holds a ``torch`` runtime (its store,
    generations and member lists) and adds the worlds' places to it."""
    from malletrain.runtimes.torch_elastic import TorchRuntime
    from malletrain.runtimes.torchrun import TorchrunRuntime

    rt = TorchrunRuntime()
    assert not isinstance(rt, TorchRuntime) and isinstance(rt.torch, TorchRuntime) and rt.torch.worlds is rt
    assert rt.world_keys("j1", 3) == [world_key("j1", 3), done_key("j1", 3), "mt/j1/failed/3", "mt/j1/pg/3"]


def test_the_runtime_numbers_restarts_and_drops_old_worlds(tmp_path: Path) -> None:
    from malletrain.runtimes.torchrun import TorchrunRuntime

    rt = TorchrunRuntime()
    try:
        for w, node in (("j1.a", "n1"), ("j1.b", "n2")):
            argv = rt.launch_spec("j1", (PY, "train.py"), w, node).argv
            assert argv[argv.index("--") + 1:] == (PY, "-m", LAUNCH_MODULE, "train.py")  # through the launcher
        store = rt._require_store()
        gens = [rt.set_members("j1", m) for m in (["j1.a"], ["j1.a", "j1.b"], ["j1.b"], ["j1.b", "j1.a"])]
        worlds = {g: World.parse(store.get(world_key("j1", g)), "w") for g in gens[-2:]}
        assert [w.restart_count for w in worlds.values()] == [2, 3]
        assert worlds[gens[-1]].places["j1.b"].rank == 0 and worlds[gens[-1]].places["j1.a"].rank == 1
        assert not store.check([world_key("j1", gens[0])]) and not store.check([world_key("j1", gens[1])])
        gen = rt.set_members("j1", [])  # suspended: no world, no restart counted
        rt.forget("j1")
        rt.launch_spec("j1", (PY, "train.py"), "j1.c", "n3")
        resumed = rt.set_members("j1", ["j1.c"])
        assert resumed > gen and World.parse(store.get(world_key("j1", resumed)), "w").restart_count == 4
    finally:
        rt.close()
    rt = TorchrunRuntime()  # a restarted daemon: the job had published 5 worlds (the event log)
    try:
        rt.resume_generation("j1", resumed)
        rt.resume_worlds("j1", 5)
        rt.readopt("j1", (PY, "train.py"), {"j1.c": "n3"})
        again = rt.set_members("j1", ["j1.c"])
        assert again > resumed and World.parse(rt._require_store().get(world_key("j1", again)), "w").restart_count == 5
    finally:
        rt.close()


def test_a_stop_stops_the_command_and_exits_143(tmp_path: Path) -> None:
    import threading

    rdzv = FakeRendezvous()
    agent = _agent(rdzv, "import time; time.sleep(600)", tmp_path)
    rdzv.publish(["w0"], 0)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(agent.run()))
    thread.start()
    try:
        import time

        deadline = time.monotonic() + 60
        while agent.state is not RankState.RUNNING and time.monotonic() < deadline:
            time.sleep(0.02)
        child = agent.child
        assert child is not None
    finally:
        agent.stop_requested = True  # what its SIGTERM handler does (a recall, a cancel)
        thread.join(60)
    assert result == [143] and child.returncode == -15


DAEMON = """
state_dir = "{state}"
runtime = "toy"
loop_interval = 0.05
agent_heartbeat = 0.2
agent_dead_after = 10.0
store_grace = 45.0
backend = "local"
[local]
nodes = 2
trace = "none"
"""

TORCHRUN_JOB = """
name = "ddp"
command = ["{python}", "-m", "malletrain.worker.examples.torchrun_ddp", "--steps", "100000000", "--batch", "4",
           "--checkpoint", "{ckpt}", "--checkpoint-every", "10", "--step-sleep", "0.05"]
launcher = "torchrun"
worker_batch = 4
min_nodes = 2
max_nodes = 2
scaling = {{ 1 = 10.0, 2 = 20.0 }}
env = {{ OMP_NUM_THREADS = "1" }}
"""


@pytest.mark.slow
@pytest.mark.parametrize("per_node", WORKERS_PER_NODE)
def test_a_torchrun_job_rides_through_a_daemon_kill_9(per_node: int, tmp_path: Path) -> None:
    """kill -9 of the daemon: the ranks train on; the restarted daemon serves the launcher's store on
    the same port, re-adopts the rank agents and publishes their world again, which changes nothing:
    no rank is restarted (with ``per_node`` ranks a node: the new daemon learns each agent's K from
    its ready key)."""
    pytest.importorskip("torch")
    import signal
    import time

    from malletrain.daemon.store import Store
    from procs import procs_mentioning
    from tests.test_daemon_cli import cli, start_daemon

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    cfg = tmp_path / "daemon.toml"
    # The node agents wait for the restarted daemon as long as the product's default does: a daemon's
    # start under load can take more than the module's 10 s, and agents that gave up stop their ranks.
    patient = DAEMON.replace("agent_dead_after = 10.0", "agent_dead_after = 30.0")
    cfg.write_text(patient.format(state=state) + f"[scavenger]\nworkers_per_node = {per_node}\n")
    (tmp_path / "job.toml").write_text(TORCHRUN_JOB.format(python=PY, ckpt=tmp_path / "ddp.pt")
                                       + f"workers_per_node = {per_node}\n")
    log = tmp_path / "daemon.log"
    d = start_daemon(cfg, log)
    try:
        wait_until(lambda: (state / "daemon.json").exists(), "daemon.json", timeout=60)
        res = cli("submit", str(tmp_path / "job.toml"), "--state-dir", str(state))
        assert res.returncode == 0, res.stderr
        jid = res.stdout.strip()
        logs = state / "logs"
        wait_until(lambda: sum(w == 2 * per_node for _, w, _ in rank0_steps(logs, jid)) >= 10, "steps at 2 nodes",
             timeout=240)
        d.send_signal(signal.SIGKILL)
        d.wait(timeout=10)
        t_kill = time.time()
        d = start_daemon(cfg, log)
        def republished() -> float | None:  # its two agents ready in the new daemon's store, their world published
            return next((e["time"] for e in Store.open(state / "store.db").events("members")
                         if e["job"] == jid and len(e.get("nodes") or ()) == 2 and e["time"] > t_kill), None)

        t_published = wait_until(republished, "the world published again by the new daemon", timeout=120)
        wait_until(lambda: any(s["t"] > t_published + 2 for p in logs.glob(f"{jid}.*.log") for s in torchrun_steps(p)),
             "steps after the new daemon published the world", timeout=120)
        ran = [s for p in logs.glob(f"{jid}.*.log") for s in torchrun_steps(p)]
        assert {s["restart"] for s in ran} == {0}  # never restarted: the world went on through the kill
        assert any(t_kill < s["t"] for s in ran)
        assert len(list(logs.glob(f"{jid}.*.log"))) == 2  # the same two rank agents
        assert Store.open(state / "store.db").require(jid).state is JobState.RUNNING
    finally:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
            d.wait(timeout=60)
    wait_until(lambda: not procs_mentioning(str(state)), "no orphans", timeout=30)


@pytest.mark.slow
def test_a_broken_script_ends_failed_with_its_exit_status(tmp_path: Path) -> None:
    """A command that fails at once, on every rank, with no recall: each failure counts (after the
    agents' wait for a newer world), and the job ends FAILED naming the exit status."""
    from malletrain.daemon.config import DaemonConfig, LocalConfig
    from malletrain.daemon import Daemon
    from procs import procs_mentioning
    from tests.stepping import step_until

    script = tmp_path / "broken.py"
    script.write_text("import sys\nprint('broken on purpose', flush=True)\nsys.exit(3)\n")
    state = tmp_path / "state"
    cfg = DaemonConfig(state_dir=str(state), runtime="toy", local=LocalConfig(nodes=2, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=5.0, loop_interval=0.05, max_failures=2)
    d = Daemon(cfg)
    d.torchrun.failure_wait_s = 0.5
    try:
        jid = d.store.submit(JobSpec("broken", (PY, str(script)), 1, 2, False, {1: 1.0, 2: 2.0},
                                     launcher=Launcher.TORCHRUN))
        step_until(d, lambda: d.store.require(jid).state.terminal, 240, "the job ends")
        rec = d.store.require(jid)
        assert rec.state is JobState.FAILED and "exit 3" in rec.message, rec.message
    finally:
        d.close()
    assert procs_mentioning(str(state)) == []


def test_the_same_world_published_again_keeps_every_rank_going(tmp_path: Path) -> None:
    rdzv = FakeRendezvous("a")
    agent = _agent(rdzv, "import time; time.sleep(600)", tmp_path)
    rdzv.publish(["a"], 0)
    _tick_until(agent, RankState.RUNNING)
    child = agent.child
    rdzv.publish(["a"], 0)  # a restarted daemon re-adopts the world: the same places
    assert agent.tick() is None and agent.state is RankState.RUNNING and agent.child is child
    assert child is not None and child.poll() is None  # not restarted
    finished = _agent(FakeRendezvous("b"), "pass", tmp_path)
    finished.rdzv.publish(["b", "c"], 0, {"b": "n1", "c": "n2"})
    finished.tick()
    finished.rdzv.add(f"mt/j1/arrive/{finished.rdzv.gen}", 1)
    _tick_until(finished, RankState.FINISHED)
    finished.rdzv.publish(["b", "c"], 0, {"b": "n1", "c": "n2"})
    assert finished.tick() is None and finished.state is RankState.FINISHED
    finished.rdzv.add(done_key("j1", finished.rdzv.gen), 1)  # c finishes in the republished world
    assert finished.tick() == 0
    agent.stop_child()


def test_a_node_of_k_slots_runs_k_ranks_numbered_node_by_node(tmp_path: Path) -> None:
    """The daemon side: a worker given K slots is one rank agent that starts its K ranks (K in the launch
    spec's slots, the one route to the node agent, which tells the rank agent), and the world
    places its K ranks on its node (LOCAL_RANK 0..K-1, GROUP_RANK the node's index)."""
    from malletrain.runtimes.torchrun import TorchrunRuntime
    from contract.world import rank_names

    rt = TorchrunRuntime()
    try:
        for w, node in (("j1.a", "n1"), ("j1.b", "n2")):
            spec = rt.launch_spec("j1", (PY, "train.py"), w, node, slots=2)
            assert spec.slots == 2 and spec.starts_own_ranks  # K by one route; the rank agent starts the ranks
            assert "--local-ranks" not in spec.argv
        gen = rt.set_members("j1", ["j1.b", "j1.a"])
        world = World.parse(rt._require_store().get(world_key("j1", gen)), "w")
        assert sorted(world.places) == rank_names("j1.a", 2) + rank_names("j1.b", 2)
        got = {n: (p.rank, p.world_size, p.group_rank, p.local_rank, p.local_world_size)
               for n, p in world.places.items()}
        assert got == {"j1.b/0": (0, 4, 0, 0, 2), "j1.b/1": (1, 4, 0, 1, 2),
                       "j1.a/0": (2, 4, 1, 0, 2), "j1.a/1": (3, 4, 1, 1, 2)}
    finally:
        rt.close()


def _publish_k(rdzv: FakeRendezvous, nodes: dict[str, str], local_ranks: int, restart: int = 0) -> None:
    """A world of the workers ``nodes`` (worker -> node), each running ``local_ranks`` ranks."""
    from contract.world import rank_names

    rdzv.gen += 1
    places = rank_places([(name, node) for w, node in nodes.items() for name in rank_names(w, local_ranks)])
    rdzv.keys[world_key(rdzv.job, rdzv.gen)] = World(restart, places).to_json().encode()
    rdzv.keys[f"members/{rdzv.gen}"] = ",".join(nodes).encode()


K_ENV_TO_FILE = """import os, sys
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "CUDA_VISIBLE_DEVICES",
        "OMP_NUM_THREADS", "MALLETRAIN_WORKER")
with open(sys.argv[0] + "." + os.environ["LOCAL_RANK"] + ".env", "w") as fh:
    fh.write(" ".join(os.environ.get(k, "-") for k in keys))
    fh.write(" " + ",".join(str(c) for c in sorted(os.sched_getaffinity(0))) + "\\n")
"""


def test_a_rank_agent_of_k_local_ranks_gives_each_its_own_place_device_and_cores(tmp_path: Path) -> None:
    import os

    rdzv = FakeRendezvous("b")
    agent = _agent(rdzv, K_ENV_TO_FILE, tmp_path)
    agent.local_ranks = 2
    agent._env.update({"CUDA_VISIBLE_DEVICES": "4,5", "MALLETRAIN_WORKER": "b"})
    agent._env.pop("OMP_NUM_THREADS", None)
    _publish_k(rdzv, {"a": "n1", "b": "n2"}, 2, restart=3)
    assert agent.tick() is None and agent.state is RankState.FORMING
    assert rdzv.counters[f"mt/j1/arrive/{rdzv.gen}"] == 2  # its two ranks arrived
    rdzv.publish_group(rdzv.gen, "127.0.0.1", 1234, "3")  # rank 0 is a's
    _tick_until(agent, RankState.FINISHED)
    seen = [(tmp_path / f"rank.py.{i}.env").read_text().split() for i in (0, 1)]
    assert [s[:5] for s in seen] == [["2", "4", "0", "2", "1"], ["3", "4", "1", "2", "1"]]
    assert [s[5] for s in seen] == ["4", "5"]  # a device each, of the node's
    assert len({s[7] for s in seen}) == 2 and all(s[7].startswith("b") for s in seen)  # a sender each
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:  # a share of the cores each, the thread count its size
        shares = [set(s[8].split(",")) for s in seen]
        assert not shares[0] & shares[1] and [int(s[6]) for s in seen] == [len(x) for x in shares]
    assert rdzv.counters[done_key("j1", rdzv.gen)] == 2  # both counted in done
    assert agent.tick() is None  # a's two ranks still train
    rdzv.add(done_key("j1", rdzv.gen), 2)
    assert agent.tick() == 0


CRASH_LOCAL_1 = """import os, sys, time
if os.environ["LOCAL_RANK"] == "1":
    sys.exit(3)
time.sleep(600)
"""


def test_a_crash_of_one_local_rank_ends_its_nodes_ranks_together_counted_once(tmp_path: Path) -> None:
    rdzv = FakeRendezvous("a")
    agent = _agent(rdzv, CRASH_LOCAL_1, tmp_path, failure_wait_s=0.0)
    agent.local_ranks = 2
    _publish_k(rdzv, {"a": "n1"}, 2)
    _tick_until(agent, RankState.RUNNING)
    survivor = agent.child
    _tick_until(agent, RankState.FAILED)
    assert survivor is not None and survivor.returncode == -15  # stopped with it (SIGTERM)
    assert agent.children is None and done_key("j1", rdzv.gen) not in rdzv.counters
    assert agent.tick() == 3  # one failure, its status


def test_a_restarted_daemon_learns_a_workers_k_from_its_ready_key(tmp_path: Path) -> None:
    """A worker an earlier daemon started (re-adopted: no launch says its K): the rank agent writes its
    K into its ready key (again at each reconnection), and the world places that many ranks."""
    from contract.storekeys import ready_key
    from malletrain.worker.elastic.rendezvous import Rendezvous
    from malletrain.runtimes.torchrun import TorchrunRuntime
    from contract.world import rank_names
    from malletrain.worker.torchrun_agent import local_ranks_of

    assert local_ranks_of({"MALLETRAIN_LOCAL_RANKS": "2"}) == 2 and local_ranks_of({}) == 1
    for bad in ("0", "x", "65"):
        with pytest.raises(ValueError, match="MALLETRAIN_LOCAL_RANKS"):
            local_ranks_of({"MALLETRAIN_LOCAL_RANKS": bad})
    rt = TorchrunRuntime()
    try:
        rt.start_if_needed()  # a restarted daemon serves its store at once
        store = rt._require_store()
        rdzv = Rendezvous(store, "j1", "j1.a")
        rdzv.ready_value = "2"  # what the agent's main sets from MALLETRAIN_LOCAL_RANKS
        rdzv.mark_ready()
        store.set(ready_key("j1", "j1.b"), "1")  # an agent of one rank
        rt.readopt("j1", (PY, "train.py"), {"j1.a": "n1", "j1.b": "n2"})
        gen = rt.set_members("j1", ["j1.a"])
        world = World.parse(store.get(world_key("j1", gen)), "w")
        assert sorted(world.places) == rank_names("j1.a", 2)
    finally:
        rt.close()


def test_a_restarted_daemon_serves_a_torchrun_jobs_store_on_the_last_daemons_port(tmp_path: Path) -> None:
    """After a kill -9 the job's rank agents (they outlive the daemon) reconnect to the store's address
    they were given: the restarted daemon serves a torchrun job's store at once, on the last daemon's
    port, before any agent is back."""
    import json
    import socket

    from malletrain.daemon.config import DaemonConfig, LocalConfig
    from malletrain.daemon import Daemon
    from malletrain.daemon.store import Store

    with socket.socket() as probe:  # a port free now, as the last daemon's store had
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    store = Store.open(state / "store.db")
    jid = store.submit(JobSpec("tr", (PY, "train.py"), 1, 1, False, {1: 1.0}, launcher=Launcher.TORCHRUN),
                       owner_uid=os.geteuid(), owner_gid=os.getegid())
    store.set_state(jid, JobState.RUNNING, "placed")
    store.set_nodes(jid, ["node00"])
    store.set_generation(jid, 3)
    store.set_meta("ports", json.dumps({"monitor": 0, "agents": 0, "rendezvous": 0, "torchrun": port}))
    store.close()
    d = Daemon(DaemonConfig(state_dir=str(state), runtime="toy", local=LocalConfig(nodes=1, trace="none"),
                            agent_heartbeat=0.2, agent_dead_after=4.0, loop_interval=0.05))
    try:
        d.step()
        assert d.torchrun.port == port
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        d.close()
SLOW_TO_STOP = """import os, signal, sys, time
def stop(signum, frame):
    time.sleep(1.0)  # a checkpoint, say
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
with open(sys.argv[0] + ".ports", "a") as fh:
    fh.write(os.environ["MASTER_PORT"] + "\\n")
time.sleep(600)
"""


def test_the_master_port_is_held_from_its_naming_until_rank_0_starts(tmp_path: Path) -> None:
    """One rendezvous step for both launchers: the agent of rank 0 names the world's master as the
    in-process runtime's rank 0 does (:func:`malletrain.worker.elastic.rendezvous.form_step`), holding the
    port's socket while its old ranks still stop, so no other process takes it in between; it lets it
    go just before its rank 0 starts (the script binds it). Before, it picked a free port and let it
    go at once."""
    import socket
    import time

    def ports(n: int) -> list[str]:
        path, deadline = tmp_path / "rank.py.ports", time.monotonic() + 120
        while time.monotonic() < deadline and (not path.exists() or len(path.read_text().split()) < n):
            time.sleep(0.05)
        return path.read_text().split()

    rdzv = FakeRendezvous()
    agent = _agent(rdzv, SLOW_TO_STOP, tmp_path)
    rdzv.publish(["w0"], 0)
    _tick_until(agent, RankState.RUNNING)
    ports(1)  # the first rank runs (its SIGTERM handler set)
    rdzv.publish(["w0", "w1"], 1)  # the world grows: w0's old rank takes a second to stop
    assert agent.tick() is None and agent.state is RankState.FORMING
    assert rdzv.wait_group(rdzv.gen, 0.0) is None
    rdzv.add(arrive_key("j1", rdzv.gen), 1)  # w1 arrives
    assert agent.tick() is None and agent.state is RankState.FORMING  # named, its old rank still stopping
    where = rdzv.wait_group(rdzv.gen, 0.0)
    assert where is not None and where[0] == "127.0.0.1"
    with socket.socket() as probe, pytest.raises(OSError):
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", where[1]))  # held: no other process can take it now
    with socket.socket() as early, pytest.raises(ConnectionRefusedError):
        early.connect(("127.0.0.1", where[1]))  # a peer's early connection is refused (it tries again)
    _tick_until(agent, RankState.RUNNING)
    assert ports(2)[1] == str(where[1])  # the new rank 0 was given that port, free again
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", where[1]))
    agent.stop_child()
