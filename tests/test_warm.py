"""Warm workers (scavenger.warm): a process that imported ahead becomes the worker, exactly as a
fresh interpreter would have run it; anything it could not run exactly that way starts cold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scavenger import protocol as P
from scavenger.agent import Agent
from scavenger.warm import Assignment, WarmSlot, start_time_env, warm_refusal
from spawner.entry import Entry, entry_of
from stepping import wait_until

KEY = b"k" * 32

SCRIPT = """
import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "x": os.environ.get("X"),
                  "agent_only": os.environ.get("AGENT_ONLY"), "sid": os.getsid(0) == os.getpid(),
                  "main": __name__, "path0": sys.path[0]}))
sys.exit(int(os.environ.get("CODE", "0")))
"""


def wait_ready(slot: WarmSlot, timeout: float = 30.0) -> None:
    wait_until(lambda: slot.ready, "the warm process ready", timeout, tick=slot.poll, pause=0.02)


def read_json_line(path: Path) -> dict:
    import json

    lines = [line for line in path.read_text().splitlines() if line.startswith("{")]
    assert lines, path.read_text()
    return json.loads(lines[-1])


def test_entry_of_reads_module_and_script_forms() -> None:
    py = sys.executable
    assert entry_of([py, "-m", "pkg.mod", "--a", "1"], py) == Entry("pkg.mod", None, ("--a", "1"))
    assert entry_of([py, "train.py", "x"], py) == Entry(None, "train.py", ("x",))
    assert "flag" in str(entry_of([py, "-u", "train.py"], py))
    assert "interpreter" in str(entry_of(["/usr/bin/other-python", "t.py"], py))
    assert isinstance(entry_of([py], py), str)


def test_start_time_variables_must_match_the_warm_process() -> None:
    py = sys.executable
    argv = [py, "-m", "m"]
    assert warm_refusal(argv, {"OMP_NUM_THREADS": "1", "X": "1"}, {"OMP_NUM_THREADS": "1"}, py) is None
    why = warm_refusal(argv, {"MKL_NUM_THREADS": "2"}, {"MKL_NUM_THREADS": "1"}, py)
    assert why is not None and "MKL_NUM_THREADS" in why
    # the thread count is applied by the warm process when it becomes the worker
    assert warm_refusal(argv, {"OMP_NUM_THREADS": "2"}, {"OMP_NUM_THREADS": "1"}, py) is None
    assert warm_refusal(argv, {"LD_PRELOAD": "x.so"}, {}, py) is not None
    assert warm_refusal(argv, {"PYTHONPATH": "/x"}, {}, py) is None  # applied by the warm process


def test_assignment_rejects_bad_bytes_by_name() -> None:
    with pytest.raises(ValueError, match="argv"):
        Assignment.decode(b'{"argv": [], "env": {}}')
    with pytest.raises(ValueError, match="uid"):
        Assignment.decode(b'{"argv": ["p"], "env": {}, "uid": -1}')
    with pytest.raises(ValueError, match="JSON"):
        Assignment.decode(b"\xff")


def test_warm_process_becomes_the_worker(tmp_path: Path) -> None:
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    work = tmp_path / "work"
    work.mkdir()
    slot = WarmSlot(("json",), env={**os.environ, "AGENT_ONLY": "1"})
    slot.prepare()
    try:
        wait_ready(slot)
        pid = slot.proc.pid if slot.proc else -1
        log = (tmp_path / "w.log").open("ab")
        env = {k: v for k, v in os.environ.items()} | {"X": "42", "CODE": "7"}
        proc = slot.take(Assignment((sys.executable, str(script), "--flag", "v"), env, str(work)), log)
        assert not isinstance(proc, str), proc
        assert proc.pid == pid  # the prepared process itself is the worker
        assert proc.wait(timeout=30) == 7
        log.close()
    finally:
        slot.close()
    out = read_json_line(tmp_path / "w.log")
    assert out["argv"] == [str(script), "--flag", "v"]
    assert out["cwd"] == str(work)
    assert out["x"] == "42" and out["agent_only"] is None  # the worker's env, not the agent's
    assert out["sid"] and out["main"] == "__main__"
    assert out["path0"] == str(script.parent)
    assert slot.proc is None  # taken: the next one is prepared afresh


THREADS = """
import json, torch
print(json.dumps({"threads": torch.get_num_threads()}))
"""


def test_a_warm_process_becomes_a_worker_of_another_thread_count_and_runs_with_it(tmp_path: Path) -> None:
    """A job's ``OMP_NUM_THREADS`` that differs from the node's warm process's (which imported torch with its
    own) no longer sends the worker cold: torch runs with the job's count, as in a fresh interpreter. Before,
    an in-process job's joining worker that set its thread count imported torch anew."""
    script = tmp_path / "threads.py"
    script.write_text(THREADS)
    warm_env = {**os.environ, "OMP_NUM_THREADS": "1"}
    slot = WarmSlot(("torch",), env=warm_env)
    slot.prepare()
    try:
        wait_ready(slot, timeout=120)
        pid = slot.proc.pid if slot.proc else -1
        log = (tmp_path / "w.log").open("ab")
        proc = slot.take(Assignment((sys.executable, str(script)), {**warm_env, "OMP_NUM_THREADS": "2"}), log)
        assert not isinstance(proc, str), proc
        assert proc.pid == pid and proc.wait(timeout=60) == 0
        log.close()
    finally:
        slot.close()
    assert read_json_line(tmp_path / "w.log")["threads"] == 2


