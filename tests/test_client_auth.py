"""report(samples) signs with the job's secret from the environment; the monitor takes only that."""

from __future__ import annotations

from typing import Iterator

import pytest
import zmq

from malletrain.worker import client
from contract.messages import new_secret
from contract.workerenv import ENV_JOB_SECRET
from malletrain.daemon.monitor import Monitor
from launching import wait_received

ENV = ("MALLETRAIN_MONITOR", "MALLETRAIN_JOB", "MALLETRAIN_WORKER", ENV_JOB_SECRET, "RANK", "WORLD_SIZE",
       "TORCHELASTIC_RESTART_COUNT")


@pytest.fixture
def mon(monkeypatch: pytest.MonkeyPatch) -> Iterator[Monitor]:
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    client.reset()
    ctx = zmq.Context()
    m = Monitor(ctx=ctx)
    monkeypatch.setenv("MALLETRAIN_MONITOR", m.address)
    monkeypatch.setenv("MALLETRAIN_JOB", "j000001")
    monkeypatch.setenv("MALLETRAIN_WORKER", "j000001.n0.1")
    yield m
    client.reset()
    m.close()
    ctx.destroy(linger=0)


def test_signed_reports_are_accepted(mon: Monitor, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = new_secret()
    mon.register("j000001", secret)
    monkeypatch.setenv(ENV_JOB_SECRET, secret)
    client.set_context(rank=0, world_size=2, generation=4)
    assert all(client.report(32) for _ in range(5))
    wait_received(mon, 5)
    st = mon.job("j000001")
    assert (mon.accepted, st.samples, st.world_size, st.generation) == (5, 160, 2, 4)


def test_a_wrong_or_missing_secret_is_refused(mon: Monitor, monkeypatch: pytest.MonkeyPatch) -> None:
    mon.register("j000001", new_secret())
    monkeypatch.setenv(ENV_JOB_SECRET, new_secret())  # e.g. another job's secret
    assert client.report(32)
    wait_received(mon, 1)
    client.reset()
    monkeypatch.delenv(ENV_JOB_SECRET)
    assert client.report(32)  # sent unsigned: the training loop goes on, the monitor refuses it
    wait_received(mon, 2)
    counts = mon.counts()
    assert (counts["accepted"], counts["bad_signature"], counts["unsigned"]) == (0, 1, 1)
    assert mon.job("j000001").samples == 0


def test_a_malformed_secret_is_named(mon: Monitor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_JOB_SECRET, "not-hex")
    with pytest.raises(ValueError, match=ENV_JOB_SECRET):
        client.report(32)


def test_explicit_secret_and_per_worker_counters(mon: Monitor) -> None:
    secret = new_secret()
    mon.register("j000001", secret)
    first = client.Reporter(mon.address, "j000001", "w-a", secret=secret)
    second = client.Reporter(mon.address, "j000001", "w-b", secret=secret)  # a new rank 0: seq from 1 again
    try:
        assert first.send(8, 1, 0) and first.send(8, 1, 0) and second.send(8, 2, 1)
        wait_received(mon, 3)
    finally:
        first.close(0)
        second.close(0)
    assert mon.accepted == 3 and mon.job("j000001").samples == 24


def test_a_restarted_worker_is_a_new_sender(mon: Monitor, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torchrun-style restart keeps MALLETRAIN_WORKER and counts seq from 1 again: not a replay."""
    secret = new_secret()
    mon.register("j000001", secret)
    monkeypatch.setenv(ENV_JOB_SECRET, secret)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for restart in ("0", "1", "2"):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", restart)
        client.close()  # flush, then forget everything: a new process
        client.reset()
        assert client.report(10) and client.report(10)
    wait_received(mon, 6)
    st = mon.job("j000001")
    assert (mon.accepted, st.samples, st.generation) == (6, 60, 2)
