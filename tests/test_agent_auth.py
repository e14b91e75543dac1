"""The authenticated agent channel (issue E, finding 5 "agent hijack"; issue F, agent parts).

A local user who binds the agents' port while the daemon is down must get nothing run by
the agents; forged, replayed, reordered or reflected frames are dropped; agents without
the key are refused; the daemon does not give its configured port up; the agent says
which batch job it runs in and leaves with 143 on SIGTERM.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain.daemon.config import DaemonConfig, LocalConfig, Ports
from malletrain.daemon import Daemon, DaemonError
from procs import procs_mentioning
from scavenger import channel as C
from scavenger import protocol as P
from scavenger.agent import batch_job_from
from contract.exits import EXIT_SIGTERM
from scavenger.base import AgentUp
from scavenger.hub import AgentHub, AgentWorkers, WorkerExitedEvent, WorkerStartedEvent
from stepping import wait_until

NODE = "node00"


def key_file(tmp: Path, name: str = "agent.key") -> str:
    path = tmp / name
    C.create_key_file(path)
    return str(path)


def marker_argv(path: Path) -> tuple[str, ...]:
    """A worker that leaves ``path`` behind: proof that a command ran."""
    return (sys.executable, "-c", f"open({str(path)!r}, 'w').write('ran')")


def start_agent(address: str, key: str, log: Path, *extra: str, env: dict[str, str] | None = None,
                node: str = NODE) -> subprocess.Popen[bytes]:
    out = open(log, "ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "scavenger.agent", "--node", node, "--daemon", address, "--key-file", key,
             "--heartbeat", "0.1", *extra],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    finally:
        out.close()


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


class FakeHub:
    """A ROUTER on ``address`` that speaks the channel with ``key``: the hijacker (wrong key) or,
    with the right key, a daemon that can also send forged, replayed and reflected frames."""

    def __init__(self, key: bytes, address: str = "tcp://127.0.0.1:0") -> None:
        self.key = key
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(address)
        self.address = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.session: C.Session | None = None
        self.nonce: tuple[bytes, bytes] | None = None
        self.received: list[bytes] = []  # data frames from the agent, raw
        self.messages: list[P.AgentMessage] = []  # the ones that opened under our session, decoded
        self.finish_seen = 0
        self.ident = NODE.encode()  # the agent's identity, once it spoke

    def pump(self, timeout_ms: int = 50) -> None:
        if not self.sock.poll(timeout_ms):
            return
        while True:
            try:
                ident, frame = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            node = P.node_of(ident)
            self.ident = ident
            kind = C.kind_of(frame)
            if kind is C.Kind.CHALLENGE:
                self.nonce = (C.parse_challenge(frame), C.new_nonce())
                self.sock.send_multipart([ident, C.nonce_frame(self.nonce[1])])
            elif kind is C.Kind.FINISH and self.nonce is not None:  # proves itself whatever the agent's proof
                self.finish_seen += 1
                self.sock.send_multipart([ident, C.proof_frame(C.hub_proof(self.key, node, *self.nonce))])
                self.session = C.Session.for_hub(C.session_key(self.key, node, *self.nonce))
            elif kind is C.Kind.DATA:
                self.received.append(frame)
                if self.session is not None:
                    self.messages.append(P.decode(self.session.open(frame)))

    def send_raw(self, frame: bytes) -> None:
        self.sock.send_multipart([self.ident, frame])

    def sealed(self, msg: P.AgentMessage) -> bytes:
        """``msg`` sealed as the hub would (or as a hijacker with the wrong key would)."""
        if self.session is None:  # no handshake finished (the agent refused ours): seal under our own guess
            self.session = C.Session.for_hub(C.session_key(self.key, msg.node, b"\0" * 32, b"\0" * 32))
        return self.session.seal(P.encode(msg))

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()  # returns once the listening socket is really closed: the port is free again


class RawAgent:
    """An in-process agent (DEALER) that authenticates with ``key`` and sends what a test wants."""

    def __init__(self, address: str, key: bytes, node: str = NODE, ident: bytes | None = None) -> None:
        self.node, self.key = node, key
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, node.encode() if ident is None else ident)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.session: C.Session | None = None

    def recv(self, hub: AgentHub, events: list | None = None) -> bytes:
        """The next frame from the hub (polled here; its events into ``events`` when given)."""
        deadline = time.monotonic() + 10
        while not self.sock.poll(20):
            (events if events is not None else []).extend(hub.poll(20))
            assert time.monotonic() < deadline, "no answer from the hub"
        return self.sock.recv()

    def handshake(self, hub: AgentHub, events: list | None = None) -> bool:
        """Run the handshake against ``hub`` (polled here); True if the hub accepted us and proved the key."""
        nonce_a = C.new_nonce()
        self.sock.send(C.challenge_frame(nonce_a))
        nonce_h = C.parse_nonce(self.recv(hub, events))
        self.sock.send(C.finish_frame(C.agent_proof(self.key, self.node, nonce_a, nonce_h)))
        self.session = C.Session.for_agent(C.session_key(self.key, self.node, nonce_a, nonce_h))
        answer = self.recv(hub, events)
        if C.kind_of(answer) is C.Kind.REAUTH:
            assert C.parse_reauth(answer) == "bad_proof"
            return False
        return C.parse_proof(answer) == C.hub_proof(self.key, self.node, nonce_a, nonce_h)

    def send(self, frame: bytes) -> None:
        self.sock.send(frame)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


# ---- the session: forged, replayed, reordered, reflected ---------------------------------


def test_session_rejects_forged_replayed_reordered_and_reflected_frames() -> None:
    s = secrets.token_bytes(32)
    agent, hub = C.Session.for_agent(s), C.Session.for_hub(s)
    f1, f2 = agent.seal(b"one"), agent.seal(b"two")
    forged = f1[:-1] + b"X"
    with pytest.raises(C.ChannelError) as info:
        hub.open(forged)
    assert info.value.reason == "bad_mac"
    assert hub.open(f2) == b"two"
    with pytest.raises(C.ChannelError) as info:  # f1 after f2: reordered
        hub.open(f1)
    assert info.value.reason == "replayed"
    with pytest.raises(C.ChannelError) as info:  # f2 again: replayed
        hub.open(f2)
    assert info.value.reason == "replayed"
    with pytest.raises(C.ChannelError) as info:  # the agent's own frame sent back to it: reflected
        C.Session.for_agent(s).open(agent.seal(b"three"))
    assert info.value.reason == "bad_mac"
    with pytest.raises(C.ChannelError) as info:  # another session's frame
        C.Session.for_hub(secrets.token_bytes(32)).open(C.Session.for_agent(secrets.token_bytes(32)).seal(b"x"))
    assert info.value.reason == "bad_mac"


def test_proofs_are_bound_to_role_node_and_nonces() -> None:
    k, a, h = secrets.token_bytes(32), C.new_nonce(), C.new_nonce()
    proofs = {C.hub_proof(k, "n1", a, h), C.agent_proof(k, "n1", a, h), C.session_key(k, "n1", a, h),
              C.hub_proof(k, "n2", a, h), C.hub_proof(k, "n1", h, a), C.hub_proof(secrets.token_bytes(32), "n1", a, h)}
    assert len(proofs) == 6


def test_key_file_is_created_private_reused_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "agent.key"
    key = C.create_key_file(path)
    assert len(key) == C.KEY_BYTES and path.stat().st_mode & 0o777 == 0o600
    assert C.create_key_file(path) == key == C.read_key_file(path)  # reused: agents outlive a restart
    path.chmod(0o644)
    with pytest.raises(C.KeyFileError, match="agent.key.*mode 0600"):
        C.read_key_file(path)
    path.chmod(0o600)
    path.write_bytes(b"short")
    with pytest.raises(C.KeyFileError, match="holds 5 bytes"):
        C.read_key_file(path)
    with pytest.raises(C.KeyFileError, match="missing.key"):
        C.read_key_file(tmp_path / "missing.key")


# ---- the hub refuses agents that cannot prove the key ------------------------------------


def test_hub_refuses_an_agent_without_the_key_and_creates_no_state() -> None:
    hub = AgentHub()
    impostor = RawAgent(hub.address, secrets.token_bytes(32))
    plain = RawAgent(hub.address, b"", node="node01")
    try:
        assert not impostor.handshake(hub)  # refused: and the hub never showed it a proof of the key
        assert impostor.session is not None
        impostor.send(impostor.session.seal(P.encode(P.Hello(NODE, 1234))))
        plain.send(P.encode(P.Hello("node01", 99)))  # the old, unauthenticated protocol
        plain.send(P.encode(P.WorkerExited("node01", "j1.w0", 0)))
        events: list = []
        wait_until(lambda: hub.rejected["no_session"] + hub.rejected["malformed"] >= 3, "all four frames refused", 15.0, tick=lambda: events.extend(hub.poll(20)), pause=0)
        assert events == [] and hub.alive() == set() and hub.agents == {}
        assert hub.rejected["bad_proof"] == 1
        assert hub.rejected["no_session"] >= 1  # the impostor's hello: no session was made for it
        assert hub.rejected["malformed"] == 2  # plain JSON is not a channel frame
        assert hub._pending == {} and hub._sessions == {}
    finally:
        impostor.close()
        plain.close()
        hub.close()


def test_hub_drops_forged_replayed_and_wrong_node_frames_from_a_real_session() -> None:
    hub = AgentHub()
    agent = RawAgent(hub.address, C.read_key_file(hub.key_file))
    try:
        assert agent.handshake(hub)
        s = agent.session
        assert s is not None
        hello = s.seal(P.encode(P.Hello(NODE, 1234, (), "77")))
        agent.send(hello)
        events: list = []
        wait_until(lambda: AgentUp(NODE) in events, "hello", 15.0, tick=lambda: events.extend(hub.poll(20)), pause=0)
        assert AgentUp(NODE) in events and AgentWorkers(NODE, 1234, (), "77") in events
        assert hub.batch_job(NODE) == "77"
        exited = s.seal(P.encode(P.WorkerExited(NODE, "j1.w0", 0)))
        agent.send(exited[:-1] + bytes([exited[-1] ^ 1]))  # forged body
        agent.send(hello)  # replayed
        agent.send(s.seal(P.encode(P.WorkerExited("node09", "j1.w0", 0))))  # speaks for another node
        agent.send(s.seal(P.encode(P.StartWorker(NODE, "w", ("true",)))))  # a daemon's message: wrong way
        agent.send(s.seal(b"[" * 100_000))  # malformed body under a valid MAC
        agent.send(s.seal(json.dumps({"v": 1, "type": "hello", "job": NODE,
                                      "payload": {"pid": 1, "batch_job": "a b"}}).encode()))
        for junk in (b"", b"D", b"C" + b"x" * 5, b"F", b"Z" * 64, b"R" + b"x" * 10):
            agent.send(junk)
        events = []
        wait_until(lambda: hub.bad_frames >= 12, "every bad frame refused", 15.0, tick=lambda: events.extend(hub.poll(20)), pause=0)
        assert not [e for e in events if isinstance(e, (WorkerExitedEvent, WorkerStartedEvent))]
        assert hub.rejected["bad_mac"] == 1 and hub.rejected["replayed"] == 1
        assert hub.rejected["wrong_node"] == 1 and hub.rejected["wrong_direction"] == 2
        assert hub.rejected["bad_message"] == 2 and hub.rejected["malformed"] == 5
        agent.send(exited)  # genuine, but sealed before frames the hub has accepted since: reordered
        wait_until(lambda: hub.rejected["replayed"] == 2, "reordered frame refused", 15.0, tick=lambda: events.extend(hub.poll(20)), pause=0)
        agent.send(s.seal(P.encode(P.WorkerExited(NODE, "j1.w0", 0))))  # a fresh one goes through
        wait_until(lambda: WorkerExitedEvent(NODE, "j1.w0", 0) in events, "fresh frame accepted", 15.0, tick=lambda: events.extend(hub.poll(20)), pause=0)
        assert [e for e in events if isinstance(e, WorkerExitedEvent)] == [WorkerExitedEvent(NODE, "j1.w0", 0)]
        assert hub.alive() == {NODE}
    finally:
        agent.close()
        hub.close()


# ---- an agent replaced on its node, an agent reconnecting -----------------------------------


def test_a_replacement_agent_is_answered_while_the_old_one_still_holds_the_node(tmp_path: Path) -> None:
    """A pilot's replacement starts on the node before the old pilot's agent has gone (Slurm's ``afterany``
    at a walltime, the hub busy). Before, both agents named themselves by the node alone, and the hub's
    router dropped the newcomer's every frame unanswered while it held the old connection (and after:
    nothing was ever read from it again), so the replacement gave up and its pilot was lost. Now the new
    agent is answered and reported, and the old one is told to leave."""
    hub = AgentHub(dead_after_s=30.0)
    old = start_agent(hub.address, hub.key_file, tmp_path / "old.log", "--dead-after", "30")
    new: subprocess.Popen[bytes] | None = None
    try:
        events: list = []
        tick = lambda: events.extend(hub.poll(50))  # noqa: E731
        wait_until(lambda: hub.pid(NODE) == old.pid, "the old agent up", 15.0, tick=tick, pause=0)
        new = start_agent(hub.address, hub.key_file, tmp_path / "new.log", "--dead-after", "30")
        wait_until(lambda: hub.pid(NODE) == new.pid, "the new agent answered and reported", 30.0, tick=tick, pause=0)
        assert AgentWorkers(NODE, new.pid, (), None) in events
        assert old.wait(timeout=30) == 0  # released: told to leave
        for _ in range(20):
            tick()
        assert hub.alive() == {NODE} and hub.pid(NODE) == new.pid  # the old one's leaving is not the node's
        assert new.poll() is None
    finally:
        stop(old)
        if new is not None:
            stop(new)
        hub.close()


def test_the_old_agents_workers_count_as_stopped_and_its_frames_are_dropped() -> None:
    hub = AgentHub()
    key = C.read_key_file(hub.key_file)
    old = RawAgent(hub.address, key, ident=P.agent_identity(NODE))
    new = RawAgent(hub.address, key, ident=P.agent_identity(NODE))
    try:
        events: list = []
        tick = lambda: events.extend(hub.poll(20))  # noqa: E731
        assert old.handshake(hub) and old.session is not None
        old.send(old.session.seal(P.encode(P.Hello(NODE, 11, ("j1.w0",), "7"))))
        wait_until(lambda: AgentWorkers(NODE, 11, ("j1.w0",), "7") in events, "the old agent's hello", 15.0, tick=tick, pause=0)
        assert new.handshake(hub, events) and new.session is not None
        wait_until(lambda: WorkerExitedEvent(NODE, "j1.w0", 143, True) in events, "the old worker stopped", 15.0, tick=tick, pause=0)
        told = P.decode(old.session.open(old.recv(hub)))
        assert told == P.Shutdown(NODE)
        new.send(new.session.seal(P.encode(P.Hello(NODE, 22, (), "8"))))
        wait_until(lambda: AgentWorkers(NODE, 22, (), "8") in events, "the new agent's hello", 15.0, tick=tick, pause=0)
        old.send(old.session.seal(P.encode(P.Leaving(NODE, "released"))))
        wait_until(lambda: hub.rejected["replaced"] == 1, "the old agent's frame dropped", 15.0, tick=tick, pause=0)
        assert not [e for e in events if not isinstance(e, (AgentUp, AgentWorkers, WorkerExitedEvent))]
        assert hub.alive() == {NODE} and hub.pid(NODE) == 22 and hub.batch_job(NODE) == "8"
        assert hub.send(P.Ping(NODE))
        assert P.decode(new.session.open(new.recv(hub))) == P.Ping(NODE)
    finally:
        old.close()
        new.close()
        hub.close()


def test_an_agent_reconnecting_while_the_hub_still_holds_its_connection_is_answered() -> None:
    """The same identity on a second connection (an agent's socket reconnected before the hub saw its old
    connection end): before, the router dropped it unanswered; now the new connection takes it over."""
    hub = AgentHub()
    key = C.read_key_file(hub.key_file)
    ident = P.agent_identity(NODE)
    first = RawAgent(hub.address, key, ident=ident)
    second: RawAgent | None = None
    try:
        assert first.handshake(hub)
        second = RawAgent(hub.address, key, ident=ident)
        assert second.handshake(hub)
    finally:
        first.close()
        if second is not None:
            second.close()
        hub.close()


def test_a_challenge_sent_again_before_the_hubs_answer_still_authenticates() -> None:
    """Under load an agent sends its challenge again before the hub's answer to the first arrives; the two
    answers cross: it proves its newer challenge with the first nonce it reads. The hub takes that proof
    (both nonces fresh, the key proved), not a ``bad_proof`` warning and a handshake to start over (beside
    two CPU hogs, the daemon's agents crossed again and again, and a job's nodes never came back); a proof
    over the replaced challenge, or a nonce never sent, is still refused."""
    hub = AgentHub()
    key = C.read_key_file(hub.key_file)
    agent = RawAgent(hub.address, key, ident=P.agent_identity(NODE))
    try:
        first, again = C.new_nonce(), C.new_nonce()
        agent.send(C.challenge_frame(first))
        agent.send(C.challenge_frame(again))  # its retry, before the hub answered
        answer_first, answer_again = (C.parse_nonce(agent.recv(hub)) for _ in range(2))
        agent.send(C.finish_frame(C.agent_proof(key, NODE, again, answer_first)))
        events: list = []
        answer = agent.recv(hub, events)
        assert C.kind_of(answer) is C.Kind.PROOF, answer
        assert C.parse_proof(answer) == C.hub_proof(key, NODE, again, answer_first)
        assert hub.rejected["bad_proof"] == 0
        agent.session = C.Session.for_agent(C.session_key(key, NODE, again, answer_first))
        agent.send(agent.session.seal(P.encode(P.Hello(NODE, 1234))))
        wait_until(lambda: any(isinstance(e, AgentUp) for e in [*events, *hub.poll(20)]), "the agent up", timeout=10)
        for nonce_a, nonce_h in ((first, answer_first), (again, C.new_nonce())):  # stale, or never sent
            agent.send(C.challenge_frame(C.new_nonce()))
            agent.send(C.challenge_frame(again))
            [C.parse_nonce(agent.recv(hub)) for _ in range(2)]
            agent.send(C.finish_frame(C.agent_proof(key, NODE, nonce_a, nonce_h)))
            refused = agent.recv(hub)
            assert C.kind_of(refused) is C.Kind.REAUTH and C.parse_reauth(refused) == "bad_proof"
    finally:
        agent.close()
        hub.close()


def test_an_agents_identity_is_its_node_and_a_tag_of_its_own() -> None:
    a, b = P.agent_identity("node7"), P.agent_identity("node7")
    assert a != b and P.node_of(a) == P.node_of(b) == "node7"
    assert P.node_of(b"node7") == "node7"  # an identity without a tag: the node alone
    assert P.agent_identity("n" * 250) == b"n" * 250  # no room for a tag within ZeroMQ's 255 bytes


# ---- a real agent and a hijacker -----------------------------------------------------------


@pytest.mark.slow
def test_a_hijacker_on_the_port_gets_nothing_run_and_the_agent_finds_the_daemon_again(tmp_path: Path) -> None:
    """The daemon is down; a local user binds its agent port first, without the key. The agent
    runs none of its commands; when the real daemon binds the port again, the agent proves
    itself to it, reports its batch job and runs the daemon's commands."""
    key = key_file(tmp_path)
    hijacker = FakeHub(secrets.token_bytes(32))  # wrong key
    address = hijacker.address
    log = tmp_path / "agent.log"
    agent = start_agent(address, key, log, "--dead-after", "30", env={"SLURM_JOB_ID": "4242"})
    hub: AgentHub | None = None
    try:
        wait_until(lambda: "bad_proof" in log.read_text(), "the agent refused the hijacker", 15.0, tick=hijacker.pump, pause=0)
        # the hijacker tries every command it can think of: sealed under its guess, raw JSON, replayed hub frames
        for i in range(5):
            hijacker.send_raw(hijacker.sealed(P.StartWorker(NODE, f"evil{i}", marker_argv(tmp_path / f"evil{i}"))))
            hijacker.send_raw(P.encode(P.StartWorker(NODE, f"raw{i}", marker_argv(tmp_path / f"raw{i}"))))
            hijacker.send_raw(C.reauth_frame("please"))
            hijacker.pump(100)
        hijacker.send_raw(P.encode(P.Shutdown(NODE)))
        for _ in range(10):
            hijacker.pump(50)
        assert hijacker.finish_seen >= 1 and hijacker.received == []  # no session: not even a hello
        assert agent.poll() is None  # it neither obeyed the shutdown nor died
        hijacker.close()

        hub = AgentHub(address, dead_after_s=30.0, key_file=key)  # the daemon is back on its port
        events: list = []
        wait_until(lambda: AgentUp(NODE) in events, "agent up at the real daemon", 15.0, tick=lambda: events.extend(hub.poll(50)), pause=0)  # type: ignore[union-attr]
        assert hub.batch_job(NODE) == "4242"
        assert hub.start_worker(NODE, "good", marker_argv(tmp_path / "good"), {}, None)
        wait_until(lambda: any(isinstance(e, WorkerExitedEvent) for e in events), "the daemon's worker ran", 15.0, tick=lambda: events.extend(hub.poll(50)), pause=0)  # type: ignore[union-attr]
        assert WorkerExitedEvent(NODE, "good", 0) in events
        assert (tmp_path / "good").read_text() == "ran"
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("evil", "raw"))) == []
        text = log.read_text()
        assert "cannot prove the daemon's agent key" in text and "nothing is executed" in text
        assert "started" not in text.split("authenticated the daemon")[0]  # nothing ran before the real daemon
    finally:
        stop(agent)
        if hub is not None:
            hub.close()
        try:
            hijacker.close()
        except zmq.ZMQError:
            pass


