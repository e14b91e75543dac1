"""Local backend with real node-agent processes: hold, heartbeat, workers, recall, orphans."""

from __future__ import annotations

import sys
import time

import numpy as np
import psutil
import pytest

from scavenger import protocol as P
from scavenger.base import (
    AgentGone,
    AgentUp,
    BackendError,
    NodeIdle,
    NodeRecalled,
    PilotState,
    PilotStateError,
    PilotTable,
    run_command,
)
from scavenger.hub import AgentHub, AgentWorkers, WorkerExitedEvent, WorkerStartedEvent
from scavenger.local import LocalBackend
from traces.model import IdleTimeline

SLEEPER = (sys.executable, "-c", "import time; time.sleep(60)")


def wait_for(hub: AgentHub, backend: LocalBackend | None, pred, timeout: float = 10.0) -> list:
    seen: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen.extend(hub.poll(50))
        if backend is not None:
            seen.extend(backend.poll())
        if pred(seen):
            return seen
    raise AssertionError(f"condition not met; events: {seen}")


def gone(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_pilot_table_only_allows_documented_transitions() -> None:
    t = PilotTable()
    t.hold("n1")
    assert t.hold("n1").state is PilotState.HOLDING  # idempotent
    t.move("n1", PilotState.HELD)
    t.move("n1", PilotState.HELD)  # same state: no-op
    t.move("n1", PilotState.RECALLED)
    assert "n1" not in t  # terminal pilots are dropped
    t.hold("n2")
    t.move("n2", PilotState.RELEASED)
    t.hold("n3")
    t.move("n3", PilotState.HELD)
    t._pilots["n3"].state = PilotState.RELEASED  # forced terminal state
    with pytest.raises(PilotStateError, match="n3"):
        t.move("n3", PilotState.HELD)


def test_run_command_captures_and_raises_with_result() -> None:
    res = run_command([sys.executable, "-c", "print('hi')"])
    assert res.returncode == 0 and res.stdout.strip() == "hi"
    with pytest.raises(BackendError) as info:
        run_command([sys.executable, "-c", "import sys; sys.stderr.write('bad'); sys.exit(3)"])
    assert info.value.result is not None and info.value.result.returncode == 3
    assert "bad" in str(info.value)
    with pytest.raises(BackendError, match="not found"):
        run_command(["/nonexistent/malletrain-xyz"])
    with pytest.raises(BackendError, match="timed out"):
        run_command([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.3)


def test_protocol_round_trip_and_rejects_bad_frames() -> None:
    msg = P.StartWorker("node01", "j1.w0", ("python", "-V"), {"A": "1"}, "/tmp")
    assert P.decode(P.encode(msg)) == msg
    for bad, why in [
        (b"\xff", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"v":9,"type":"ping","job":"n","seq":1,"payload":{}}', "version 9"),
        (b'{"v":1,"type":"nope","job":"n","seq":1,"payload":{}}', "unknown agent message type"),
        (b'{"v":1,"type":"ping","job":"","seq":1,"payload":{}}', "no node"),
    ]:
        with pytest.raises(P.ProtocolError, match=why):
            P.decode(bad)


@pytest.mark.slow
def test_agent_runs_workers_and_recall_kills_them() -> None:
    hub = AgentHub(dead_after_s=5.0)
    backend = LocalBackend(2, hub.address, agent_args=("--heartbeat", "0.1"))
    try:
        assert backend.poll() == [NodeIdle("node00"), NodeIdle("node01")]
        backend.hold("node00")
        backend.hold("node00")  # idempotent
        assert backend.held_nodes() == {"node00"} and backend.idle_nodes() == {"node01"}
        wait_for(hub, backend, lambda ev: AgentUp("node00") in ev)
        backend.agent_up("node00")
        assert backend.pilots.get("node00").state is PilotState.HELD
        hub.start_worker("node00", "j1.w0", SLEEPER, {"X": "1"}, None)
        ev = wait_for(hub, backend, lambda ev: any(isinstance(e, WorkerStartedEvent) for e in ev))
        worker_pid = next(e.pid for e in ev if isinstance(e, WorkerStartedEvent))
        agent_pid = backend.agent_pids()["node00"]
        assert psutil.Process(worker_pid).is_running()
        # the main scheduler takes the node back: SIGTERM on the agent
        backend.recall("node00")
        ev = wait_for(hub, backend, lambda ev: any(isinstance(e, AgentGone) for e in ev))
        assert NodeRecalled("node00", True) in ev
        assert any(isinstance(e, WorkerExitedEvent) and e.worker == "j1.w0" for e in ev)
        assert AgentGone("node00", "recalled") in ev
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (gone(worker_pid) and gone(agent_pid)):
            backend.poll()
            time.sleep(0.05)
        assert gone(worker_pid) and gone(agent_pid)
        assert backend.held_nodes() == set()
        assert "node00" not in backend.idle_nodes()
    finally:
        backend.close()
        hub.close()


@pytest.mark.slow
def test_stop_worker_and_agent_exits_when_daemon_goes_silent() -> None:
    hub = AgentHub()
    backend = LocalBackend(1, hub.address, agent_args=("--heartbeat", "0.1", "--dead-after", "1.0"))
    try:
        backend.hold("node00")
        wait_for(hub, backend, lambda ev: AgentUp("node00") in ev)
        hub.start_worker("node00", "a", SLEEPER, {}, None)
        hub.start_worker("node00", "b", SLEEPER, {}, None)
        ev = wait_for(hub, backend, lambda ev: sum(isinstance(e, WorkerStartedEvent) for e in ev) == 2)
        pids = {e.worker: e.pid for e in ev if isinstance(e, WorkerStartedEvent)}
        hub.stop_worker("node00", "a", grace=0.5)
        ev = wait_for(hub, backend, lambda ev: any(isinstance(e, WorkerExitedEvent) for e in ev))
        exited = [e for e in ev if isinstance(e, WorkerExitedEvent)]
        assert [e.worker for e in exited] == ["a"] and exited[0].code < 0
        assert hub.workers("node00") == {"b"}
        agent_pid = backend.agent_pids()["node00"]
        # the daemon stops pinging (we stop polling the hub): the agent must leave and kill "b"
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not (gone(agent_pid) and gone(pids["b"])):
            backend.poll()
            time.sleep(0.1)
        assert gone(agent_pid) and gone(pids["b"])
        assert AgentGone("node00", "daemon_lost") in hub.poll(100)
    finally:
        backend.close()
        hub.close()


def _timeline() -> IdleTimeline:
    # t=0: a idle; t=10: b idle; t=20: a recalled; t=30: c idle
    return IdleTimeline(
        source="test", format="test", nodes=("a", "b", "c"), start=0.0, end=40.0,
        initial_idle=frozenset({"a"}),
        times=np.array([10.0, 20.0, 30.0]), node_ids=np.array([1, 0, 2], dtype=np.int32),
        idle=np.array([True, False, True]),
    )


def test_local_backend_follows_the_trace_in_compressed_time() -> None:
    now = [100.0]
    backend = LocalBackend(3, "tcp://127.0.0.1:1", _timeline(), time_scale=10.0, clock=lambda: now[0])
    assert backend.poll() == [NodeIdle("node00")]
    now[0] = 100.5  # trace time 5
    assert backend.poll() == []
    now[0] = 101.0  # trace time 10
    assert backend.poll() == [NodeIdle("node01")]
    now[0] = 103.5  # trace time 35: a recalled (not held), c idle
    assert backend.poll() == [NodeRecalled("node00", False), NodeIdle("node02")]
    assert backend.idle_nodes() == {"node01", "node02"}
    # restart from the stored epoch: same state
    again = LocalBackend(3, "x", _timeline(), time_scale=10.0, epoch=100.0, clock=lambda: now[0])
    again.poll()
    assert again.idle_nodes() == {"node01", "node02"}


@pytest.mark.slow
def test_trace_recall_of_a_held_node_kills_its_agent() -> None:
    hub = AgentHub()
    now = [0.0]
    backend = LocalBackend(3, hub.address, _timeline(), time_scale=1.0, clock=lambda: now[0])
    try:
        backend.poll()
        backend.hold("node00")
        wait_for(hub, backend, lambda ev: AgentUp("node00") in ev)
        pid = backend.agent_pids()["node00"]
        now[0] = 20.0
        ev = wait_for(hub, backend, lambda ev: any(isinstance(e, AgentGone) for e in ev))
        assert NodeRecalled("node00", True) in ev
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not gone(pid):
            backend.poll()
            time.sleep(0.05)
        assert gone(pid)
    finally:
        backend.close()
        hub.close()


def test_slot_timeline_keeps_the_first_idle_nodes_of_a_big_machine() -> None:
    from scavenger.local import slot_timeline

    big = IdleTimeline(
        source="big", format="test", nodes=tuple("abcde"), start=0.0, end=10.0,
        initial_idle=frozenset("abc"),
        times=np.array([1.0, 2.0, 3.0, 4.0]), node_ids=np.array([3, 0, 1, 4], dtype=np.int32),
        idle=np.array([True, False, False, True]),
    )  # idle count: 3, 4 at t=1, 3 at t=2, 2 at t=3, 3 at t=4
    s = slot_timeline(big, 3)  # capped counts: 3, 3, 3, 2, 3
    assert s.initial_idle == {"slot0", "slot1", "slot2"}
    assert [(b.time, b.became_idle, b.recalled) for b in s.batches()] == [
        (3.0, (), ("slot2",)), (4.0, ("slot2",), ()),
    ]
    assert slot_timeline(big, 2).n_events == 0  # never fewer than 2 idle: the 2 slots never change
    s4 = slot_timeline(big, 4)
    assert [(b.time, b.became_idle, b.recalled) for b in s4.batches()] == [
        (1.0, ("slot3",), ()), (2.0, (), ("slot3",)), (3.0, (), ("slot2",)), (4.0, ("slot2",), ()),
    ]
