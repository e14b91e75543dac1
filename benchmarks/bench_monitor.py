"""Job-monitor ingest rate: N sender processes push M reports each; zero loss required.

    python benchmarks/bench_monitor.py [--senders 4] [--reports 50000]

Every report is signed with its job's secret (HMAC-SHA256, as ``report()`` sends
it) and every job is registered with the monitor. Prints reports/s ingested
(decode, validation, signature and replay checks, profiler estimators, from the
first to the last frame) and the number lost (sent - accepted, must be 0).
Baseline in the same run: a bare loop that only receives the frames.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time

import zmq

from malletrain.messages import Report, new_secret, secret_key
from malletrain.monitor import Monitor


def sender(address: str, job: str, secret: str, n: int, start: mp.Event) -> None:  # type: ignore[valid-type]
    key = secret_key(secret)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 10_000)
    sock.connect(address)
    frames = [
        Report(job, i + 1, 64, 1000.0 + i * 0.01, 1 + (i // 5000) % 4, 0, "w0").encode(key) for i in range(n)
    ]
    start.wait()
    for f in frames:
        sock.send(f)  # blocking send: back-pressure, never a drop
    sock.close(linger=-1)
    ctx.term()


def run(senders: int, reports: int, bare: bool) -> tuple[float, int, int]:
    ctx = zmq.Context()
    mon = Monitor(ctx=ctx)
    start = mp.Event()
    jobs = {f"j{k:06d}": new_secret() for k in range(senders)}
    for job, secret in jobs.items():
        mon.register(job, secret)
    procs = [mp.Process(target=sender, args=(mon.address, job, secret, reports, start)) for job, secret in jobs.items()]
    for p in procs:
        p.start()
    time.sleep(0.5)
    start.set()
    total = senders * reports
    got = 0
    t0 = None
    deadline = time.monotonic() + 120
    while got < total and time.monotonic() < deadline:
        if bare:
            if not mon.sock.poll(200):
                continue
            t0 = t0 or time.perf_counter()
            try:
                while True:
                    mon.sock.recv(zmq.NOBLOCK)
                    got += 1
            except zmq.Again:
                pass
        else:
            if t0 is None:
                if not mon.sock.poll(200):
                    continue
                t0 = time.perf_counter()  # the first frame is here: the clock starts before ingesting it
            mon.drain(timeout_ms=200)
            got = mon.accepted
            if mon.bad:
                break
    t1 = time.perf_counter()
    for p in procs:
        p.join(30)
    lost = total - got
    if not bare:
        assert mon.bad == 0, f"rejected: {mon.counts()}"
        assert mon.received == got and sum(s.reports for s in mon.jobs.values()) == got
    mon.close()
    ctx.term()
    return got / (t1 - (t0 or t1) or 1e-9), lost, got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--reports", type=int, default=50_000, help="reports per sender")
    args = ap.parse_args()
    base_rate, base_lost, _ = run(args.senders, args.reports, bare=True)
    rate, lost, _ = run(args.senders, args.reports, bare=False)
    print(f"senders={args.senders} reports/sender={args.reports} total={args.senders * args.reports}")
    print(f"baseline (receive only):  {base_rate:,.0f} frames/s, lost {base_lost}")
    print(f"monitor (verify+decode+profile): {rate:,.0f} reports/s ingested, lost {lost} "
          f"({rate / base_rate:.2f}x of receive-only)")
    ok = lost == 0 and rate >= 50_000
    print("target >= 50,000 authenticated reports/s with zero loss:", "MET" if ok else "NOT MET")
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