@pytest.mark.slow
def test_a_real_agent_drops_forged_replayed_and_reflected_commands(tmp_path: Path) -> None:
    key = key_file(tmp_path)
    fake = FakeHub(C.read_key_file(key))  # knows the key: checks what the agent accepts frame by frame
    agent = start_agent(fake.address, key, tmp_path / "agent.log", "--dead-after", "30")

    def exited(name: str) -> bool:
        return any(isinstance(m, P.WorkerExited) and m.worker == name for m in fake.messages)

    try:
        wait_until(lambda: fake.messages != [], "handshake and hello", 15.0, tick=fake.pump, pause=0)
        hello = fake.messages[0]
        assert isinstance(hello, P.Hello) and hello.batch_job is None and hello.pid == agent.pid
        good = fake.sealed(P.StartWorker(NODE, "w1", marker_argv(tmp_path / "w1")))
        forged = bytearray(fake.sealed(P.StartWorker(NODE, "w2", marker_argv(tmp_path / "w2"))))
        forged[-40] ^= 1  # one bit of the body changed after sealing
        w3 = fake.sealed(P.StartWorker(NODE, "w3", marker_argv(tmp_path / "w3")))
        fake.send_raw(good)
        fake.send_raw(bytes(forged))
        fake.send_raw(good)  # replayed
        fake.send_raw(w3)
        fake.send_raw(fake.received[0])  # the agent's own hello reflected back to it
        fake.send_raw(b"D" + b"\0" * 50)
        fake.send_raw(b"\xff" * 100)
        wait_until(lambda: exited("w1") and exited("w3"), "w1 and w3 ran and exited", 15.0, tick=fake.pump, pause=0)
        (tmp_path / "w3").unlink()
        fake.send_raw(w3)  # replayed after w3 ended (a new start of w3 would run it again): dropped
        fake.send_raw(good)
        fake.send_raw(fake.sealed(P.StartWorker(NODE, "w5", marker_argv(tmp_path / "w5"))))
        wait_until(lambda: exited("w5"), "w5 (sent last) ran: every frame before it was handled", 15.0, tick=fake.pump, pause=0)
        assert not (tmp_path / "w2").exists() and not (tmp_path / "w3").exists()
        assert agent.poll() is None
        assert sorted(m.worker for m in fake.messages if isinstance(m, P.WorkerStarted)) == ["w1", "w3", "w5"]
        text = (tmp_path / "agent.log").read_text()
        assert "bad_mac" in text and "replayed" in text
    finally:
        stop(agent)
        fake.close()


