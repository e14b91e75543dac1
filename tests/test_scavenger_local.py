"""Local backend with real node-agent processes: hold, heartbeat, workers, recall, orphans."""

from __future__ import annotations

import json
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
    EndReason,
    PilotEnded,
    PilotQueued,
    PilotRequest,
    PilotStarted,
    PilotState,
    run_command,
)
from scavenger.hub import AgentHub, AgentWorkers, WorkerExitedEvent, WorkerStartedEvent
from scavenger.local import LocalBackend
from stepping import poll
from traces.model import IdleTimeline

SLEEPER = (sys.executable, "-c", "import time; time.sleep(60)")


def wait_for(hub: AgentHub, backend: LocalBackend | None, pred, timeout: float = 10.0) -> list:
    """Events from the hub (and the backend) until ``pred(events)``."""
    seen: list = []

    def tick() -> None:
        seen.extend(hub.poll(50))
        if backend is not None:
            seen.extend(backend.poll())

    poll(lambda: pred(seen), timeout, tick=tick, pause=0)
    assert pred(seen), f"condition not met; events: {seen}"
    return seen


def gone(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


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
        (b'{"v":1,"type":"ping","job":"a b","seq":1,"payload":{}}', "bad node name"),
        (b'{"v":1,"type":"hello","job":"n","seq":1,"payload":{}}', "pid"),
        (b'{"v":1,"type":"worker_exited","job":"n","seq":1,"payload":{"worker":"w","code":"0"}}', "code"),
    ]:
        with pytest.raises(P.ProtocolError, match=why):
            P.decode(bad)


@pytest.mark.slow
def test_agent_runs_workers_and_recall_kills_them() -> None:
    hub = AgentHub(dead_after_s=5.0)
    backend = LocalBackend(2, hub.address, agent_args=("--heartbeat", "0.1", "--key-file", hub.key_file))
    try:
        assert backend.discover().idle == {"node00", "node01"}
        pilot = backend.submit(PilotRequest(("node00",)))
        assert backend.submit(PilotRequest(("node00",))) == pilot  # idempotent
        assert backend.discover().idle == {"node01"}
        assert backend.poll() == [PilotQueued(pilot, ("node00",)), PilotStarted(pilot, ("node00",), None)]
        assert backend.pilots()[pilot].state is PilotState.RUNNING
        ev = wait_for(hub, backend, lambda ev: AgentUp("node00") in ev)
        assert hub.batch_job("node00") == pilot  # the agent's hello ties it to its pilot
        assert AgentWorkers("node00", backend.agent_pids()["node00"], (), pilot) in ev
        hub.start_worker("node00", "j1.w0", SLEEPER, {"X": "1"}, None)
        ev = wait_for(hub, backend, lambda ev: any(isinstance(e, WorkerStartedEvent) for e in ev))
        worker_pid = next(e.pid for e in ev if isinstance(e, WorkerStartedEvent))
        agent_pid = backend.agent_pids()["node00"]
        assert psutil.Process(worker_pid).is_running()
        # the main scheduler takes the node back: SIGTERM on the agent
        backend.recall("node00")
        ev = wait_for(hub, backend, lambda ev: any(isinstance(e, AgentGone) for e in ev))
        assert [(e.pilot, e.reason) for e in ev if isinstance(e, PilotEnded)] == [(pilot, EndReason.PREEMPTED)]
        assert any(isinstance(e, WorkerExitedEvent) and e.worker == "j1.w0" for e in ev)
        assert AgentGone("node00", "recalled") in ev
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (gone(worker_pid) and gone(agent_pid)):
            backend.poll()
            time.sleep(0.05)
        assert gone(worker_pid) and gone(agent_pid)
        assert backend.pilots() == {}
        assert backend.discover().idle == {"node01"}  # node00 works for the main scheduler now
        other = backend.submit(PilotRequest(("node01",)))
        backend.cancel(other)  # our own cancel: the agent leaves, the pilot ends cancelled
        ev = wait_for(hub, backend, lambda ev: any(isinstance(e, PilotEnded) for e in ev))
        assert [(e.pilot, e.reason) for e in ev if isinstance(e, PilotEnded)] == [(other, EndReason.CANCELLED)]
    finally:
        backend.close()
        hub.close()


@pytest.mark.slow
def test_stop_worker_and_agent_exits_when_daemon_goes_silent() -> None:
    hub = AgentHub()
    backend = LocalBackend(1, hub.address, agent_args=("--heartbeat", "0.1", "--dead-after", "1.0",
                                                      "--key-file", hub.key_file))
    try:
        backend.submit(PilotRequest(("node00",)))
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
    assert backend.discover().idle == {"node00"}
    now[0] = 100.5  # trace time 5
    assert backend.discover().idle == {"node00"}
    now[0] = 101.0  # trace time 10
    assert backend.discover().idle == {"node00", "node01"}
    now[0] = 103.5  # trace time 35: a recalled (not held), c idle
    d = backend.discover()
    assert d.idle == {"node01", "node02"} and backend.poll() == []  # no pilot: no pilot event
    assert [(n.name, n.state.value) for n in d.nodes] == [("node00", "busy"), ("node01", "idle"), ("node02", "idle")]
    # restart from the stored epoch: same state
    again = LocalBackend(3, "x", _timeline(), time_scale=10.0, epoch=100.0, clock=lambda: now[0])
    assert again.discover().idle == {"node01", "node02"}


@pytest.mark.slow
def test_trace_recall_of_a_held_node_kills_its_agent() -> None:
    hub = AgentHub()
    now = [0.0]
    backend = LocalBackend(3, hub.address, _timeline(), time_scale=1.0, clock=lambda: now[0],
                           agent_args=("--key-file", hub.key_file))
    try:
        pilot = backend.submit(PilotRequest(("node00",)))
        wait_for(hub, backend, lambda ev: AgentUp("node00") in ev)
        pid = backend.agent_pids()["node00"]
        now[0] = 20.0
        ev = wait_for(hub, backend, lambda ev: any(isinstance(e, AgentGone) for e in ev))
        assert PilotEnded(pilot, ("node00",), EndReason.PREEMPTED, "recalled by the main scheduler") in ev
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


def test_start_worker_carries_the_owner_and_the_agent_decides_who_runs_it() -> None:
    import os

    import pytest

    from scavenger import protocol as P
    from scavenger.agent import RunAs, run_as_owner

    msg = P.StartWorker("node00", "w1", ("/bin/true",), {}, None, 65534, 65534)
    assert P.decode(P.encode(msg)) == msg
    for bad in (-1, True, 2**32, "0", 1.5):
        frame = P.encode(msg).replace(b'"uid":65534', b'"uid":' + json.dumps(bad).encode())
        with pytest.raises(P.ProtocolError, match="uid"):
            P.decode(frame)
    assert run_as_owner(P.StartWorker("n", "w", ("x",))) is None  # no owner: the agent's own user
    assert run_as_owner(P.StartWorker("n", "w", ("x",), uid=os.geteuid())) is None
    other = run_as_owner(P.StartWorker("n", "w", ("x",), uid=65534, gid=65534))
    if os.geteuid() == 0:
        assert isinstance(other, RunAs) and (other.uid, other.gid) == (65534, 65534)
        assert other.popen_args() == {"user": 65534, "group": 65534, "extra_groups": []}
    else:  # a non-root agent cannot switch: it refuses rather than run the job as itself
        assert isinstance(other, str) and "cannot switch users" in other