def test_warm_process_refuses_what_it_cannot_run_exactly(tmp_path: Path) -> None:
    slot = WarmSlot(("json",), env={k: v for k, v in os.environ.items() if not k.startswith("MKL_")})
    slot.prepare()
    try:
        wait_ready(slot)
        why = slot.take(Assignment((sys.executable, "-m", "json.tool"), {"MKL_NUM_THREADS": "3"}), None)
        assert isinstance(why, str) and "MKL_NUM_THREADS" in why
        assert slot.ready  # still there for the next worker
    finally:
        slot.close()
    assert slot.proc is None


def test_agent_starts_its_worker_from_the_warm_process(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    agent = Agent("n1", "tcp://127.0.0.1:1", KEY, log_dir=str(tmp_path / "logs"), warm_modules=("json",))
    try:
        assert agent.warm is not None
        agent.warm.prepare()
        wait_ready(agent.warm)
        warm_pid = agent.warm.proc.pid if agent.warm.proc else -1
        agent.start_worker(P.StartWorker("n1", "j1.n1.1", (sys.executable, str(script)), {"X": "1"}, str(tmp_path)))
        w = agent.workers["j1.n1.1"]
        assert w.proc.pid == warm_pid
        assert w.proc.wait(timeout=30) == 0
        assert read_json_line(tmp_path / "logs" / "j1.n1.1.log")["x"] == "1"
        # a command the warm process cannot run exactly starts cold, and still runs
        agent.warm.prepare()
        wait_ready(agent.warm)
        warm_pid = agent.warm.proc.pid if agent.warm.proc else -1
        agent.start_worker(P.StartWorker("n1", "j1.n1.2", (sys.executable, "-u", str(script)), {"X": "2"},
                                         str(tmp_path)))
        w2 = agent.workers["j1.n1.2"]
        assert agent.warm.proc is not None and w2.proc.pid != agent.warm.proc.pid
        assert w2.proc.wait(timeout=30) == 0
        assert read_json_line(tmp_path / "logs" / "j1.n1.2.log")["x"] == "2"
    finally:
        agent.kill_all(0.2)
        if agent.warm is not None:
            agent.warm.close()
        agent.sock.close(0)
        agent.monitor.close(0)
        agent.ctx.term()


AFFINITY = """
import json, os
print(json.dumps({"cores": sorted(os.sched_getaffinity(0)), "omp": os.environ.get("OMP_NUM_THREADS"),
                  "k": os.environ.get("MALLETRAIN_LOCAL_RANKS")}))
"""


def test_a_worker_that_starts_its_own_ranks_takes_the_warm_process_whatever_thread_count_it_sets(
        tmp_path: Path) -> None:
    """A ``torchrun`` job's rank agent (a worker that starts its own ranks) becomes the node's warm process,
    prepared before any job was placed, though the job sets another ``OMP_NUM_THREADS`` (it runs no parallel
    operation; its ranks apply their own), unpinned from slot 0's cores where the node has several slots;
    so does any other worker with that thread count (the warm process applies it). Before, it started cold:
    a returning node's rank servers then imported torch while the old world trained."""
    script = tmp_path / "agent.py"
    script.write_text(AFFINITY)
    omp = "3" if os.environ.get("OMP_NUM_THREADS") != "3" else "5"
    agent = Agent("n1", "tcp://127.0.0.1:1", KEY, log_dir=str(tmp_path / "logs"), warm_modules=("json",))
    try:
        assert agent.warm is not None
        agent.warm.prepare()
        wait_ready(agent.warm)
        warm_pid = agent.warm.proc.pid if agent.warm.proc else -1
        agent.start_worker(P.StartWorker("n1", "j1.n1.1", (sys.executable, str(script)), {"OMP_NUM_THREADS": omp},
                                         str(tmp_path), starts_own_ranks=True))
        w = agent.workers["j1.n1.1"]
        assert w.proc.pid == warm_pid
        assert w.proc.wait(timeout=30) == 0
        assert read_json_line(tmp_path / "logs" / "j1.n1.1.log")["omp"] == omp
        agent.reap()
        agent.prepare_warm()
        wait_ready(agent.warm)
        warm_pid = agent.warm.proc.pid if agent.warm.proc else -1
        agent.start_worker(P.StartWorker("n1", "j1.n1.2", (sys.executable, str(script)), {"OMP_NUM_THREADS": omp},
                                         str(tmp_path)))
        assert agent.workers["j1.n1.2"].proc.pid == warm_pid  # warm: it applies the worker's thread count
        assert agent.workers["j1.n1.2"].proc.wait(timeout=30) == 0
        agent.reap()
        if len(agent.cores) >= 2:  # a node of 2 slots: slot 0's warm process is pinned to its share
            agent.learn_slots(2)
            agent.prepare_warm()
            wait_ready(agent.warm)
            assert agent.warm.cores and len(agent.warm.cores) < len(agent.cores)
            warm_pid = agent.warm.proc.pid if agent.warm.proc else -1
            agent.start_worker(P.StartWorker("n1", "j1.n1.3", (sys.executable, str(script)), {}, str(tmp_path),
                                             slots=2, starts_own_ranks=True))
            w3 = agent.workers["j1.n1.3"]
            assert w3.proc.pid == warm_pid and w3.proc.wait(timeout=30) == 0
            out = read_json_line(tmp_path / "logs" / "j1.n1.3.log")
            assert out["cores"] == list(agent.cores) and out["k"] == "2"  # every core, for its 2 ranks to share
            assert agent.slots == 2  # the node keeps its shape: no warm process made again for one slot
            assert [slot.proc for slot in agent.warm_more] == [None]  # slot 1's idle one ended while it runs
    finally:
        agent.kill_all(0.2)
        for slot in [agent.warm, *agent.warm_more]:
            if slot is not None:
                slot.close()
        agent.sock.close(0)
        agent.monitor.close(0)
        agent.ctx.term()


def test_worker_assigned_while_the_warm_process_imports_waits_for_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    agent = Agent("n1", "tcp://127.0.0.1:1", KEY, log_dir=str(tmp_path / "logs"), warm_modules=("json",))
    try:
        assert agent.warm is not None
        agent.warm.prepare()
        warm_pid = agent.warm.proc.pid if agent.warm.proc else -1
        assert agent.warm.starting
        agent.start_worker(P.StartWorker("n1", "j1.n1.1", (sys.executable, str(script)), {}, str(tmp_path)))
        assert "j1.n1.1" not in agent.workers and "j1.n1.1" in agent.deferred  # no second, cold import
        deadline = time.monotonic() + 30
        while "j1.n1.1" not in agent.workers and time.monotonic() < deadline:
            agent.warm.poll()
            agent._start_deferred()
            time.sleep(0.02)
        assert agent.workers["j1.n1.1"].proc.pid == warm_pid
        assert agent.workers["j1.n1.1"].proc.wait(timeout=30) == 0
        # a worker stopped while it waits never starts
        agent.warm.prepare()
        agent.start_worker(P.StartWorker("n1", "j1.n1.2", (sys.executable, str(script)), {}, str(tmp_path)))
        agent.stop_worker("j1.n1.2", 1.0)
        assert "j1.n1.2" not in agent.deferred and "j1.n1.2" not in agent.workers
    finally:
        agent.kill_all(0.2)
        if agent.warm is not None:
            agent.warm.close()
        agent.sock.close(0)
        agent.monitor.close(0)
        agent.ctx.term()


def test_the_agents_wait_ends_when_its_warm_process_is_ready(tmp_path: Path) -> None:
    """The agent's loop watches the importing warm process's socket: its ``ready`` ends the wait, so a
    worker deferred until then starts at once (the wait's timeout here is far longer than the import)."""
    agent = Agent("n1", "tcp://127.0.0.1:1", KEY, log_dir=str(tmp_path / "logs"), warm_modules=("json",))
    try:
        assert agent.warm is not None
        agent.warm.prepare()
        assert agent.warm.starting
        events = agent.wait_events(120_000)
        assert agent.warm.sock is not None and agent.warm.sock.fileno() in events  # (pyzmq names it by its fd)
        agent.warm.poll()
        assert agent.warm.ready and not agent.warm.starting
        agent.wait_events(0)
        assert agent.watched is None  # a ready process is no longer watched (its socket carries the job next)
    finally:
        if agent.warm is not None:
            agent.warm.close()
        agent.sock.close(0)
        agent.monitor.close(0)
        agent.ctx.term()


def test_the_agent_knows_how_long_its_process_has_run() -> None:
    from scavenger.agent import process_age

    assert 0.0 <= float(process_age()) < 24 * 3600  # (the agent's start line says it: its start-up's cost)


def test_the_agent_program_starts_its_warm_process_before_its_own_imports(tmp_path: Path) -> None:
    """Run as the pilot runs it (``python -m scavenger.agent ... --warm MODULES``), the agent spawns its
    warm process before it imports zmq and the rest of itself; an agent that then cannot run (here: no
    key file) ends that process too."""
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import json, runpy, subprocess, sys\n"
        "seen = []\n"
        "class Spy(subprocess.Popen):\n"
        "    def __init__(self, args, *a, **k):\n"
        "        super().__init__(args, *a, **k)\n"
        "        seen.append((list(args), 'zmq' in sys.modules, self))\n"
        "subprocess.Popen = Spy\n"
        f"sys.argv = ['agent', '--node', 'n1', '--daemon', 'tcp://127.0.0.1:1', '--key-file', "
        f"{str(tmp_path / 'missing.key')!r}, '--warm', 'json']\n"
        "try:\n"
        "    runpy.run_module('scavenger.agent', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "print(json.dumps({'code': code, 'popens': [(a, z, p.poll()) for a, z, p in seen]}))\n")
    res = subprocess.run([sys.executable, str(driver)], capture_output=True, text=True, timeout=60)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["code"] == 2  # EXIT_NO_KEY
    argv, zmq_loaded, returncode = out["popens"][0]
    assert argv[1:3] == ["-m", "scavenger.warm"] and argv[-1] == "json"
    assert not zmq_loaded  # spawned before the agent's own imports
    assert returncode is not None  # and ended with the agent that could not run


def test_daemon_passes_the_runtimes_modules_to_its_agents() -> None:
    from types import SimpleNamespace

    from malletrain.daemon.wiring import Wiring
    from malletrain.runtimes.torch_elastic import TorchRuntime

    args = Wiring._warm_args(SimpleNamespace(runtime=SimpleNamespace(warm_modules=TorchRuntime.warm_modules)))
    assert args[0] == "--warm" and "torch" in args[1].split(",") and "malletrain.worker.elastic.state" in args[1].split(",")
    nothing = SimpleNamespace(warm_modules=())  # a runtime with nothing to import ahead
    assert Wiring._warm_args(SimpleNamespace(runtime=nothing)) == ()


def test_the_torch_runtimes_warm_modules_are_all_a_worker_loads_of_malletrain_and_torch() -> None:
    """A warm worker finds loaded what the elastic API loads (``malletrain.worker.elastic`` loads its modules
    on first use, so naming the package alone left them for after the assignment)."""
    from malletrain.runtimes.torch_elastic import TorchRuntime

    code = ("import importlib, sys\n"
            f"for m in {list(TorchRuntime.warm_modules)!r}: importlib.import_module(m)\n"
            "before = set(sys.modules)\n"
            "from malletrain.worker.elastic import State, run\n"
            "import torch.optim, torch.nn\n"
            "print(sorted(m for m in set(sys.modules) - before if m.startswith(('malletrain', 'torch'))))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert res.stdout.strip() == "[]", res.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs a root agent")
def test_a_root_warm_process_runs_the_job_as_its_owner() -> None:
    import shutil
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="mt-warm-owner-"))
    try:
        work.chmod(0o755)
        script = work / "whoami.py"
        script.write_text("import os, sys\nprint(os.getuid(), os.getgid(), os.getgroups(), os.getcwd())\n"
                          "open('mine', 'w').write('x')\n")
        script.chmod(0o644)
        private = work / "private"
        private.mkdir(mode=0o777)
        os.chown(private, 65534, 65534)
        private.chmod(0o700)  # only the owner may enter: the worker enters it after the drop
        slot = WarmSlot(("json",))
        slot.prepare()
        try:
            wait_ready(slot)
            log_path = work / "w.log"
            log = log_path.open("ab")
            proc = slot.take(Assignment((sys.executable, str(script)), {**start_time_env(slot.env), "PATH": "/usr/bin:/bin"}, str(private),
                                        65534, 65534), log)
            assert not isinstance(proc, str), proc
            assert proc.wait(timeout=30) == 0, log_path.read_text()
            log.close()
        finally:
            slot.close()
        uid, gid, rest = log_path.read_text().split(" ", 2)
        assert (int(uid), int(gid)) == (65534, 65534)
        assert rest.strip() == f"[] {private}"
        assert os.stat(private / "mine").st_uid == 65534  # what it made belongs to the owner
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_stuck_warm_process_is_killed_and_the_worker_starts_cold(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import scavenger.agent_workers as agent_workers

    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(120)\n")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    agent = Agent("n1", "tcp://127.0.0.1:1", KEY, log_dir=str(tmp_path / "logs"), warm_modules=("slowmod",))
    try:
        assert agent.warm is not None
        agent.warm.env = {**os.environ, "PYTHONPATH": str(tmp_path)}
        agent.warm.prepare()
        stuck = agent.warm.proc
        assert stuck is not None
        agent.start_worker(P.StartWorker("n1", "j1.n1.1", (sys.executable, str(script)), {}, str(tmp_path)))
        agent._start_deferred()
        assert "j1.n1.1" in agent.deferred  # still within its wait: no second import
        monkeypatch.setattr(agent_workers, "WARM_WAIT_S", 0.0)
        agent._start_deferred()
        w = agent.workers["j1.n1.1"]
        assert w.proc.pid != stuck.pid and stuck.poll() is not None  # the stuck one is gone
        assert w.proc.wait(timeout=30) == 0
    finally:
        agent.kill_all(0.2)
        if agent.warm is not None:
            agent.warm.close()
        agent.sock.close(0)
        agent.monitor.close(0)
        agent.ctx.term()


def test_the_warm_process_starts_before_the_agent_sends_its_first_challenge(tmp_path: Path) -> None:
    """A returning node's pilot imports the framework while it registers with the daemon: the warm
    process is spawned before the agent's first handshake frame, not once the daemon answered."""
    agent = Agent("n1", "tcp://127.0.0.1:1", KEY, dead_after_s=0.3, log_dir=str(tmp_path / "logs"),
                  warm_modules=("json",))
    spawned_at_first_challenge: list[bool] = []
    challenge = agent.authenticate

    def spy(now: float) -> None:
        if not spawned_at_first_challenge:
            spawned_at_first_challenge.append(agent.warm is not None and agent.warm.proc is not None)
        challenge(now)

    agent.authenticate = spy  # type: ignore[method-assign]
    assert agent.run() == 3  # nothing answers: the agent gives up after dead_after_s
    assert spawned_at_first_challenge == [True]
