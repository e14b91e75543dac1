"""What the full-machine harness (benchmarks/bench_daemon_scale.py) made faster keeps its behaviour:
the store's batched writes, the backend's pilot views built once per change, the hub's ping rate,
the fast checks of the agent channel."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
import zmq

from malletrain.daemon.jobspec import JobSpec, JobState
from malletrain.daemon.store import Store, StoreError
from scavenger import channel as C
from scavenger import protocol as P
from scavenger.base import AgentGone, AgentRoster, PilotRequest, PilotState
from scavenger.hub import AgentHub, _AgentInfo, ping_interval
from scavenger.slurm import SlurmBackend, SlurmConfig
from tests.clusters.fake_slurm import FakeSlurm

SPEC = JobSpec("j", ("true",))


# ---------------------------------------------------------------- Store.batch
def test_a_batch_commits_its_writes_once_and_others_see_them_after(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.db")
    jid = store.submit(SPEC)
    other = sqlite3.connect(tmp_path / "s.db")
    before = store.commits
    with store.batch():
        for i in range(50):
            store.log_event("tick", jid, i=i)
        store.set_samples(jid, 7)
        with store.batch():  # nested: part of the outer one
            store.set_nodes(jid, ["n1"])
        assert other.execute("SELECT COUNT(*) FROM events WHERE kind='tick'").fetchone()[0] == 0
    assert store.commits == before + 1
    assert other.execute("SELECT COUNT(*) FROM events WHERE kind='tick'").fetchone()[0] == 50
    assert store.require(jid).samples == 7 and list(store.require(jid).nodes) == ["n1"]
    store.close()
    other.close()


def test_a_failed_write_in_a_batch_loses_only_itself(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.db")
    jid = store.submit(SPEC)
    store.set_state(jid, JobState.CANCELLED, "by user")
    with store.batch():
        store.log_event("before", jid)
        with pytest.raises(StoreError):
            store.set_state(jid, JobState.RUNNING, "too late")  # a terminal job does not move
        store.log_event("after", jid)
    kinds = [e["kind"] for e in store.events()]
    assert "before" in kinds and "after" in kinds
    assert store.require(jid).state is JobState.CANCELLED
    store.close()


def test_a_batch_that_raises_keeps_the_writes_before_the_error(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.db")
    jid = store.submit(SPEC)
    with pytest.raises(KeyError):
        with store.batch():
            store.log_event("kept", jid)
            raise KeyError("a bug in the step")
    assert [e["kind"] for e in store.events("kept")] == ["kept"]
    store.log_event("later", jid)  # the store is usable: no transaction left open
    assert not store.conn.in_transaction
    store.close()


# ---------------------------------------------------------------- pilot views
def backend() -> tuple[SlurmBackend, FakeSlurm]:
    slurm = FakeSlurm(["n0", "n1", "n2"])
    be = SlurmBackend(SlurmConfig(daemon_address="tcp://127.0.0.1:1", submit_rate=100.0, submit_burst=10,
                                  renew_before_s=0.0), runner=slurm.run)
    return be, slurm


def test_pilot_views_follow_every_change() -> None:
    be, slurm = backend()
    assert dict(be.pilots()) == {} and dict(be.held_nodes()) == {}
    a = be.submit(PilotRequest(("n0",)))
    assert be.pilots()[a].state is PilotState.QUEUED and dict(be.held_nodes()) == {}
    be.poll()
    assert be.pilots()[a].state is PilotState.RUNNING and dict(be.held_nodes()) == {"n0": a}
    be.cancel(a)
    assert be.pilots()[a].cancelling
    be.poll()
    assert a not in be.pilots() and dict(be.held_nodes()) == {}
    b = be.adopt("n2", "777")
    assert b == "777" and dict(be.held_nodes()) == {"n2": "777"}
    with pytest.raises(TypeError):
        be.pilots()["x"] = None  # type: ignore[index]  # read-only: nobody edits the shared views


def test_pilot_views_are_rebuilt_after_a_change_that_failed_halfway() -> None:
    be, slurm = backend()
    a = be.submit(PilotRequest(("n0",)))
    be.poll()
    be.pilots()
    slurm.recall("n0")
    be.runner = lambda argv, **kw: (_ for _ in ()).throw(RuntimeError("scheduler gone"))  # type: ignore[assignment]
    with pytest.raises(RuntimeError):
        be.poll()
    be.runner = slurm.run
    be.poll()
    assert a not in be.pilots()


def test_the_pilot_on_a_node_is_found_through_every_change_of_the_book() -> None:
    from scavenger.base import EndReason
    from scavenger.pilots import Observation, PilotBook

    book = PilotBook()
    a = book.add("1", PilotRequest(("n1",)), 0.0)  # type: ignore[arg-type]
    book.add("2", PilotRequest(("n1",), after="1"), 0.0)  # type: ignore[arg-type]  # a queued replacement
    book.add("3", PilotRequest(()), 0.0)  # type: ignore[arg-type]  # anywhere: nodes known once it runs
    assert book.holder_of(["n1"]) is a and book.holder_of(["n9"]) is None
    book.apply(Observation("3", PilotState.RUNNING, "RUNNING", ("n9",)), 1.0)  # type: ignore[arg-type]
    assert book.holder_of(["n8", "n9"]).id == "3"  # type: ignore[union-attr]
    book.finish("1", EndReason.TIMEOUT, "", 2.0)  # type: ignore[arg-type]
    assert book.holder_of(["n1"]) is None  # only the replacement is left there
    book.finish("3", EndReason.PREEMPTED, "", 2.0)  # type: ignore[arg-type]
    assert book.holder_of(["n9"]) is None and book._on_node == {"n1": {"2"}}


def test_live_pilots_are_remembered_only_when_the_backend_changed(tmp_path: Path) -> None:
    from malletrain.daemon.scavenging import PILOTS_KEY, Scavenging

    class Meta:
        def __init__(self) -> None:
            self.writes = 0
            self.value: str | None = None

        def get_meta(self, key: str) -> str | None:
            return self.value

        def set_meta(self, key: str, value: str) -> None:
            assert key == PILOTS_KEY
            self.writes += 1
            self.value = value

    class Hub(AgentRoster):
        def alive(self) -> set[str]:
            return set()

    be, slurm = backend()
    meta = Meta()
    scav = Scavenging(be, Hub(), lambda *a, **k: None, poll_interval=0.0, meta=meta)
    scav.look(0.0)  # none yet: "{}"
    scav.hold_idle(0.0)
    assert meta.writes == 2 and '"n0"' in (meta.value or "")
    import malletrain.daemon.scavenging as scavenging

    calls = []
    real = scavenging.pilots_json
    scavenging.pilots_json = lambda views, *a: calls.append(1) or real(views, *a)  # type: ignore[assignment]
    try:
        scav.hold_idle(0.1)  # nothing submitted, nothing polled: no JSON of every pilot
        assert calls == [] and meta.writes == 2
        scav.look(0.2)  # a poll may change them: looked at again (unchanged: not written)
        assert calls == [1] and meta.writes == 2
        scav.look(0.3)  # a poll that changed no pilot's view: not even looked at
        assert calls == [1] and meta.writes == 2
    finally:
        scavenging.pilots_json = real  # type: ignore[assignment]


def test_usable_nodes_and_agentless_pilots_read_the_hubs_batch_jobs_at_once() -> None:
    from malletrain.daemon.scavenging import Scavenging

    be, slurm = backend()
    p0, p1, p2 = (be.submit(PilotRequest((n,))) for n in ("n0", "n1", "n2"))
    be.poll()

    class OneByOne(AgentRoster):
        def __init__(self, batches: dict[str, str | None]) -> None:
            self.batches = batches

        def alive(self) -> set[str]:
            return set(self.batches)

        def batch_job(self, node: str) -> str | None:
            return self.batches.get(node)

    class AtOnce(OneByOne):
        def batch_jobs(self) -> dict[str, str | None]:
            return dict(self.batches)

    batches = {"n0": p0, "n1": "someone-else", "n2": None, "n3": "9"}
    logs: dict[str, list[tuple]] = {}
    for hub in (OneByOne(batches), AtOnce(batches)):
        log: list[tuple] = []
        scav = Scavenging(be, hub, lambda kind, job=None, **d: log.append((kind, d)), agent_grace=5.0)
        assert scav.usable() == {"n0", "n2"}
        scav._cancel_agentless(0.0)
        assert scav._agentless_since == {p1: 0.0}  # n1 runs another batch job's agent
        logs[type(hub).__name__] = log
    assert logs["OneByOne"] == logs["AtOnce"]


def test_a_whole_idle_machine_is_held_over_several_holds() -> None:
    from malletrain.daemon.scavenging import MAX_SUBMITS_PER_HOLD, Scavenging

    class Hub(AgentRoster):
        def alive(self) -> set[str]:
            return set()

    nodes = [f"n{i:03d}" for i in range(100)]
    slurm = FakeSlurm(nodes)
    be = SlurmBackend(SlurmConfig(daemon_address="tcp://127.0.0.1:1", max_pilots=1000, submit_rate=1000.0,
                                  submit_burst=1000, renew_before_s=0.0), runner=slurm.run)
    scav = Scavenging(be, Hub(), lambda *a, **k: None)
    scav.look(0.0)
    firsts = scav.hold_idle(0.0)
    assert len(firsts) == MAX_SUBMITS_PER_HOLD < 100
    total = len(firsts)
    for t in range(1, 10):
        scav.look(float(t))
        total += len(scav.hold_idle(float(t)))
    assert total == 100 and len(slurm.running()) == 100  # every node, none twice


# ---------------------------------------------------------------- the hub's pings
def test_ping_interval_scales_with_the_silence_agents_allow() -> None:
    assert ping_interval(5.0) == 0.5 and ping_interval(30.0) == 3.0 and ping_interval(0.2) == 0.5


def test_the_hub_pings_an_agent_about_ten_times_per_dead_after(tmp_path: Path) -> None:
    now = [1000.0]
    hub = AgentHub(dead_after_s=30.0, clock=lambda: now[0], key_file=tmp_path / "agent.key")
    key = C.read_key_file(hub.key_file)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"n1")
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(hub.address)
    try:
        nonce_a = C.new_nonce()
        sock.send(C.challenge_frame(nonce_a))
        deadline = time.monotonic() + 10
        frames: list[bytes] = []

        def pump() -> None:
            hub.poll(timeout_ms=20)
            while sock.poll(20):
                frames.append(sock.recv())

        while not frames and time.monotonic() < deadline:
            pump()
        nonce_h = C.parse_nonce(frames.pop(0))
        sock.send(C.finish_frame(C.agent_proof(key, "n1", nonce_a, nonce_h)))
        while not frames and time.monotonic() < deadline:
            pump()
        assert C.kind_of(frames.pop(0)) is C.Kind.PROOF
        session = C.Session.for_agent(C.session_key(key, "n1", nonce_a, nonce_h))
        sock.send(session.seal(P.encode(P.Hello("n1", 1), 1)))
        pings = 0
        for i in range(60):  # 30 s of hub time in 0.5 s steps, heartbeats keeping the agent alive
            sock.send(session.seal(P.encode(P.Heartbeat("n1"), i + 2)))
            pump()
            now[0] += 0.5
        pump()
        for frame in frames:
            pings += isinstance(P.decode(session.open(frame)), P.Ping)
        assert "n1" in hub.alive()
        assert 9 <= pings <= 11  # every 3 s, not every 0.5 s (60 pings)
    finally:
        sock.close(0)
        ctx.term()
        hub.close()


def test_a_poll_reads_a_bounded_number_of_frames_and_judges_silence_only_when_drained(tmp_path: Path) -> None:
    now = [1000.0]
    hub = AgentHub(dead_after_s=5.0, clock=lambda: now[0], key_file=tmp_path / "agent.key")
    ctx = zmq.Context()
    socks = []
    try:
        for i in range(3):  # unauthenticated frames: each is read (and rejected) like any other
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, f"n{i}".encode())
            s.setsockopt(zmq.LINGER, 0)
            s.connect(hub.address)
            socks.append(s)
        hub.agents["old"] = _AgentInfo(last_seen=0.0)  # an agent silent since long ago
        for s in socks:
            for _ in range(10):
                s.send(b"Xjunk")
        deadline = time.monotonic() + 10
        while hub.sock.poll(10) == 0 and time.monotonic() < deadline:
            pass
        time.sleep(0.3)  # every frame queued at the hub
        assert hub.poll(max_frames=7) == [] and hub.bad_frames == 7
        assert "old" in hub.agents  # not judged: frames were still queued
        events = []
        while hub.bad_frames < 30 and time.monotonic() < deadline:
            events += hub.poll(timeout_ms=20, max_frames=7)
        events += hub.poll(timeout_ms=20)
        assert hub.bad_frames == 30
        assert [(type(e), e.node) for e in events] == [(AgentGone, "old")]
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
        hub.close()


def test_handshakes_in_progress_expire_and_the_oldest_is_evicted(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import scavenger.hub as hub_module

    monkeypatch.setattr(hub_module, "MAX_PENDING", 3)
    now = [0.0]
    hub = AgentHub(clock=lambda: now[0], key_file=tmp_path / "agent.key")
    try:
        for node in (b"a", b"b", b"c"):
            hub._challenge(node, b"x" * 32, now[0])
            now[0] += 1.0
        hub._challenge(b"a", b"y" * 32, now[0])  # a again: now the newest
        hub._challenge(b"d", b"x" * 32, now[0])  # full: b, the oldest, goes
        assert list(hub._pending) == [b"c", b"a", b"d"] and hub.rejected["pending_evicted"] == 1
        now[0] += hub_module.PENDING_TTL_S - 0.5  # c (asked at 2) expired; a and d (at 3) not yet
        hub._challenge(b"e", b"x" * 32, now[0])
        assert list(hub._pending) == [b"a", b"d", b"e"] and hub.rejected["pending_evicted"] == 1
    finally:
        hub.close()


# ---------------------------------------------------------------- the channel's fast checks
def test_frame_kinds_and_macs_are_what_they_were() -> None:
    import hashlib
    import hmac

    for kind in C.Kind:
        assert C.kind_of(kind.value + b"x") is kind
    for bad in (b"Z", b"\x00abc"):
        with pytest.raises(C.ChannelError, match="unknown frame kind"):
            C.kind_of(bad)
    key, data = b"k" * 32, b"some body"
    assert C.agent_proof(key, "n", b"a" * 32, b"b" * 32) == hmac.new(
        key, C._transcript(b"agent", "n", b"a" * 32, b"b" * 32), hashlib.sha256).digest()
    agent, hub = C.Session.for_agent(key), C.Session.for_hub(key)
    assert hub.open(agent.seal(data)) == data


def test_agent_messages_must_be_utf8_json() -> None:
    body = P.encode(P.Heartbeat("n1", ("w1",)), 3)
    assert P.decode(body) == P.Heartbeat("n1", ("w1",))
    with pytest.raises(P.ProtocolError, match="not JSON"):
        P.decode(body.decode().encode("utf-16"))
    with pytest.raises(P.ProtocolError, match="not JSON"):
        P.decode(b"\xff\xfe{}")
