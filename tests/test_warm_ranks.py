"""Warm ranks of a ``torchrun`` job (:mod:`malletrain.worker.warm_ranks`), and prepare-then-switch.

The rank agents run in threads of the test with the store's keys in a dict shared between them
(:class:`Shared`); their commands are real processes.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from malletrain.worker.torchrun_agent import RankAgent, RankState
from malletrain.worker.warm_ranks import ALWAYS, imports_of, learned_imports, script_of
from tests.test_torchrun_launcher import FakeRendezvous

PY = sys.executable


class Shared(FakeRendezvous):
    """One worker's view of a store shared with other workers' views (``keys``, counters, generation)."""

    def __init__(self, worker: str, first: Shared | None = None) -> None:
        super().__init__(worker)
        self.first = first or self
        self.lock = threading.Lock() if first is None else first.lock
        if first is not None:
            self.keys, self.counters = first.keys, first.counters

    def generation(self) -> int:
        return self.first.gen

    def publish(self, members: list[str], restart: int, nodes: dict[str, str] | None = None) -> None:
        with self.lock:
            super().publish(members, restart, nodes)

    def add(self, key: str, delta: int) -> int:
        with self.lock:
            return super().add(key, delta)


def run_agents(agents: list[RankAgent]) -> tuple[list[threading.Thread], dict[str, int]]:
    codes: dict[str, int] = {}
    threads = [threading.Thread(target=lambda a=a: codes.__setitem__(a.worker, a.run()), daemon=True)
               for a in agents]
    for t in threads:
        t.start()
    return threads, codes


def test_the_servers_import_what_the_script_imports_but_not_its_own_modules(tmp_path: Path) -> None:
    (tmp_path / "helpers.py").write_text("print('side effect')\n")
    script = tmp_path / "train.py"
    script.write_text("import os, json\nimport helpers\nfrom torch import nn\n"
                      "def main():\n    import lightning.pytorch as pl\n")
    assert imports_of(script.read_text()) == ["os", "json", "helpers", "torch", "lightning.pytorch"]
    command = (PY, "-m", "malletrain.worker.launch", str(script), "--x")
    assert script_of(command) == (str(script), None)
    got = learned_imports(command, declared="transformers, ")
    assert got[:len(ALWAYS)] == ALWAYS and "helpers" not in got
    assert [m for m in got[len(ALWAYS):]] == ["os", "json", "lightning.pytorch", "transformers"]
    mod = learned_imports((PY, "-m", "malletrain.worker.launch", "-m", "malletrain.worker.examples.torchrun_ddp"))
    assert "malletrain.worker.examples.torchrun_ddp" not in mod and "torch" in mod  # the module run is not run ahead


def test_the_rank_agent_imports_no_torch() -> None:
    """The rank agent starts when a node comes, before the rank servers it starts import torch: it imports
    none itself (its world forming and store checks need none), or a grow would wait for a second import."""
    import subprocess

    probe = "import sys, malletrain.worker.torchrun_agent; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([PY, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_rank_server_whose_agent_went_while_it_imported_ends_quietly() -> None:
    """A job that ends (or an agent stopped) while a joining node's rank server still imports: the server
    finds the agent's socket closed when it says it is ready, and ends with 0, no traceback in the log."""
    import socket
    import subprocess

    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    mine.close()
    with theirs:
        out = subprocess.run([PY, "-m", "malletrain.worker.warm_ranks", "--fd", str(theirs.fileno()), "--import", ""],
                             pass_fds=(theirs.fileno(),), capture_output=True, text=True, timeout=300)
    assert (out.returncode, out.stderr) == (0, "")


RANK_ON_SIGTERM = """import os, signal, sys, time
events = sys.argv[1]
def log(what):
    with open(events, "a") as fh:
        fh.write(what + "\\n")
def stop(signum, frame):  # the old world's rank takes its time to stop: it checkpoints, say
    for _ in range(200):
        if os.environ["RANK"] == "0" and "b-started" in open(events).read():
            break
        time.sleep(0.05)
    log(os.environ["MALLETRAIN_WORKER"] + ".restart" + os.environ["MALLETRAIN_INCARNATION"] + "-stopped")
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
log(os.environ["MALLETRAIN_WORKER"] + ".restart" + os.environ["MALLETRAIN_INCARNATION"] + "-started")
while True:
    time.sleep(0.05)
"""


