"""Training through a daemon restart and through its own stop.

* A store that answers nothing (a dying daemon's socket, a restarted one not serving yet) never
  blocks the training thread: reconnection runs in the background.
* One idempotent SIGTERM path: a second SIGTERM during the checkpoint write is ignored, the write
  completes and the worker exits 143.
* Reports wait for their step's commit: a rollback sends none of the steps it undoes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest
import torch
import torch.distributed as dist

from malletrain.worker import client
from malletrain.worker.elastic import Rendezvous, State, run
from malletrain.runtimes.torch_elastic import TorchRuntime

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def runtime() -> Iterator[TorchRuntime]:
    rt = TorchRuntime("127.0.0.1", 0)
    rt.start()
    yield rt
    rt.close()


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    yield
    client.reset()
    if dist.is_initialized():
        dist.destroy_process_group()


def _state(rt: TorchRuntime, job: str, worker: str) -> State:
    spec = rt.launch_spec(job, ["x"], worker, "n")
    rdzv = Rendezvous.from_env(spec.env)
    assert rdzv is not None
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return State(model, torch.optim.SGD(model.parameters(), lr=0.1), rendezvous=rdzv, timeout_s=2.0)


def _step(s: State) -> None:
    x = torch.randn(8, 4)
    loss = s.model(x).pow(2).mean()
    s.optimizer.zero_grad()
    loss.backward()
    s.optimizer.step()
    s.step += 1
    s.samples += 8


def test_a_store_that_accepts_but_never_answers_does_not_stall_training(runtime: TorchRuntime) -> None:
    """Before: rank 0 blocked in torch's 30 s TCPStore connect on the training thread (44-56 s stalls)."""
    port = runtime.port
    runtime.set_members("j", ["a"])
    state = _state(runtime, "j", "a")
    blackhole: list[socket.socket] = []
    steps_in_the_hole: list[int] = []

    def train(s: State) -> None:
        deadline = None
        while True:
            _step(s)
            s.commit()
            if s.step == 3 and not blackhole:
                runtime.close()  # the daemon dies ...
                hole = socket.socket()
                hole.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                hole.bind(("127.0.0.1", port))
                hole.listen(64)  # ... and its port accepts connections nobody answers
                blackhole.append(hole)
                deadline = time.monotonic() + 60.0  # a safety net, not a measurement
            elif blackhole:
                steps_in_the_hole.append(s.step)
                assert s._rdzv is not None
                if (len(steps_in_the_hole) >= 200 and s._rdzv.probes >= 3) or time.monotonic() > deadline:
                    return
            time.sleep(0.002)

    try:
        run(train, state)
    finally:
        for hole in blackhole:
            hole.close()
    assert state._rdzv is not None and state._rdzv.probes >= 3  # it kept trying to reconnect ...
    assert len(steps_in_the_hole) >= 200  # ... while training went on
    assert [e.kind for e in state.rescales] == ["join", "leave"] or [e.kind for e in state.rescales] == ["join"]


WORKER = textwrap.dedent("""
    import os, signal, sys
    import torch
    from malletrain.worker.elastic import State, run
    from malletrain.worker.elastic.rendezvous import Rendezvous

    original = Rendezvous.save_checkpoint

    def save_checkpoint(self, snap, gen, aside=False):
        os.kill(os.getpid(), signal.SIGTERM)  # the second SIGTERM (the agent's) lands during the write
        original(self, snap, gen, aside)
        print("checkpoint written at step", snap.counters["step"], flush=True)

    Rendezvous.save_checkpoint = save_checkpoint
    model = torch.nn.Linear(2, 1)
    state = State(model, torch.optim.SGD(model.parameters(), lr=0.1))

    def train(s):
        while True:
            s.step += 1
            s.samples += 4
            s.commit()
            if s.step == 5:
                os.kill(os.getpid(), signal.SIGTERM)  # the first one (Slurm's)

    run(train, state)
""")


