"""The Slurm stand-in of the scale harness, read by the Slurm backend's own parsers, and the
parsers' fast paths (same values and errors as the plain ones)."""

from __future__ import annotations

import os
import random
import time
from datetime import datetime, timedelta

import pytest
import zmq

from scavenger.base import EndReason, NodeState, PilotEnded, PilotRequest, PilotStarted, PilotState
from scavenger.slurm import ReplyTimes, SlurmBackend, SlurmConfig, SlurmDialect, expand_hostlist, parse_time
from tests.clusters.fake_slurm import FakeSlurm, remote_runner, serve_once


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def backend_on(slurm: FakeSlurm, clock: Clock) -> SlurmBackend:
    return SlurmBackend(SlurmConfig(daemon_address="tcp://127.0.0.1:1", max_pilots=100, submit_rate=1000.0,
                                    submit_burst=100, renew_before_s=0.0), clock=clock, runner=slurm.run)


def test_pilots_start_on_idle_nodes_and_a_recall_preempts_them() -> None:
    clock = Clock()
    started, stopped = [], []
    slurm = FakeSlurm([f"n{i:02d}" for i in range(8)], clock=clock,
                      on_start=lambda n, p: started.append((n, p)), on_stop=lambda n, p, w: stopped.append((n, w)))
    slurm.recall("n07")  # the main queue holds it
    be = backend_on(slurm, clock)
    found = be.discover()
    assert found.idle == frozenset(f"n{i:02d}" for i in range(7))
    assert {n.name: n.state for n in found.nodes}["n07"] is NodeState.BUSY
    a = be.submit(PilotRequest(("n00",)))
    b = be.submit(PilotRequest(("n07",)))  # busy: stays queued
    events = be.poll()
    assert [e.pilot for e in events if isinstance(e, PilotStarted)] == [a]
    assert be.pilots()[b].state is PilotState.QUEUED
    assert started == [("n00", a)]
    assert "n00" not in be.discover().idle
    clock.t += 10
    assert slurm.recall("n00") == a
    assert stopped == [("n00", "recalled")]
    ended = [e for e in be.poll() if isinstance(e, PilotEnded)]
    assert [(e.pilot, e.reason) for e in ended] == [(a, EndReason.PREEMPTED)]  # PreemptTime, via scontrol
    slurm.give_back("n07")
    slurm.tick()
    assert [e.pilot for e in be.poll() if isinstance(e, PilotStarted)] == [b]


def test_a_cancel_ends_the_pilot_and_frees_its_node() -> None:
    clock = Clock()
    stopped = []
    slurm = FakeSlurm(["n0", "n1"], clock=clock, on_stop=lambda n, p, w: stopped.append(n))
    be = backend_on(slurm, clock)
    pid = be.submit(PilotRequest(("n1",)))
    be.poll()
    be.cancel(pid)
    assert stopped == ["n1"]
    ended = [e for e in be.poll() if isinstance(e, PilotEnded)]
    assert [(e.pilot, e.reason) for e in ended] == [(pid, EndReason.CANCELLED)]
    assert "n1" in be.discover().idle


def test_bad_commands_get_errors_not_answers() -> None:
    slurm = FakeSlurm(["n0"])
    assert slurm.run(["sbatch", "--parsable", "--nodelist=nX", "--wrap", "x"]).returncode == 1
    assert slurm.run(["scancel", "99999"]).returncode == 1
    assert slurm.run(["srun", "x"]).returncode == 127


def test_the_remote_runner_reaches_the_stand_in() -> None:
    ctx = zmq.Context.instance()
    rep = ctx.socket(zmq.REP)
    port = rep.bind_to_random_port("tcp://127.0.0.1")
    slurm = FakeSlurm(["n0", "n1"])
    run = remote_runner(f"tcp://127.0.0.1:{port}")
    import threading

    server = threading.Thread(target=serve_once, args=(rep, slurm))
    server.start()
    res = run(["sinfo", "-N", "-h", "-o", "%N|%T"], timeout=10.0)
    server.join()
    rep.close(0)
    assert res.returncode == 0 and res.stdout == "n0|idle\nn1|idle\n"