def test_a_joining_rank_starts_before_the_old_world_has_stopped(tmp_path: Path) -> None:
    """Prepare, then switch: at a grow every agent arrives in the new world before it stops its old
    ranks, and rank 0's agent names the master at once, so the joining worker (nothing to stop) starts
    its rank while the old world's rank still stops. Before, the old rank stopped first (its agent
    arrived only then), and the joining one waited for it."""
    script, events = tmp_path / "rank.py", tmp_path / "events"
    script.write_text(RANK_ON_SIGTERM)
    events.write_text("")
    a = Shared("a")
    b = Shared("b", a)
    agents = [RankAgent(r, (PY, str(script), str(events)), stop_grace_s=30.0, failure_wait_s=60.0)  # type: ignore[arg-type]
              for r in (a, b)]
    for agent in agents:
        agent._env["MALLETRAIN_WORKER"] = agent.worker
    nodes = {"a": "n1", "b": "n2"}
    a.publish(["a"], 0, nodes)
    threads, codes = run_agents(agents)
    try:
        for _ in range(400):
            if "a.restart0-started" in events.read_text():
                break
            threading.Event().wait(0.05)
        a.publish(["a", "b"], 1, nodes)  # b's node came: the world grows
        for _ in range(600):
            if {"a.restart1-started", "b.restart1-started"} <= set(events.read_text().split()):
                break
            threading.Event().wait(0.05)
    finally:
        for agent in agents:
            agent.stop_requested = True
        for t in threads:
            t.join(60)
    lines = events.read_text().split()
    assert lines.index("b.restart1-started") < lines.index("a.restart0-stopped"), lines
    assert lines.index("a.restart0-stopped") < lines.index("a.restart1-started"), lines  # its own ranks: stop, then start
    assert codes == {"a": 143, "b": 143}


