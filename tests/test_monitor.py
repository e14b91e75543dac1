"""Job monitor: real senders, zero loss, and every attack of issue E #2/#3 refused and counted."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Callable, Iterator

import itertools
import json

import pytest
import zmq
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from contract.messages import MAX_FRAME, MAX_INT, Reason, Report, new_secret, secret_key
from malletrain.daemon.monitor import (
    MAX_WORKERS,
    JobStats,
    REPLAY_META_KEY,
    ReplaySaver,
    Monitor,
    load_master_key,
)
from contract.messages import job_secret
from scavenger.channel import KeyFileError

CTX = zmq.Context.instance()
SECRETS = (new_secret(), new_secret())
INPROC = itertools.count()

SENDER = """
import sys, zmq
from contract.messages import Report, secret_key
addr, job, n, secret = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
key = secret_key(secret)
ctx = zmq.Context(); s = ctx.socket(zmq.PUSH); s.connect(addr)
for i in range(n):
    ws = 1 if i < n // 2 else 2
    t = 1000.0 + i * 0.1 + (0.5 if i >= n // 2 else 0.0)
    s.send(Report(job, i + 1, 32 * ws, t, ws, ws - 1, "w0").encode(key))
s.send(b"garbage")
s.send(b'{"v":1,"type":"report","job":"x","seq":1,"payload":{}}')
s.close(linger=-1); ctx.term()
"""


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


@pytest.fixture
def mon(ctx: zmq.Context) -> Iterator[Monitor]:
    m = Monitor(ctx=ctx)
    yield m
    m.close()


def push(ctx: zmq.Context, mon: Monitor) -> zmq.Socket:
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(mon.address)
    return s


def drain_until(mon: Monitor, received: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while mon.received < received and time.monotonic() < deadline:
        mon.drain(timeout_ms=50)
    assert mon.received == received


def test_real_senders_zero_loss_and_bad_frames_counted(mon: Monitor) -> None:
    n = 2000
    secrets_ = {f"j{k}": new_secret() for k in range(3)}
    for job, secret in secrets_.items():
        mon.register(job, secret)
    procs = [subprocess.Popen([sys.executable, "-c", SENDER, mon.address, job, str(n), secret])
             for job, secret in secrets_.items()]
    deadline = time.monotonic() + 60
    while mon.received < 3 * (n + 2) and time.monotonic() < deadline:
        mon.drain(timeout_ms=100)
    for p in procs:
        assert p.wait(timeout=30) == 0
    mon.drain(timeout_ms=100)
    counts = mon.counts()
    assert (counts["received"], counts["accepted"]) == (3 * (n + 2), 3 * n)
    assert (counts["not_json"], counts["bad_version"], counts["rejected"]) == (3, 3, 6)
    for k in range(3):
        st = mon.jobs[f"j{k}"]
        assert st.reports == n and st.seq_gaps == 0 and st.out_of_order == 0
        assert st.samples == 32 * (n // 2) + 64 * (n // 2)
        rates = st.rates()
        assert abs(rates[1] - 320.0) < 1e-6 and abs(rates[2] - 640.0) < 1e-6
        (ev,) = st.new_rescales()
        assert (ev.from_size, ev.to_size) == (1, 2) and abs(ev.pause_s - 0.5) < 1e-6
        assert st.new_rescales() == []
        assert st.world_size == 2 and st.generation == 1


def test_seq_gaps_and_out_of_order_are_counted_not_fatal(ctx: zmq.Context, mon: Monitor) -> None:
    key = secret_key(secret := new_secret())
    mon.register("j", secret)
    s = push(ctx, mon)
    for seq, ts in [(1, 10.0), (2, 11.0), (5, 12.0), (6, 11.5)]:
        s.send(Report("j", seq, 4, ts, 1, 0, "w").encode(key))
    drain_until(mon, 4)
    st = mon.jobs["j"]
    assert st.seq_gaps == 2 and st.out_of_order == 1 and st.samples == 16


# ---------------------------------------------------------------- authentication
def test_forged_report_for_another_job_is_refused(ctx: zmq.Context, mon: Monitor) -> None:
    """Issue E #2: a report naming someone else's running job must not touch it."""
    victim, mine = new_secret(), new_secret()
    mon.register("j000001", victim)
    mon.register("j000002", mine)  # the attacker's own job: they hold its secret
    now = time.time()
    forged = [
        # the frame from the issue, verbatim (v1, unsigned)
        b'{"v":1,"type":"report","job":"j000001","seq":1,'
        b'"payload":{"samples":1000000000,"timestamp":%f,"world_size":1}}' % now,
        Report("j000001", 1, 10**9, now, 1).encode(),  # v2 without a signature
        Report("j000001", 1, 10**9, now, 1).encode(secret_key(mine)),  # signed with the attacker's key
        Report("j000001", 1, 10**9, now, 1).encode(secret_key(new_secret())),  # a guessed key
    ]
    s = push(ctx, mon)
    for f in forged:
        s.send(f)
    drain_until(mon, len(forged))
    counts = mon.counts()
    assert (counts["bad_version"], counts["unsigned"], counts["bad_signature"]) == (1, 1, 2)
    assert counts["accepted"] == 0
    st = mon.jobs["j000001"]
    assert (st.samples, st.reports, st.world_size, st.new_rescales()) == (0, 0, 0, [])
    assert mon.jobs["j000002"].reports == 0


def test_replayed_reports_are_refused(ctx: zmq.Context, mon: Monitor) -> None:
    key = secret_key(secret := new_secret())
    mon.register("j", secret)
    frames = [Report("j", i, 64, 100.0 + i, 1, 0, "w0").encode(key) for i in range(1, 4)]
    s = push(ctx, mon)
    for f in frames + frames + [frames[0]]:  # every frame again, then the first a third time
        s.send(f)
    drain_until(mon, 7)
    assert mon.counts()["accepted"] == 3 and mon.counts()["replayed"] == 4
    assert mon.jobs["j"].samples == 3 * 64


def test_a_sender_is_the_worker_and_its_incarnation(mon: Monitor) -> None:
    """A worker restarted under its own name (a torchrun rank at every change of its world) numbers its
    reports from 1 again as a new incarnation: accepted; a replay within an incarnation is still refused."""
    key = secret_key(secret := new_secret())
    mon.register("j", secret)
    for incarnation in (0, 1, 2):
        mon.ingest(Report("j", 1, 64, 100.0 + incarnation, 1, 0, "w0", incarnation).encode(key))
    assert mon.counts()["accepted"] == 3 and mon.counts()["replayed"] == 0
    mon.ingest(Report("j", 1, 64, 103.0, 1, 0, "w0", 1).encode(key))  # incarnation 1's seq 1 again
    assert mon.counts()["replayed"] == 1
    assert set(mon.jobs["j"].window.last) == {("w0", 0), ("w0", 1), ("w0", 2)}


def _unsigned_without_incarnation(report: Report, key: bytes) -> bytes:
    """``report`` as a sender of the format before incarnations wrote it (no ``incarnation`` member)."""
    from contract.messages import encode

    payload = {"samples": report.samples, "timestamp": report.timestamp, "world_size": report.world_size,
               "generation": report.generation, "worker": report.worker}
    return encode(Report.TYPE, report.job, report.seq, payload, key)


def test_a_report_without_an_incarnation_is_incarnation_0(mon: Monitor) -> None:
    """The format before incarnations is taken, as incarnation 0 of its worker: its seq is that sender's."""
    key = secret_key(secret := new_secret())
    mon.register("j", secret)
    mon.ingest(_unsigned_without_incarnation(Report("j", 1, 64, 100.0, 1, 0, "w0"), key))
    mon.ingest(Report("j", 1, 64, 101.0, 1, 0, "w0", 0).encode(key))  # the same sender's seq 1: a replay
    mon.ingest(Report("j", 2, 64, 102.0, 1, 0, "w0", 0).encode(key))
    assert mon.counts()["accepted"] == 2 and mon.counts()["replayed"] == 1


def test_a_replay_window_saved_before_incarnations_is_read_as_incarnation_0(ctx: zmq.Context) -> None:
    key = secret_key(secret := new_secret())
    m = Monitor(ctx=ctx)
    try:
        m.register("j", secret, replay_state={"floor": -1.0, "last": {"w0": [3, 100.0]}})
        m.ingest(Report("j", 3, 64, 104.0, 1, 0, "w0", 0).encode(key))  # seq 3 of (w0, 0) was taken
        m.ingest(Report("j", 1, 64, 105.0, 1, 0, "w0", 1).encode(key))  # a new incarnation
        assert m.counts()["replayed"] == 1 and m.counts()["accepted"] == 1
        assert m.replay_state("j")["senders"] == [["w0", 0, 3, 100.0], ["w0", 1, 1, 105.0]]
    finally:
        m.close()


def test_a_retired_senders_old_frames_stay_replays(mon: Monitor) -> None:
    key = secret_key(secret := new_secret())
    mon.register("j", secret)
    old = Report("j", 5, 64, 10.0, 1, 0, "w-old").encode(key)
    mon.ingest(old)
    for k in range(MAX_WORKERS):  # newer workers push w-old out of the window
        mon.ingest(Report("j", 1, 64, 20.0 + k, 1, 0, f"w{k}").encode(key))
    assert len(mon.jobs["j"].window.last) == MAX_WORKERS
    mon.ingest(old)
    mon.ingest(Report("j", 6, 64, 9.0, 1, 0, "w-old").encode(key))  # even a "newer" seq, if old
    assert mon.counts()["replayed"] == 2
    mon.ingest(Report("j", 1, 64, 500.0, 1, 0, "w-new").encode(key))
    assert mon.counts()["accepted"] == MAX_WORKERS + 2


def test_replay_state_survives_a_monitor_restart(ctx: zmq.Context) -> None:
    key = secret_key(secret := new_secret())
    first = Monitor(ctx=ctx)
    first.register("j", secret)
    frames = [Report("j", i, 64, 100.0 + i, 1, 0, "w0").encode(key) for i in range(1, 4)]
    first.ingest_batch(frames)
    saved = first.replay_state("j")
    first.close()
    second = Monitor(ctx=ctx)
    try:
        second.register("j", secret, replay_state=saved)
        second.ingest_batch(frames)
        second.ingest(Report("j", 4, 64, 104.0, 1, 0, "w0").encode(key))
        assert second.counts()["replayed"] == 3 and second.jobs["j"].reports == 1
    finally:
        second.close()


def test_unregistered_jobs_get_no_state_and_forget_drops_it(mon: Monitor) -> None:
    key = secret_key(secret := new_secret())
    mon.ingest(Report("j", 1, 64, 1.0, 1).encode(key))
    assert mon.jobs == {} and mon.counts()["unknown_job"] == 1
    with pytest.raises(KeyError, match="not registered"):
        mon.job("j")
    mon.register("j", secret)
    mon.ingest(Report("j", 2, 64, 2.0, 1).encode(key))
    assert mon.job("j").reports == 1
    mon.forget("j")
    mon.ingest(Report("j", 3, 64, 3.0, 1).encode(key))
    assert mon.jobs == {} and mon.counts()["unknown_job"] == 2


def test_reports_in_flight_when_a_job_ended_are_dropped_quietly(mon: Monitor,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """A completion or a cancel: its workers' last reports arrive after the daemon forgot the job; they
    are counted as late, not as unknown_job, and no warning is logged."""
    key = secret_key(secret := new_secret())
    mon.register("j", secret)
    mon.forget("j", ended=True)
    with caplog.at_level(logging.WARNING, logger="malletrain.daemon.monitor"):
        mon.ingest(Report("j", 1, 64, 1.0, 1).encode(key))
    assert mon.counts()["unknown_job"] == 0 and mon.late == 1
    assert not [r for r in caplog.records if "rejected a frame" in r.getMessage()]


# ---------------------------------------------------------------- bad frames
def bad_payload_frames(job: str, key: bytes) -> list[tuple[bytes, Reason]]:
    """Issue E #3: each frame that used to kill the daemon, signed with the job's real key."""

    def signed(payload: str, seq: int) -> bytes:
        from contract.messages import sign

        prefix = f'{{"v":2,"type":"report","job":"{job}","seq":{seq},"payload":{payload}}}'.encode()[:-1]
        return prefix + b',"sig":"' + sign(prefix, key) + b'"}'

    good = '"timestamp":1000.0,"world_size":1,"worker":"w"'
    cases = [f'{{"samples":8,{good},"generation":{g}}}' for g in ('"abc"', "null", "[1]", "1e400")]
    cases += [
        f'{{"samples":1{"0" * 400},{good}}}',
        '{"samples":8,"timestamp":NaN,"world_size":1}',
        '{"samples":8,"timestamp":Infinity,"world_size":1}',
        '{"samples":-8,"timestamp":1000.0,"world_size":1}',
        '{"samples":8,"timestamp":-1000.0,"world_size":1}',
        '{"samples":8,"timestamp":1000.0,"world_size":-1}',
    ]
    return [(signed(p, i + 1), Reason.BAD_FIELD) for i, p in enumerate(cases)]


def test_every_bad_frame_is_counted_and_the_monitor_goes_on(
    ctx: zmq.Context, mon: Monitor, caplog: pytest.LogCaptureFixture
) -> None:
    key = secret_key(secret := new_secret())
    mon.register("j", secret)
    cases = bad_payload_frames("j", key) + [
        (b"[" * (MAX_FRAME - 10), Reason.NOT_JSON),  # deep nesting under the size limit
        (b"[" * 3000, Reason.OVERSIZE),  # above the decode limit, below the transport limit
        (b"\xff" * 10, Reason.NOT_JSON),
        (Report("j", 99, 8, 1.0, 1).encode(key).replace(b'"report"', b'"hello"'), Reason.BAD_TYPE),
    ]
    s = push(ctx, mon)
    with caplog.at_level(logging.WARNING, logger="malletrain.daemon.monitor"):
        for f, _ in cases:
            s.send(f)
        s.send(Report("j", 1000, 64, 2000.0, 1, 0, "w").encode(key))  # a good one after them all
        drain_until(mon, len(cases) + 1)
    counts = mon.counts()
    expected: dict[str, int] = {}
    for _, reason in cases:
        expected[reason.value] = expected.get(reason.value, 0) + 1
    assert {k: counts[k] for k in expected} == expected
    assert counts["accepted"] == 1 and counts["internal"] == 0
    st = mon.jobs["j"]
    assert (st.samples, st.generation, st.world_size) == (64, 0, 1)
    logged = [r.getMessage() for r in caplog.records]
    assert any("bad_field" in m for m in logged) and any("oversize" in m for m in logged)
    assert all(len(m) < 600 for m in logged)  # a 10^400 or a 2000-char frame is quoted short


def test_frames_over_the_transport_limit_cut_the_sender_off(ctx: zmq.Context, mon: Monitor) -> None:
    key = secret_key(secret := new_secret())
    mon.register("j", secret)
    attacker = push(ctx, mon)
    attacker.send(b"[" * 100_000)  # libzmq (MAXMSGSIZE) drops it and disconnects the sender
    honest = push(ctx, mon)
    honest.send(Report("j", 1, 64, 1.0, 1, 0, "w").encode(key))
    drain_until(mon, 1)
    mon.drain(timeout_ms=200)
    assert mon.counts()["accepted"] == 1 and mon.received == 1


def test_100k_reports_for_fake_ids_leave_state_bounded(mon: Monitor) -> None:
    """Issue E #3: 100k reports for fake job ids grew the daemon by ~220 MB for good."""
    key = secret_key(secret := new_secret())
    mon.register("j000001", secret)
    mon.ingest(Report("j000001", 1, 8, 1.0, 1).encode(key))  # warm every code path once

    def frames(start: int) -> list[bytes]:
        out = []
        for i in range(start, start + 10_000):
            rep = Report(f"fake{i:06d}", 1, 10**6, 1.0 + i, 1, 0, f"w{i}")
            out.append(rep.encode(key) if i % 2 else rep.encode())
        return out

    mon.ingest_batch(frames(0))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for start in range(10_000, 100_000, 10_000):
            mon.ingest_batch(frames(start))
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert list(mon.jobs) == ["j000001"] and mon.jobs["j000001"].reports == 1
    counts = mon.counts()
    assert counts["unknown_job"] == 50_000 and counts["unsigned"] == 50_000
    assert grown < 256 * 1024, f"memory grew by {grown} bytes"


def test_rejections_are_logged_at_most_once_per_reason_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    mon = Monitor(clock=lambda: now[0])
    try:
        with caplog.at_level(logging.WARNING, logger="malletrain.daemon.monitor"):
            mon.ingest_batch([b"garbage"] * 1000 + [b"[1]"] * 1000)
            now[0] = 10.0
            mon.ingest(b"garbage")
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 3
        assert "999 not logged" in lines[2]
    finally:
        mon.close()


# ---------------------------------------------------------------- daemon-side secrets
def test_master_key_file(tmp_path: Path) -> None:
    path = tmp_path / "monitor.key"
    key = load_master_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key) == 32
    assert load_master_key(path) == key
    a, b = job_secret(key, "j000001"), job_secret(key, "j000002")
    assert a != b and a == job_secret(key, "j000001") and len(secret_key(a)) == 32
    os.chmod(path, 0o644)
    with pytest.raises(KeyFileError, match="mode 0600"):
        load_master_key(path)
    os.chmod(path, 0o600)
    path.write_bytes(b"short")
    with pytest.raises(KeyFileError, match="5 bytes"):
        load_master_key(path)
    link = tmp_path / "link.key"
    link.symlink_to(path)
    with pytest.raises(KeyFileError, match="cannot open"):
        load_master_key(link)


# ---------------------------------------------------------------- the fast path changes no verdict
ids = st.text(min_size=0, max_size=8) | st.sampled_from(["j", "w0", "j000001.n1.5", 'q"x', "a\\b", "é", "\x07"])
numbers = (st.integers(min_value=0, max_value=70_000) | st.integers(min_value=-5, max_value=2**64)
           | st.sampled_from([0, 1, 65536, 65537, MAX_INT, MAX_INT + 1, 2**31 - 1, 2**31]))
times = (st.floats(min_value=0.0, max_value=2e11) | st.floats(allow_nan=False, allow_infinity=False)
         | st.integers(min_value=-5, max_value=10**13)
         | st.sampled_from([0.0, -0.0, 1e11, 1e11 + 1, 1234.5678901234567, 1e-300, 5e-324, 1e22]))
reports = st.builds(lambda *a: a, ids, numbers, numbers, times, numbers, numbers, ids, numbers)


VALID = [(("j", i, 64, 1000.0 + i, 2, 1, "w0", 0), "mine", 400, 0) for i in (1, 2, 2, 3)]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(VALID + [(("j", 4, 64, 1000, 2, 1, "w0", 0), "other", 10, 48), (("j", 5, 0, 0.0, 1, 0, "", 0), "mine", 20, 0),
                  (("j", 1, 64, 1001.0, 2, 1, "w0", 1), "mine", 400, 0)])
@given(st.lists(st.tuples(reports, st.sampled_from(["mine", "other", "none"]), st.integers(0, 300),
                          st.integers(0, 255)), max_size=12))
def test_the_fast_path_and_the_checked_path_agree(frames_spec: list) -> None:
    mine, other = secret_key(SECRETS[0]), secret_key(SECRETS[1])
    frames = []
    for (job, seq, samples, ts, world, gen, worker, incarnation), signer, pos, byte in frames_spec:
        job = job or "j"
        try:
            frame = Report(job, seq, samples, ts, world, gen, worker, incarnation).encode(
                {"mine": mine, "other": other, "none": None}[signer])
        except (ValueError, OverflowError):
            continue
        frames.append(frame)
        if pos < len(frame):  # and a tampered copy
            frames.append(frame[:pos] + bytes([byte]) + frame[pos + 1:])
    results = []
    for fast in (True, False):
        # the monitor's own clock decides what progress is plausible: both paths see the same one
        # (a real clock let the time between register and ingest flip an 'implausible' verdict)
        now = [0.0]
        mon = Monitor(bind=f"inproc://fast-vs-checked-{next(INPROC)}", ctx=CTX, clock=lambda: now[0])
        try:
            mon.fast_path = fast
            for job in {f[0][0] or "j" for f in frames_spec} | {"j"}:
                try:
                    mon.register(job, SECRETS[0])
                except ValueError:
                    pass
            now[0] = 1.0
            mon.ingest_batch(frames)
            results.append((mon.counts(), {j: (s.samples, s.reports, s.world_size, s.generation, s.seq_gaps,
                                                s.window.to_dict()) for j, s in mon.jobs.items()}))
        finally:
            mon.close()
    assert results[0] == results[1]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 50_000), st.integers(1, 16), st.sampled_from([0.0, 0.5, 1.0, 7.0])),
                min_size=1, max_size=40))
