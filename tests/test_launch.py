"""python -m malletrain.worker.launch: a torchrun script runs unchanged and its optimizer steps are counted.

Real ``torch.distributed.run`` with 2 local processes (gloo, CPU) runs an unmodified DDP script under
the launcher; a real :class:`~malletrain.daemon.monitor.Monitor` takes the signed reports.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from malletrain.worker import client
from malletrain.worker.launch import LaunchError, StepCounter, Target, TargetKind, exit_code, parse_target
from contract.workerenv import ENV_JOB_SECRET
from malletrain.daemon.monitor import Monitor
from contract.workerenv import ENV_JOB, ENV_MONITOR, ENV_WORKER_BATCH

from launching import JOB, RUN_TIMEOUT_S, mon, torchrun_cmd, wait_received, worker_env

__all__ = ["mon"]  # the fixture, used by name

SCRIPT = Path(__file__).resolve().parent / "fixtures" / "scripts" / "plain_ddp.py"


def torchrun(nproc: int, script_args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(torchrun_cmd(nproc, [str(SCRIPT), *script_args]), env=env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S)


def launch(script_args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "malletrain.worker.launch", str(SCRIPT), *script_args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def sent_counts(stderr: str) -> list[int]:
    """The per-process 'N reports sent' figures the launcher logs at exit."""
    return [int(n) for n in re.findall(r"(\d+) reports sent", stderr)]


@pytest.mark.slow
def test_torchrun_steps_are_counted_exactly(mon: tuple[Monitor, str]) -> None:
    m, secret = mon
    steps, worker_batch, world = 7, 4, 2
    res = torchrun(world, ["--steps", str(steps)], worker_env(m, secret, worker_batch))
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count(f"argv0=plain_ddp.py name=__main__ steps={steps}") == world
    wait_received(m, steps)
    assert sorted(sent_counts(res.stderr)) == [0, steps]  # rank 1 sends nothing; rank 0 one per step
    st = m.job(JOB)
    assert (m.accepted, st.samples, st.world_size) == (steps, steps * worker_batch * world, world)


@pytest.mark.slow
def test_the_scripts_own_report_wins(mon: tuple[Monitor, str]) -> None:
    m, secret = mon
    steps, own = 5, 3
    res = torchrun(2, ["--steps", str(steps), "--report", str(own)], worker_env(m, secret, 4))
    assert res.returncode == 0, res.stderr[-3000:]
    wait_received(m, steps)
    assert sent_counts(res.stderr) == [0, 0]  # the hook sent nothing on either rank
    assert (m.accepted, m.job(JOB).samples) == (steps, steps * own)


@pytest.mark.slow
def test_without_worker_batch_nothing_is_counted_and_it_says_so(mon: tuple[Monitor, str]) -> None:
    m, secret = mon
    res = launch(["--steps", "3", "--exit", "3"], worker_env(m, secret, None))
    assert res.returncode == 3, res.stderr[-3000:]
    assert "argv0=plain_ddp.py name=__main__ steps=3" in res.stdout
    assert res.stderr.count(f"{ENV_WORKER_BATCH} is not set") == 1
    assert sent_counts(res.stderr) == []
    assert m.drain(timeout_ms=0) == 0 and m.received == 0


@pytest.mark.slow
def test_sigterm_reaches_the_script_as_an_exit(tmp_path: Path, mon: tuple[Monitor, str]) -> None:
    m, secret = mon
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-m", "malletrain.worker.launch", str(SCRIPT), "--steps", "2",
                             "--wait-term", str(ready)], env=worker_env(m, secret, 5),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), proc.communicate(timeout=60)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "finally ran" in out
    wait_received(m, 2)  # both steps counted: the held one goes out when the script exits
    assert m.job(JOB).samples == 2 * 5


SIGTERM_TWICE = """import atexit, os, signal, time
def late():
    os.kill(os.getpid(), signal.SIGTERM)  # the second SIGTERM (the rank agent's, after the node agent's)
    time.sleep(0.2)
