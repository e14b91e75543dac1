"""Job-monitor ingest rate: N sender processes push M reports each; zero loss required.

    python benchmarks/bench_monitor.py [--senders 4] [--reports 50000] [--load 4]

Every report is signed with its job's secret (HMAC-SHA256, as ``report()`` sends
it) and every job is registered with the monitor. For each condition (quiet and,
with ``--load K``, under K busy processes this script starts and stops itself) it
measures, from the first to the last frame, in the same run (wall rate, and the
CPU time of the monitor's process per frame, which other load does not inflate):

* receive only: a bare loop that reads the frames and does nothing else;
* unauthenticated: the monitor's whole ingest (decode, validation, replay check,
  profiler estimators) with the signature check skipped;
* authenticated: the monitor as the daemon runs it.

and prints reports/s, the number lost (sent - accepted, must be 0) and the ratios
authenticated / unauthenticated and authenticated / receive-only. The goal (issue
8): >= 50,000 authenticated reports/s with zero loss, under load when ``--load``
is given.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from dataclasses import dataclass
from typing import Any

import zmq

from contract.messages import Report, new_secret, secret_key
from malletrain.daemon.monitor import Monitor

GOAL = 50_000


class UnauthenticatedMonitor(Monitor):
    """The monitor with its signature check skipped: the baseline that shows what HMAC costs."""

    @staticmethod
    def _signed_by(mac: Any, prefix: bytes, sig: bytes) -> bool:
        return True


def sender(address: str, job: str, secret: str, n: int, start: Any) -> None:
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


def busy(stop: Any) -> None:
    """One CPU's worth of load until ``stop`` is set."""
    while not stop.is_set():
        for _ in range(200_000):
            pass


@dataclass
class Figure:
    rate: float
    lost: int
    cpu_us: float  # CPU time of this process (the monitor and its ZeroMQ I/O thread) per frame


def run(senders: int, reports: int, mode: str) -> Figure:
    """``mode``: receive | unauthenticated | authenticated."""
    ctx = zmq.Context()
    mon = (UnauthenticatedMonitor if mode == "unauthenticated" else Monitor)(ctx=ctx)
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
    c0 = 0.0
    deadline = time.monotonic() + 300
    while got < total and time.monotonic() < deadline:
        if mode == "receive":
            if not mon.sock.poll(200):
                continue
            if t0 is None:
                t0, c0 = time.perf_counter(), time.process_time()
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
                t0, c0 = time.perf_counter(), time.process_time()  # the first frame is here: clocks start
            mon.drain(timeout_ms=200)
            got = mon.accepted
            if mon.bad:
                break
    t1, c1 = time.perf_counter(), time.process_time()
    for p in procs:
        p.join(30)
    if mode != "receive":
        assert mon.bad == 0, f"rejected: {mon.counts()}"
        assert mon.received == got and sum(s.reports for s in mon.jobs.values()) == got
    mon.close()
    ctx.term()
    return Figure(got / (t1 - (t0 or t1) or 1e-9), total - got, (c1 - c0) / max(got, 1) * 1e6)


def measure(senders: int, reports: int) -> dict[str, Figure]:
    return {mode: run(senders, reports, mode) for mode in ("receive", "unauthenticated", "authenticated")}


def report(label: str, figs: dict[str, Figure]) -> None:
    auth, unauth, recv = figs["authenticated"], figs["unauthenticated"], figs["receive"]
    print(f"{label}:")
    print(f"  receive only:     {recv.rate:>9,.0f} frames/s,  {recv.cpu_us:5.2f} us CPU/frame,  lost {recv.lost}")
    print(f"  unauthenticated:  {unauth.rate:>9,.0f} reports/s, {unauth.cpu_us:5.2f} us CPU/report, lost {unauth.lost}")
    print(f"  authenticated:    {auth.rate:>9,.0f} reports/s, {auth.cpu_us:5.2f} us CPU/report, lost {auth.lost}  "
          f"({auth.rate / unauth.rate:.2f}x of unauthenticated, {auth.rate / recv.rate:.2f}x of receive-only)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--reports", type=int, default=50_000, help="reports per sender")
    ap.add_argument("--load", type=int, default=0, help="also measure under this many busy processes (default 0)")
    args = ap.parse_args()
    print(f"senders={args.senders} reports/sender={args.reports} total={args.senders * args.reports} "
          f"cpus={mp.cpu_count()}")
    results = {"quiet": measure(args.senders, args.reports)}
    report("quiet", results["quiet"])
    if args.load > 0:
        stop = mp.Event()
        load = [mp.Process(target=busy, args=(stop,), daemon=True) for _ in range(args.load)]
        for p in load:
            p.start()
        try:
            results[f"load {args.load}"] = measure(args.senders, args.reports)
        finally:
            stop.set()
            for p in load:
                p.join(10)
                if p.is_alive():
                    p.terminate()
                    p.join(5)
        report(f"under load {args.load} ({args.load} busy processes)", results[f"load {args.load}"])
        q, ld = results["quiet"]["authenticated"].rate, results[f"load {args.load}"]["authenticated"].rate
        print(f"authenticated under load / quiet: {ld / q:.2f}x")
    lost = sum(f.lost for figs in results.values() for f in figs.values() if f is not figs["receive"])
    worst = min(figs["authenticated"].rate for figs in results.values())
    ok = lost == 0 and worst >= GOAL
    print(f"target >= {GOAL:,} authenticated reports/s with zero loss (worst condition {worst:,.0f}/s, "
          f"lost {lost}):", "MET" if ok else "NOT MET")
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