@pytest.mark.slow
def test_an_agent_with_the_wrong_key_is_refused_by_the_hub(tmp_path: Path) -> None:
    hub = AgentHub(dead_after_s=30.0)
    agent = start_agent(hub.address, key_file(tmp_path, "other.key"), tmp_path / "agent.log", "--dead-after", "30")
    try:
        events: list = []
        wait_until(lambda: hub.rejected["bad_proof"] >= 2, "two refused handshakes", 15.0, tick=lambda: events.extend(hub.poll(50)), pause=0)
        assert events == [] and hub.alive() == set()
        assert not hub.start_worker(NODE, "w", marker_argv(tmp_path / "w"), {}, None)
        # the agent warns once a retry is refused too (a first refusal may be a crossed reconnect)
        wait_until(lambda: "is --key-file this daemon's agent key?"
                   in (tmp_path / "agent.log").read_text(), "the agent's warning", 15.0, tick=lambda: events.extend(hub.poll(50)), pause=0)
    finally:
        stop(agent)
        hub.close()


def test_an_agent_without_a_readable_key_file_does_not_start(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "scavenger.agent", "--node", NODE, "--daemon", "tcp://127.0.0.1:1",
                          "--key-file", str(tmp_path / "nope.key")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "nope.key" in res.stderr


# ---- SIGTERM -------------------------------------------------------------------------------


CHECKPOINTER = (
    "import signal, sys, time\n"
    "def term(*_):\n"
    "    open(sys.argv[1], 'w').write('checkpoint')\n"
    "    sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "open(sys.argv[1] + '.up', 'w').close()\n"
    "time.sleep(60)\n"
)


@pytest.mark.slow
def test_sigterm_stops_workers_so_they_checkpoint_and_the_agent_exits_143(tmp_path: Path) -> None:
    hub = AgentHub(dead_after_s=30.0)
    agent = start_agent(hub.address, hub.key_file, tmp_path / "agent.log", "--dead-after", "30")
    ckpt = tmp_path / "ckpt"
    try:
        events: list = []
        tick = lambda: events.extend(hub.poll(50))  # noqa: E731
        wait_until(lambda: AgentUp(NODE) in events, "agent up", 15.0, tick=tick, pause=0)
        hub.start_worker(NODE, "w", (sys.executable, "-c", CHECKPOINTER, str(ckpt)), {}, None)
        wait_until(lambda: Path(str(ckpt) + ".up").exists(), "worker up", 15.0, tick=tick, pause=0)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == EXIT_SIGTERM == 143
        assert ckpt.read_text() == "checkpoint"  # the worker was asked to stop, and did
        wait_until(lambda: WorkerExitedEvent(NODE, "w", 143, True) in events, "the worker's exit reported", 15.0, tick=tick, pause=0)
    finally:
        stop(agent)
        hub.close()


@pytest.mark.slow
def test_the_agent_says_which_exits_it_caused_and_a_job_exiting_143_by_itself_is_not_one(tmp_path: Path) -> None:
    """Before: the daemon read a stop from the code alone, so a job exiting 143 by itself was never failed."""
    hub = AgentHub(dead_after_s=30.0)
    agent = start_agent(hub.address, hub.key_file, tmp_path / "agent.log", "--dead-after", "30")
    ckpt = tmp_path / "ckpt"
    try:
        events: list = []
        tick = lambda: events.extend(hub.poll(50))  # noqa: E731
        wait_until(lambda: AgentUp(NODE) in events, "agent up", 15.0, tick=tick, pause=0)
        hub.start_worker(NODE, "self", (sys.executable, "-c", "raise SystemExit(143)"), {}, None)
        wait_until(lambda: WorkerExitedEvent(NODE, "self", 143, False) in events, "its own exit reported", 15.0, tick=tick, pause=0)
        hub.start_worker(NODE, "w", (sys.executable, "-c", CHECKPOINTER, str(ckpt)), {}, None)
        wait_until(lambda: Path(str(ckpt) + ".up").exists(), "worker up", 15.0, tick=tick, pause=0)
        hub.stop_worker(NODE, "w", grace=10.0)
        wait_until(lambda: WorkerExitedEvent(NODE, "w", 143, True) in events, "the stop reported", 15.0, tick=tick, pause=0)
    finally:
        stop(agent)
        hub.close()


# ---- Hello.batch_job -----------------------------------------------------------------------


def test_hello_batch_job_round_trip_and_validation() -> None:
    for job in (None, "4242", "123.pbs-server", "77_3", "x" * P.BATCH_JOB_MAX):
        msg = P.Hello(NODE, 12, ("j1.w0",), job)
        assert P.decode(P.encode(msg)) == msg
    for bad in ("", "a b", "x" * (P.BATCH_JOB_MAX + 1), "\x1b[31mred", "é", 5, ["1"], {"a": 1}, True):
        body = json.dumps({"v": 1, "type": "hello", "job": NODE, "seq": 1,
                           "payload": {"pid": 12, "workers": [], "batch_job": bad}})
        with pytest.raises(P.ProtocolError, match="batch_job"):
            P.decode(body.encode())
    assert batch_job_from({"SLURM_JOB_ID": "12", "PBS_JOBID": "9.s"}) == "12"
    assert batch_job_from({"PBS_JOBID": "9.server"}) == "9.server"
    assert batch_job_from({}) is None
    assert batch_job_from({"SLURM_JOB_ID": "bad id\n"}) is None  # logged, never sent


def test_decode_checks_every_field_by_type_and_range() -> None:
    def body(type_: str, **payload: object) -> bytes:
        return json.dumps({"v": 1, "type": type_, "job": NODE, "seq": 1, "payload": payload}).encode()

    for frame, field in [
        (body("hello", pid="abc"), "pid"), (body("hello", pid=-1), "pid"), (body("hello", pid=True), "pid"),
        (body("worker_exited", worker="w", code=1e400), "code"),
        (body("worker_exited", worker="w", code=1000), "code"),
        (body("start_worker", worker="w", argv=["a", 1]), "argv"),
        (body("start_worker", worker="w", argv=["a\0b"]), "argv"),
        (body("start_worker", worker="w", argv=["a"], env={"A=B": "1"}), "env"),
        (body("start_worker", worker="w", argv=["a"], cwd="/x\0y"), "cwd"),
        (body("stop_worker", worker="w", grace=float("nan")), "grace"),
        (body("stop_worker", worker="w", grace=-1), "grace"),
        (body("heartbeat", workers=["a b"]), "workers"),
        (body("leaving", reason="x" * 100), "reason"),
    ]:
        with pytest.raises(P.ProtocolError, match=field):
            P.decode(frame)
    with pytest.raises(P.ProtocolError, match="not JSON"):
        P.decode(b"[" * 100_000)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
).map(lambda v: json.dumps({"v": 1, "type": "start_worker", "job": NODE, "payload": v}).encode()))
def test_decode_raises_only_protocol_errors(frame: bytes) -> None:
    try:
        P.decode(frame)
    except P.ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_channel_parsers_raise_only_channel_errors(frame: bytes) -> None:
    session = C.Session.for_hub(bytes(32))
    for parse in (C.kind_of, session.open, C.parse_challenge, C.parse_nonce, C.parse_finish, C.parse_proof,
                  C.parse_reauth):
        try:
            parse(frame)
        except C.ChannelError:
            pass