def test_a_full_machine_reply_parses_to_every_node_and_pilot() -> None:
    names = [f"x{i:05d}" for i in range(3000)]
    ticks = iter(range(10**9))
    slurm = FakeSlurm(names, clock=lambda: 1_700_000_000.0 + 0.7 * next(ticks))
    dialect = SlurmDialect(SlurmConfig(daemon_address="tcp://127.0.0.1:1"))
    pilots = [dialect.parse_submit(slurm.run(dialect.render_submit(PilotRequest((n,)), 3600.0))) for n in names]
    for n in names[::3]:
        slurm.recall(n)
    nodes = dialect.parse_nodes(slurm.run(dialect.render_nodes()))
    assert [n.name for n in nodes] == sorted(names) and all(n.state is NodeState.BUSY for n in nodes)
    obs = dialect.parse_poll(slurm.run(dialect.render_poll(pilots)), pilots)
    assert [o.pilot for o in obs] == pilots
    assert sum(o.state is PilotState.ENDED for o in obs) == 1000
    for o in obs:
        assert o.start == pytest.approx(o.start // 1) and o.nodes and len(o.nodes) == 1


def test_sinfo_keeps_the_first_line_of_a_node_listed_in_two_partitions() -> None:
    from scavenger.base import CommandResult

    dialect = SlurmDialect(SlurmConfig(daemon_address="tcp://127.0.0.1:1"))
    res = CommandResult(("sinfo",), 0, "b|idle\na|allocated\nb|allocated\na|idle-\n", "", 0.0)
    nodes = dialect.parse_nodes(res)
    assert [(n.name, n.state, n.planned) for n in nodes] == [("a", NodeState.BUSY, False), ("b", NodeState.IDLE, False)]


@pytest.mark.parametrize("tz", ["UTC", "America/New_York", "Australia/Lord_Howe", "Europe/Berlin"])
def test_reply_times_give_what_parse_time_gives(tz: str) -> None:
    old = os.environ.get("TZ")
    os.environ["TZ"] = tz
    time.tzset()
    try:
        rng = random.Random(tz)
        times = ReplyTimes()
        texts = []
        start = datetime(2021, 1, 1)
        for _ in range(3000):
            texts.append((start + timedelta(seconds=rng.randrange(0, 4 * 365 * 86400))).strftime("%Y-%m-%dT%H:%M:%S"))
        for switch in ("2021-03-14T02", "2021-11-07T01", "2021-10-03T02", "2021-04-04T01", "2021-03-28T02",
                       "2021-10-31T02"):  # DST hours of the zones above (skipped and doubled ones)
            texts += [f"{switch}:{m:02d}:{s:02d}" for m in range(0, 60, 7) for s in (0, 31, 59)]
        for text in texts:
            try:
                want: float | str | None = parse_time(text)
            except ValueError as exc:
                want = str(exc)
            try:
                got: float | str | None = times.time(text)
            except ValueError as exc:
                got = str(exc)
            assert got == want, text
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


@pytest.mark.parametrize("text", ["2026-13-01T00:00:00", "2026-02-30T10:00:00", "2026-01-01T24:00:00",
                                  "2026-01-01T00:60:00", "2026-01-01T00:00:60", "2026-01-01 00:00:00", "soon"])
def test_reply_times_refuse_what_parse_time_refuses(text: str) -> None:
    with pytest.raises(ValueError) as plain:
        parse_time(text)
    with pytest.raises(ValueError) as fast:
        ReplyTimes().time(text)
    assert str(fast.value) == str(plain.value)


def test_reply_times_read_durations_and_no_times() -> None:
    t = ReplyTimes()
    assert t.duration("1-0:00:00") == 86400.0 and t.duration("1-0:00:00") == 86400.0
    assert t.duration("UNLIMITED") is None and t.time("N/A") is None
    assert t.time("2026-1-01T00:00:00") == parse_time("2026-1-01T00:00:00")  # strptime takes one digit too
    with pytest.raises(ValueError):
        t.duration("1-x")


def test_a_plain_host_name_is_one_node() -> None:
    assert expand_hostlist(" a01n01 ") == ("a01n01",)
    assert expand_hostlist("a[01-02],b") == ("a01", "a02", "b")
    with pytest.raises(ValueError):
        expand_hostlist("a]")