atexit.register(late)
os.kill(os.getpid(), signal.SIGTERM)  # the first: a cancel
time.sleep(60)
"""


def test_a_second_sigterm_while_the_script_exits_leaves_no_traceback(tmp_path: Path) -> None:
    """A cancelled torchrun job's rank gets SIGTERM twice (its process group, then its rank agent): the
    log ends with the exit, not with a ``SystemExit: 143`` traceback."""
    script = tmp_path / "twice.py"
    script.write_text(SIGTERM_TWICE)
    res = subprocess.run([sys.executable, "-m", "malletrain.worker.launch", str(script)], capture_output=True, text=True,
                         timeout=RUN_TIMEOUT_S)
    assert res.returncode == 128 + signal.SIGTERM, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "SystemExit" not in res.stderr, res.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("fail", [False, True])
def test_a_process_group_left_behind_ends_the_process_cleanly(fail: bool, mon: tuple[Monitor, str]) -> None:
    """The script leaves its gloo group alive: its atexit functions run, its exit code (or its traceback
    and 1) comes back, and no teardown of the group aborts or hangs the exit."""
    m, secret = mon
    args = ["--steps", "2", "--keep-group", "--exit", "5"] + (["--fail"] if fail else [])
    res = torchrun(2, args, worker_env(m, secret, 3))
    codes = re.findall(r"exitcode\s*:\s*(-?\d+) \(pid", res.stderr)
    assert res.stdout.count("atexit ran") == 2, res.stderr[-3000:]
    if fail:
        assert res.returncode != 0 and codes == ["1", "1"], res.stderr[-3000:]
        assert res.stderr.count("RuntimeError: script failed") == 2
    else:
        assert res.returncode != 0 and codes == ["5", "5"], res.stderr[-3000:]
    wait_received(m, 2)
    assert m.job(JOB).samples == 2 * 3 * 2


@pytest.mark.parametrize("argv, target", [
    (["-m", "pkg.mod", "--x", "1"], Target(TargetKind.MODULE, "pkg.mod", ("--x", "1"))),
    ([str(SCRIPT), "a"], Target(TargetKind.SCRIPT, str(SCRIPT), ("a",))),
])
def test_parse_target(argv: list[str], target: Target) -> None:
    assert parse_target(argv) == target


@pytest.mark.parametrize("argv, named", [([], "no script"), (["-m"], "without a module"),
                                         (["--bogus"], "'--bogus'"), (["missing.py"], "'missing.py' not found")])
def test_bad_command_lines_are_named(argv: list[str], named: str) -> None:
    with pytest.raises(LaunchError, match=re.escape(named)):
        parse_target(argv)


def test_exit_codes() -> None:
    assert (exit_code(None), exit_code(4), exit_code("bye")) == (0, 4, 1)


class FakeOptimizer:
    """Stands for a torch optimizer: the counter only needs its identity (a weak reference)."""


def test_counter_counts_one_optimizer_and_yields_to_report(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    for name in ("RANK", "WORLD_SIZE", ENV_JOB_SECRET):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ENV_MONITOR, f"tcp://127.0.0.1:{port}")
    monkeypatch.setenv(ENV_JOB, JOB)
    client.reset()
    try:
        counter = StepCounter(worker_batch=2)
        first, second = FakeOptimizer(), FakeOptimizer()
        for opt in (first, second, first, second):  # e.g. a GAN's two optimizers: only the first counts
            counter.on_step(opt)
        assert (counter.steps, counter.sent) == (2, 1)  # the second step is held until the next
        client.report(9)  # the script reports by itself: the held step is dropped, counting stops
        counter.on_step(first)
        counter.flush()
        assert (counter.steps, counter.sent) == (2, 1)
    finally:
        client.reset()
        pull.close(0)
        ctx.destroy(linger=0)
