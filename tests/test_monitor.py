"""Job monitor: real sender processes, zero loss, bad frames counted, estimators fed."""

from __future__ import annotations

import subprocess
import sys
import time

import zmq

from malletrain.messages import MessageError, Report, decode, decode_batch
from malletrain.monitor import Monitor

SENDER = """
import sys, zmq
from malletrain.messages import Report
addr, job, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = zmq.Context(); s = ctx.socket(zmq.PUSH); s.connect(addr)
for i in range(n):
    ws = 1 if i < n // 2 else 2
    t = 1000.0 + i * 0.1 + (0.5 if i >= n // 2 else 0.0)
    s.send(Report(job, i + 1, 32 * ws, t, ws, ws - 1, "w0").encode())
s.send(b"garbage")
s.send(b'{"v":2,"type":"report","job":"x","seq":1,"payload":{}}')
s.close(linger=-1); ctx.term()
"""


def test_real_senders_zero_loss_and_bad_frames_counted() -> None:
    mon = Monitor()
    try:
        n = 2000
        procs = [
            subprocess.Popen([sys.executable, "-c", SENDER, mon.address, f"j{k}", str(n)]) for k in range(3)
        ]
        deadline = time.monotonic() + 30
        while mon.received < 3 * (n + 2) and time.monotonic() < deadline:
            mon.drain(timeout_ms=100)
        for p in procs:
            assert p.wait(timeout=30) == 0
        mon.drain(timeout_ms=100)
        assert mon.received == 3 * (n + 2)
        assert mon.bad == 6
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
    finally:
        mon.close()


def test_decode_batch_matches_decode_frame_by_frame() -> None:
    good = Report("j1", 1, 8, 1.0, 1).encode()
    frames = [good, b"[1", b"2]", good, b"5,6", b"\xff"]
    out = decode_batch(frames)
    assert out[0] == decode(good) and out[3] == decode(good)
    assert all(isinstance(e, MessageError) for i, e in enumerate(out) if i not in (0, 3))
    assert decode_batch([good, good]) == [decode(good)] * 2


def test_seq_gaps_and_out_of_order_are_counted_not_fatal() -> None:
    ctx = zmq.Context()
    mon = Monitor(ctx=ctx)
    push = ctx.socket(zmq.PUSH)
    push.connect(mon.address)
    try:
        for seq, ts in [(1, 10.0), (2, 11.0), (5, 12.0), (6, 11.5)]:
            push.send(Report("j", seq, 4, ts, 1, 0, "w").encode())
        deadline = time.monotonic() + 10
        while mon.received < 4 and time.monotonic() < deadline:
            mon.drain(timeout_ms=50)
        st = mon.jobs["j"]
        assert st.seq_gaps == 2 and st.out_of_order == 1 and st.samples == 16
    finally:
        push.close(0)
        mon.close()
        ctx.term()