DDP_RANK = """import os, sys
warm = "torch._dynamo" in sys.modules  # a fresh interpreter has not imported torch, nor what DDP's constructor does
import torch
import torch.distributed as dist
seed = torch.initial_seed()
out = sys.argv[1]
big = torch.randn(512, 512)
assert float((big @ big).abs().sum()) > 0  # a parallel op (OpenMP, MKL) in the fork
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(dist.get_rank())
x = torch.randn(64, 4, generator=g)
y = x.sum(1, keepdim=True)
losses = []
for _ in range(20):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
params = sum(float(p.sum()) for p in model.parameters())
with open(f"{out}.{dist.get_rank()}", "w") as fh:
    fh.write(f"{warm} {os.getppid()} {total.item()} {params:.6f} {losses[0]:.4f} {losses[-1]:.4f} "
             f"{os.environ['TORCHELASTIC_RESTART_COUNT']} {seed}\\n")
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_restarted_rank_is_a_fork_of_a_warm_server_and_trains_with_gloo(tmp_path: Path) -> None:
    """Two workers on two nodes, each with a warm rank server: every start of a rank is a fork of the
    server (torch imported before the script ran; its parent is the server, not the agent), trains
    with gloo (allreduce, DDP's gradients averaged: both ranks end with the same parameters)."""
    import os

    script, out = tmp_path / "rank.py", tmp_path / "out"
    script.write_text(DDP_RANK)
    a = Shared("a")
    b = Shared("b", a)
    agents = [RankAgent(r, (PY, str(script), str(out)), stop_grace_s=10.0, failure_wait_s=60.0, warm=True)  # type: ignore[arg-type]
              for r in (a, b)]
    for agent in agents:
        agent._env.pop("OMP_NUM_THREADS", None)  # the slot's thread count: torch's pools in each fork
        agent.prepare()
    servers = {agent.worker: agent.servers[0].proc.pid for agent in agents if agent.servers[0].proc}
    assert all(agent.servers[0].ready for agent in agents)
    a.publish(["a", "b"], 0, {"a": "n1", "b": "n2"})
    threads, codes = run_agents(agents)
    for t in threads:
        t.join(300)
    assert codes == {"a": 0, "b": 0}
    results = [(tmp_path / f"out.{r}").read_text().split() for r in (0, 1)]
    for rank, (warm, ppid, total, _params, first, last, restart, _seed) in enumerate(results):
        assert warm == "True" and int(ppid) in servers.values() and int(ppid) != os.getpid()
        assert float(total) == 3.0 and float(last) < float(first) and restart == "0"
    assert results[0][3] == results[1][3]  # DDP kept the ranks' models equal



def framework_job(tmp_path: Path, module: str, max_steps: int, changes: int) -> tuple[list[str], list[str], dict[str, int]]:
    """An unchanged framework script on two workers (one rank each, through ``malletrain.worker.launch`` as the
    runtime wraps it), its world changed ``changes`` times (2 -> 1 -> 2 ...) while it trains; then it runs
    to its end. The agents' warnings, the script's events, the agents' exit codes."""
    import logging

    from malletrain.runtimes.torchrun import wrap_python_command

    events = tmp_path / "events"
    events.write_text("")
    command = wrap_python_command((PY, "-m", module, "--ckpt-dir", str(tmp_path / "ckpt"), "--events", str(events),
                                   "--max-steps", str(max_steps)), launcher_present=True)
    a = Shared("a")
    b = Shared("b", a)
    agents = [RankAgent(r, command, stop_grace_s=10.0, failure_wait_s=120.0) for r in (a, b)]  # type: ignore[arg-type]
    for agent in agents:
        agent._env["OMP_NUM_THREADS"] = "1"
    warnings: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())

    handler = Keep()
    logging.getLogger("malletrain.torchrun").addHandler(handler)
    nodes = {"a": "n1", "b": "n2"}
    both = ["a", "b"]
    a.publish(both, 0, nodes)
    threads, codes = run_agents(agents)

    def steps_at(world: int) -> int:
        return sum(1 for line in events.read_text().splitlines() if line.startswith("step") and line.split()[3] == str(world))

    try:
        for change in range(changes):
            world = 2 if change % 2 == 0 else 1  # the world that trains now
            seen = steps_at(world)
            for _ in range(3000):
                if steps_at(world) >= seen + 7 or codes:  # past a checkpoint (every 5 steps)
                    break
                threading.Event().wait(0.05)
            a.publish(["a"] if world == 2 else both, change + 1, nodes)
        for t in threads:
            t.join(600)
    finally:
        logging.getLogger("malletrain.torchrun").removeHandler(handler)
        for agent in agents:
            agent.stop_requested = True
    return warnings, events.read_text().splitlines(), codes


@pytest.mark.slow
def test_an_unchanged_lightning_script_stops_within_the_grace_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """Lightning (strategy="ddp") installs its own SIGTERM handler and keeps the one it found after it:
    the launcher's, which exits 143. The ranks stop within the grace at every change (no SIGKILL) and
    resume from the script's own ``last.ckpt``."""
    pytest.importorskip("lightning", reason="the [lightning] extra is not installed")
    warnings, events, codes = framework_job(tmp_path, "malletrain.worker.examples.lightning_plain", 40, 2)
    assert not [w for w in warnings if "SIGKILL" in w], warnings
    starts = [line.split() for line in events if line.startswith("start")]
    assert len(starts) >= 4 and all(int(s[4]) > 0 for s in starts[2:])  # restarted, resumed past step 0
    assert codes == {"a": 0, "b": 0} and events[-1].startswith("step 40 ")


SEED_TO_FILE = """import os, random, sys, torch
with open(sys.argv[1], "a") as fh:
    fh.write(f"{os.getppid()} {torch.initial_seed()} {random.random()} {os.environ['RANK']}\\n")
"""