def test_a_second_sigterm_never_interrupts_the_checkpoint_and_the_worker_exits_143(runtime: TorchRuntime) -> None:
    """Before: the first SIGTERM restored the default action; the second killed rank 0 mid-checkpoint."""
    runtime.set_members("j", ["w0"])
    env = dict(os.environ)
    env.update(runtime.launch_spec("j", ["x"], "w0", "n").env)
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "checkpoint written at step 5" in proc.stdout
    assert "SIGTERM again: already stopping" in proc.stderr
    assert runtime.checkpoint_generation("j") == 1
    rdzv = Rendezvous.from_env(runtime.launch_spec("j", ["x"], "w1", "n").env)
    assert rdzv is not None
    snap = rdzv.load_checkpoint()
    assert snap is not None and snap.counters["step"] == 5


def test_reports_wait_for_their_commit_and_a_rollback_drops_them(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []

    class Sink:
        def send(self, samples: int, world_size: int, generation: int, timestamp: float | None = None) -> bool:
            sent.append(samples)
            return True

    monkeypatch.setenv("MALLETRAIN_MONITOR", "tcp://127.0.0.1:1")
    monkeypatch.setattr(client, "reporter", lambda: Sink())
    client.hold_reports()
    assert client.report(8) and client.report(8)
    assert sent == []  # not before the commit
    assert client.release_reports() == 2 and sent == [8, 8]
    client.report(8)
    assert client.drop_held_reports() == 1  # rolled back: never sent
    assert client.release_reports() == 0 and sent == [8, 8]


def test_an_agent_warns_of_a_wrong_key_only_when_a_retry_fails_too(caplog: pytest.LogCaptureFixture) -> None:
    """Before: after every daemon restart each agent warned 'is --key-file this daemon's agent key?'
    (two challenges crossed on the reconnect); the key was right."""
    from scavenger import channel as C
    from scavenger.agent import Agent

    agent = Agent("n1", "tcp://127.0.0.1:1", b"k" * C.KEY_BYTES, dead_after_s=30.0)
    try:
        def refused_once() -> None:
            agent.nonce_a, agent.nonce_h = C.new_nonce(), C.new_nonce()  # our proof is out
            agent.next_auth = 99.0
            agent.receive(C.reauth_frame("bad_proof"))

        with caplog.at_level("INFO"):
            refused_once()
        assert "refused_by_server" not in agent.refused and agent.next_auth == 0.0  # retried at once, quietly
        assert "crossed a reconnect" in caplog.text and "is --key-file" not in caplog.text
        with caplog.at_level("INFO"):
            refused_once()  # refused again: now it is worth a warning
        assert agent.refused["refused_by_server"] == 1 and "is --key-file this daemon's agent key?" in caplog.text
    finally:
        agent.sock.close(0)
        agent.monitor.close(0)
        agent.ctx.term()


MID_CALL = textwrap.dedent("""
    import os, signal
    import torch
    from malletrain.worker.elastic import State, run
    from scavenger.channel import Session

    armed = []
    seal = Session.seal

    def sealing(self, body):
        if armed:  # the training thread is inside a store call (its connection's lock held)
            armed.clear()
            os.kill(os.getpid(), signal.SIGTERM)
        return seal(self, body)

    Session.seal = sealing
    model = torch.nn.Linear(2, 1)
    state = State(model, torch.optim.SGD(model.parameters(), lr=0.1))

    def train(s):
        while True:
            s.step += 1
            s.samples += 4
            if s.step == 5:
                armed.append(1)  # rank 0's look at the store in this commit gets the signal
            s.commit()

    run(train, state)
""")


def test_a_sigterm_in_the_middle_of_a_store_call_still_checkpoints_and_exits_143(runtime: TorchRuntime) -> None:
    """Before: the handler wrote the checkpoint on the connection whose lock the interrupted call
    held, and hung there until the agent's SIGKILL (the checkpoint of a clean stop was lost)."""
    runtime.set_members("j", ["w0"])
    env = dict(os.environ)
    env.update(runtime.launch_spec("j", ["x"], "w0", "n").env)
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", MID_CALL], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "stored the checkpoint of step 5" in proc.stderr
    assert runtime.checkpoint_generation("j") == 1