def test_the_fast_path_and_the_checked_path_agree_on_the_history_bound(claims: list) -> None:
    """After a measured history (1,000 samples/s per node), any stream of claims: the two paths take and
    refuse the same ones (the relative bound engaged, on the monitor's injected clock)."""
    key = secret_key(SECRETS[0])
    history = [(2_000, 2, 1.0)] * 70
    results = []
    for fast in (True, False):
        now = [0.0]
        mon = Monitor(bind=f"inproc://history-{next(INPROC)}", ctx=CTX, clock=lambda: now[0])
        try:
            mon.fast_path = fast
            mon.register("j", SECRETS[0], max_nodes=16)
            for seq, (samples, world, dt) in enumerate(history + claims, start=1):
                now[0] += dt
                mon.ingest(Report("j", seq, samples, 1000.0 + seq, world, 0, "w0").encode(key))
            st_j = mon.jobs["j"]
            results.append((mon.counts(), st_j.samples, st_j.reports, st_j.implausible, st_j.bound.best_per_node))
        finally:
            mon.close()
    assert results[0] == results[1]
    assert results[0][4] > 0  # the history was measured: the relative bound was on


def test_typical_frames_take_the_fast_path(mon: Monitor) -> None:
    key = secret_key(secret := new_secret())
    mon.register("j000001", secret)
    mon._accept_checked = None  # type: ignore[assignment]  # any frame sent there fails as INTERNAL
    mon.ingest_batch([Report("j000001", i, 64, 1000.0 + i, 2, 3, "j000001.n1.17").encode(key) for i in range(1, 50)]
                     + [Report("j000001", 50, 64, 1100, 2, 3, "").encode(key)])
    assert mon.counts()["accepted"] == 50 and mon.counts()["internal"] == 0