@pytest.mark.slow
def test_each_fork_of_a_server_has_its_own_seeds_environment_and_exit_code(tmp_path: Path) -> None:
    """Two starts of the same rank from one server: each a child of the server, with the start's own
    environment and exit status, and fresh seeds (torch seeds each new process at random: forks of one
    server would otherwise repeat one sequence at every restart)."""
    from malletrain.worker.warm_ranks import RankServer

    script, out = tmp_path / "seed.py", tmp_path / "seeds"
    script.write_text(SEED_TO_FILE)
    server = RankServer(("torch",), {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    server.start()
    try:
        assert server.wait_ready(120.0)
        codes = []
        for rank in ("3", "4"):
            child = server.spawn((PY, str(script), str(out)), {"RANK": rank, "OMP_NUM_THREADS": "1"})
            assert not isinstance(child, str), child
            codes.append(child.wait(60))
        bad = server.spawn((PY, "-c", "pass"), {})  # interpreter flags: started cold, not by the server
        assert isinstance(bad, str) and "-c" in bad
    finally:
        server.close()
    lines = [line.split() for line in out.read_text().splitlines()]
    assert codes == [0, 0] and [line[3] for line in lines] == ["3", "4"]
    assert server.proc is not None and {int(line[0]) for line in lines} == {server.proc.pid}
    assert lines[0][1] != lines[1][1] and lines[0][2] != lines[1][2]


RANK_REPORT = """import json, os, sys, torch
def parent(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
server = os.getppid()
print(json.dumps({"server": server, "agent": parent(server), "threads": torch.get_num_threads(),
                  "server_cmdline": open(f"/proc/{server}/cmdline").read().split(chr(0)), "rank": os.environ["RANK"],
                  "cores": sorted(os.sched_getaffinity(0))}))
"""

AGENT_STARTED_WARM = """import json, os, sys
import torch  # what a node's warm process imported before it became this rank agent
from malletrain.worker.torchrun_agent import start_rank_servers
from malletrain.worker.warm_ranks import InFork
script = sys.argv[1]
env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the job's thread count, not the one torch was imported with
got = start_rank_servers((sys.executable, script), env, 2, True, "w", fork=True)  # a node of 2 slots
if isinstance(got, InFork):
    sys.exit(got.code)  # the forked server (and its ranks) end here: none of the agent's work runs in them
codes, pids = [], []
for i, server in enumerate(got):
    assert server.wait_ready(300)
    rank = server.spawn((sys.executable, script), {**server.env, "RANK": str(i)})
    codes.append(rank.wait(300) if not isinstance(rank, str) else rank)
    pids.append(server.pid)
for server in got:
    server.close()
print(json.dumps({"agent": os.getpid(), "servers": pids, "codes": codes}))
"""


def test_a_rank_agent_that_a_warm_process_became_forks_its_rank_servers_from_itself(tmp_path: Path) -> None:
    """A rank agent that holds torch's import already (the node's warm process became it, prepared before the
    job was placed there) forks its rank servers from itself: they are ready at once, no interpreter imports
    torch again; each rank forked from them runs with the job's thread count. Before, every rank server was a
    new interpreter importing torch, which a node's return waited for."""
    import json
    import os
    import subprocess

    pytest.importorskip("torch")
    script, driver = tmp_path / "rank.py", tmp_path / "agent.py"
    script.write_text(RANK_REPORT)
    driver.write_text(AGENT_STARTED_WARM)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([PY, str(driver), str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    ranks, agent = lines[:-1], lines[-1]
    assert agent["codes"] == [0, 0] and [r["rank"] for r in ranks] == ["0", "1"]
    assert [r["server"] for r in ranks] == agent["servers"] and len(set(agent["servers"])) == 2
    for rank in ranks:
        assert rank["agent"] == agent["agent"]  # the agent's own fork
        assert not any("malletrain.worker.warm_ranks" in word for word in rank["server_cmdline"])  # no new interpreter
        assert rank["threads"] == 1  # the job's OMP_NUM_THREADS, applied in the fork
    if len(os.sched_getaffinity(0)) >= 2:
        assert ranks[0]["cores"] != ranks[1]["cores"]  # each server took its rank's share of the cores


@pytest.mark.slow
def test_a_returning_node_forks_its_rank_servers_from_the_warm_process_its_agent_prepared(tmp_path: Path) -> None:
    """Under the daemon (2 local nodes, the torch runtime: each node agent prepares a warm process that
    imports torch as its pilot starts, before any job is placed on it), every rank agent of a torchrun job,
    the one on a node that was recalled and came back included, is that warm process and forks its rank
    servers from itself. Before, each rank agent started cold and its rank servers imported torch again
    after the job was placed (the most of a node's return to the first step on it)."""
    pytest.importorskip("torch")
    from malletrain.daemon import Daemon
    from malletrain.daemon.config import DaemonConfig, LocalConfig
    from malletrain.daemon.jobspec import JobSpec, Launcher
    from tests.stepping import step_until
    from tests.test_torchrun_launcher import rank0_steps

    state = tmp_path / "state"
    cfg = DaemonConfig(state_dir=str(state), runtime="torch", local=LocalConfig(nodes=2, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=5.0, loop_interval=0.05)
    cmd = (PY, "-m", "malletrain.worker.examples.torchrun_ddp", "--steps", "100000", "--batch", "4",
           "--checkpoint", str(tmp_path / "ddp.pt"), "--checkpoint-every", "10", "--step-sleep", "0.05")
    spec = JobSpec("ddp", cmd, 1, 2, False, {1: 10.0, 2: 20.0}, env={"OMP_NUM_THREADS": "1"},
                   launcher=Launcher.TORCHRUN, worker_batch=4)
    d = Daemon(cfg)
    logs = state / "logs"
    try:
        jid = d.store.submit(spec)
        seen = lambda world, restart=0: any(w == world and r >= restart  # noqa: E731
                                            for _, w, r in rank0_steps(logs, jid))
        step_until(d, lambda: len(d.runs[jid].members) == 2 and seen(2), 600, "the job trains at 2 nodes")
        victim = d.runs[jid].members[-1]
        d.backend.recall(victim)
        step_until(d, lambda: seen(1, 1), 600, "the job trains at 1 node after a recall")
        d.backend.make_idle(victim)
        step_until(d, lambda: seen(2, 2), 600, "the job trains at 2 nodes again")
    finally:
        d.close()
    agents = [p.read_text(errors="replace") for p in logs.glob(f"{jid}.*.log")]
    agents = [text for text in agents if "starting rank" in text]
    assert len(agents) >= 3, len(agents)  # the two first, and the returning node's
    for text in agents:
        assert "forked from this agent" in text and "starts cold" not in text, text[-3000:]


STORE_ENV_TO_FILE = """import os, signal, sys, time
def stop(signum, frame):
    time.sleep(1.0)  # a checkpoint, say
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
with open(sys.argv[0] + ".env", "a") as fh:
    fh.write(os.environ["MASTER_PORT"] + " " + os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "-") + "\\n")
time.sleep(600)
"""


def test_an_agent_holding_torch_serves_its_worlds_store_from_its_naming(tmp_path: Path) -> None:
    """The agent of rank 0 that holds torch's import (a node's warm process became it) serves the world's
    store on the port it names, as torchrun's agent does, before its old ranks have stopped: a rank of another
    node that starts first connects at once (before, it was refused and tried again after torch's back-off,
    half a second and more), and its own ranks are told the agent serves it."""
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from contract.storekeys import arrive_key
    from tests.test_torchrun_launcher import _agent, _tick_until

    def lines(n: int) -> list[list[str]]:
        path, deadline = tmp_path / "rank.py.env", time.monotonic() + 120
        while time.monotonic() < deadline and (not path.exists() or len(path.read_text().splitlines()) < n):
            time.sleep(0.05)
        return [line.split() for line in path.read_text().splitlines()]

    rdzv = FakeRendezvous()
    agent = _agent(rdzv, STORE_ENV_TO_FILE, tmp_path)
    agent.serves_store = True
    rdzv.publish(["w0"], 0)
    _tick_until(agent, RankState.RUNNING)
    lines(1)
    rdzv.publish(["w0", "w1"], 1)  # the world grows: w0's old rank takes a second to stop
    assert agent.tick() is None
    rdzv.add(arrive_key("j1", rdzv.gen), 1)  # w1 arrives
    assert agent.tick() is None and agent.state is RankState.FORMING  # named, its old rank still stopping
    where = rdzv.wait_group(rdzv.gen, 0.0)
    assert where is not None
    early = dist.TCPStore(where[0], where[1], None, False, timedelta(seconds=5))  # w1's rank, started first
    early.set("seen", "yes")
    _tick_until(agent, RankState.RUNNING)
    assert lines(2)[1] == [str(where[1]), "True"]  # its rank 0 was told: a client of the agent's store
    assert early.get("seen") == b"yes"  # the store lives while its world runs
    agent.stop_child()
