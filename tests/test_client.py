"""The one line: report() reaches a PULL socket, never blocks, only rank 0 sends."""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import Iterator

import pytest
import zmq

from malletrain.worker import client
from contract.messages import decode, decode_report


@pytest.fixture(autouse=True)
def fresh_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("MALLETRAIN_MONITOR", "MALLETRAIN_JOB", "MALLETRAIN_WORKER", "RANK", "WORLD_SIZE",
                "HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    client.reset()
    yield
    client.reset()


@pytest.fixture
def monitor(monkeypatch: pytest.MonkeyPatch) -> Iterator[zmq.Socket]:
    ctx = zmq.Context.instance()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    monkeypatch.setenv("MALLETRAIN_MONITOR", f"tcp://127.0.0.1:{port}")
    monkeypatch.setenv("MALLETRAIN_JOB", "job7")
    monkeypatch.setenv("MALLETRAIN_WORKER", "w3")
    yield pull
    pull.close(0)


def _recv(pull: zmq.Socket, timeout_ms: int = 5000) -> bytes:
    assert pull.poll(timeout_ms), "no report arrived"
    return pull.recv()


def test_no_monitor_is_a_no_op() -> None:
    assert client.report(32) is False


def test_reports_reach_the_monitor(monitor: zmq.Socket) -> None:
    client.set_context(rank=0, world_size=4, generation=3)
    assert client.report(128) is True
    assert client.report(128) is True
    first = decode_report(decode(_recv(monitor)))
    second = decode_report(decode(_recv(monitor)))
    assert (first.job, first.worker, first.samples, first.world_size, first.generation) == ("job7", "w3", 128, 4, 3)
    assert first.timestamp > 1.6e9
    assert (first.seq, second.seq) == (1, 2)


def test_reports_count_nodes_when_a_node_runs_several_ranks(monitor: zmq.Socket,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """3 nodes of 2 ranks: the monitor and the policy count nodes, so the report says 3, not 6."""
    client.set_context(rank=0, world_size=6, generation=2, per_node=2)
    assert client.report(96) is True
    assert decode_report(decode(_recv(monitor))).world_size == 3
    with pytest.raises(ValueError, match="ranks a node"):
        client.set_context(rank=0, world_size=5, generation=2, per_node=2)
    client.reset()  # no context: from torchrun's variables alone
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert client.report(64) is True
    assert decode_report(decode(_recv(monitor))).world_size == 2


def test_only_rank_zero_reports(monitor: zmq.Socket) -> None:
    client.set_context(rank=1, world_size=2, generation=1)
    assert client.report(64) is False
    assert not monitor.poll(100)


def test_context_from_environment(monitor: zmq.Socket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "0")
    assert client.report(256)
    assert decode_report(decode(_recv(monitor))).world_size == 8
    monkeypatch.setenv("RANK", "nope")
    with pytest.raises(ValueError, match="RANK='nope'"):
        client.report(256)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "32"])
def test_bad_samples_named(bad: object) -> None:
    with pytest.raises(ValueError, match="samples"):
        client.report(bad)  # type: ignore[arg-type]


def test_bad_context_rejected() -> None:
    with pytest.raises(ValueError, match="rank 2 of world size 2"):
        client.set_context(rank=2, world_size=2, generation=0)


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_full_queue_drops_instead_of_blocking() -> None:
    rep = client.Reporter(f"tcp://127.0.0.1:{_unused_port()}", "j", "w")  # nobody listens
    try:
        results = [rep.send(1, 1, 0) for _ in range(client.SEND_HWM + 500)]
    finally:
        rep.close(0)
    assert results[0] is True
    assert rep.dropped >= 1 and results[-1] is False
    assert rep.sent + rep.dropped == client.SEND_HWM + 500


def test_bad_monitor_address_is_named() -> None:
    with pytest.raises(ValueError, match="MALLETRAIN_MONITOR='nonsense'"):
        client.Reporter("nonsense", "j")


def test_imports_point_one_way() -> None:
    """The client never imports the elastic layer (nor torch); the elastic layer uses the client."""
    code = ("import sys; import malletrain.worker.client as c; "
            "assert 'malletrain.worker.elastic' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules); "
            "assert not hasattr(c, 'State') and not hasattr(c, 'run')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    from malletrain.worker.elastic import State, run  # the users' import path
    from malletrain.worker.elastic import state as elastic_state

    assert callable(run) and isinstance(State, type)
    assert elastic_state.client is client