# ---------------------------------------------------------------- replay windows across restarts
class Meta(dict):
    def get_meta(self, key: str) -> str | None:
        return self.get(key)

    def set_meta(self, key: str, value: str) -> None:
        self[key] = value


def test_replay_windows_are_saved_periodically_and_restored_before_registering(ctx: zmq.Context) -> None:
    key = secret_key(secret := new_secret())
    meta = Meta()
    first = Monitor(ctx=ctx)
    saver = ReplaySaver(first, meta, every_s=5.0)
    assert saver.load() == 0
    first.register("j", secret)
    frames = [Report("j", i, 64, 100.0 + i, 1, 0, "w0").encode(key) for i in range(1, 4)]
    saver.tick(0.0)  # nothing accepted yet: the empty windows
    first.ingest_batch(frames)
    saver.tick(1.0)  # not due
    assert json.loads(meta[REPLAY_META_KEY]) == {"j": {"floor": -1.0, "senders": []}}
    saver.tick(5.0)  # due: what a kill -9 right now would leave
    first.close()
    second = Monitor(ctx=ctx)
    try:
        assert ReplaySaver(second, meta).load() == 1
        assert second.jobs == {}  # no state for a job until it is registered
        second.register("j", secret)
        second.ingest_batch(frames + [Report("j", 4, 64, 104.0, 1, 0, "w0").encode(key)])
        assert second.counts()["replayed"] == 3 and second.jobs["j"].reports == 1
        second.forget("j")
        assert second.replay_states() == {}
    finally:
        second.close()