# ---- the daemon keeps its agent port -------------------------------------------------------


def _config(tmp: Path, agents: int) -> DaemonConfig:
    return DaemonConfig(state_dir=str(tmp / "state"), runtime="toy", local=LocalConfig(nodes=1, trace="none"),
                        agent_heartbeat=0.2, agent_dead_after=4.0, loop_interval=0.05, ports=Ports(agents=agents))


def test_the_daemon_refuses_a_taken_agent_port_and_names_it(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        port = squatter.getsockname()[1]
        with pytest.raises(DaemonError, match=rf"agents port {port} .*taken \(by pid {os.getpid()}"):
            Daemon(_config(tmp_path, port))
    assert procs_mentioning(str(tmp_path / "state")) == []


@pytest.mark.slow
def test_a_floating_port_taken_after_a_restart_is_an_error_event_and_the_key_is_kept(tmp_path: Path) -> None:
    d = Daemon(_config(tmp_path, 0))
    try:
        port = int(d.hub.address.rsplit(":", 1)[1])
        key = C.read_key_file(d.hub.key_file)
        assert Path(d.hub.key_file) == tmp_path / "state" / C.AGENT_KEY_FILE
    finally:
        d.close()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen(1)
        d = Daemon(_config(tmp_path, 0))
        try:
            assert int(d.hub.address.rsplit(":", 1)[1]) != port
            assert C.read_key_file(d.hub.key_file) == key  # the same key: agents survive restarts
            taken = [e for e in d.store.events() if e["kind"] == "port_taken"]
            assert len(taken) == 1 and str(port) in json.dumps(taken[0], default=str)
        finally:
            d.close()
    assert procs_mentioning(str(tmp_path / "state")) == []


def test_an_unanswered_handshake_waits_longer_each_time_and_a_session_resets_it() -> None:
    """A hub slower than a second (a whole machine reconnecting) must see a challenge held long
    enough to answer it: before, the agent re-sent every 1 s, so each answer arrived too late.
    (A session resets the wait, and a lost one challenges at once: a restart costs nothing.)"""
    from scavenger.agent import AUTH_RETRY_MAX_S, AUTH_RETRY_S, Agent

    ctx = zmq.Context.instance()
    silent = ctx.socket(zmq.ROUTER)  # takes the challenges, never answers
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    agent = Agent(NODE, f"tcp://127.0.0.1:{port}", secrets.token_bytes(C.KEY_BYTES), 0.5, 10.0)
    try:
        deadline = time.monotonic() + 15
        while agent.nonce_a is None:  # the first challenge goes out once the connection is up
            assert time.monotonic() < deadline, "the agent never sent a challenge"
            agent.authenticate(time.monotonic())
            time.sleep(0.05)
        seen = []
        for _ in range(6):
            now = agent.next_auth + 0.01  # the last challenge went unanswered
            agent.authenticate(now)
            seen.append(agent.auth_wait)
            assert 0.8 * agent.auth_wait <= agent.next_auth - now <= 1.2 * agent.auth_wait  # jittered
        assert seen == [min(AUTH_RETRY_S * 2 ** k, AUTH_RETRY_MAX_S) for k in range(1, 7)]
        assert agent.refused["no_answer"] == 6
    finally:
        agent.sock.close(0)
        agent.monitor.close(0)
        agent.ctx.term()
        silent.close(0)


@pytest.mark.slow
def test_a_worker_runs_with_the_umask_its_start_carries(tmp_path: Path) -> None:
    """Before: every worker ran with the agent's umask (0022 under a root daemon), whatever its submitter's."""
    import os
    import stat

    hub = AgentHub(dead_after_s=30.0)
    agent = start_agent(hub.address, hub.key_file, tmp_path / "agent.log", "--dead-after", "30")
    out = tmp_path / "ckpt"
    try:
        events: list = []
        tick = lambda: events.extend(hub.poll(50))  # noqa: E731
        wait_until(lambda: AgentUp(NODE) in events, "agent up", 15.0, tick=tick, pause=0)
        old = os.umask(0o022)
        try:
            hub.start_worker(NODE, "w", (sys.executable, "-c", f"open({str(out)!r}, 'w').close()"), {}, None,
                             umask=0o077)
            wait_until(lambda: WorkerExitedEvent(NODE, "w", 0) in events, "worker done", 15.0, tick=tick, pause=0)
        finally:
            os.umask(old)
        assert stat.S_IMODE(out.stat().st_mode) == 0o600
    finally:
        stop(agent)
        hub.close()