def test_damaged_saved_windows_are_logged_not_fatal(ctx: zmq.Context, caplog: pytest.LogCaptureFixture) -> None:
    for text, why in (("{", "not valid"), ("[1]", "not valid"), ('{"j": {"floor": "x"}}', "job j")):
        mon = Monitor(ctx=ctx)
        try:
            with caplog.at_level(logging.ERROR, logger="malletrain.daemon.monitor"):
                assert ReplaySaver(mon, Meta({REPLAY_META_KEY: text})).load() == 0
            assert why in caplog.records[-1].getMessage()
            mon.register("j", new_secret())
        finally:
            mon.close()


@pytest.mark.slow
def test_a_report_captured_before_a_daemon_restart_is_a_replay_after_it(tmp_path: Path) -> None:
    from malletrain.daemon.config import DaemonConfig, LocalConfig
    from malletrain.daemon import Daemon
    from malletrain.daemon.jobspec import JobSpec

    cfg = DaemonConfig(state_dir=str(tmp_path / "state"), runtime="toy", local=LocalConfig(nodes=1, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=2.0, loop_interval=0.05)
    toy = (sys.executable, "-m", "malletrain.worker.toy", "--rate", "100")

    def send_until(d: Daemon, frames: list[bytes], done: Callable[[], bool]) -> None:
        s = d.ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(d.monitor.address)
        for f in frames:
            s.send(f)
        deadline = time.monotonic() + 20
        while not done() and time.monotonic() < deadline:
            d.step()
            d.monitor.drain(timeout_ms=50)
        s.close(0)
        assert done(), d.monitor.counts()

    def last_seq(d: Daemon) -> int:
        return d.monitor.jobs[jid].window.last.get(("captured", 0), (0, 0.0))[0]

    d = Daemon(cfg)
    try:
        jid = d.store.submit(JobSpec("toy", toy, 1, 1, False, {1: 10.0}))
        d.step()
        key = secret_key(d.wiring.job_secret(jid))
        t = time.time()
        captured = [Report(jid, i, 1, t + i * 1e-3, 1, 0, "captured").encode(key) for i in range(1, 4)]
        send_until(d, captured, lambda: last_seq(d) == 3)
    finally:
        d.close()
    d = Daemon(cfg)
    try:
        assert last_seq(d) == 3  # restored from the store before any frame arrived
        send_until(d, captured, lambda: d.monitor.counts()["replayed"] == 3)
        send_until(d, [Report(jid, 4, 1, t + 1, 1, 0, "captured").encode(key)], lambda: last_seq(d) == 4)
    finally:
        d.close()


def test_a_leaving_workers_reports_without_a_generation_are_not_the_new_worlds_rate() -> None:
    """Two workers that report no generation, 100 samples a step each, every 0.1 s; the daemon shrinks the job
    to the first one, and the second one's reports in flight (it still runs until it is stopped) are not
    counted at the new world's size: the one-node rate is the staying worker's. Before, both were, and a
    job's downward probe measured it as fast on one node as on two (the policy then gave its node away)."""
    stats = JobStats("j")
    stats.record_world(1, 2, ["j.a.1", "j.b.2"])
    t = 1000.0
    for step in range(20):
        for offset, worker in ((0.0, "j.a.1"), (0.05, "j.b.2")):
            stats.add_fields(worker, step + 1, 100, t + step * 0.1 + offset, 1, 0)
    stats.record_world(2, 1, ["j.a.1"])
    t += 2.0
    for step in range(20):
        for offset, worker in ((0.0, "j.a.1"), (0.05, "j.b.2")):
            stats.add_fields(worker, 21 + step, 100, t + step * 0.1 + offset, 1, 0)
    rates = stats.rates()
    assert rates[2] == pytest.approx(2000, rel=0.1)
    assert rates[1] == pytest.approx(1000, rel=0.1)
    assert stats.samples == 80 * 100  # what the leaving worker trained is still the job's progress
    # a rank of a member (WORKER/i) is the member's
    assert stats.is_member("j.a.1/1") and not stats.is_member("j.b.2/0")
