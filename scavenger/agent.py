"""The node agent: one per held node, inside the pilot job (or a local process).

    python -m scavenger.agent --node NAME --daemon tcp://HOST:PORT

It connects to the daemon (ZeroMQ DEALER, identity = node name), says hello,
heartbeats, and starts/stops job workers on command. Each worker runs in its
own process group so the agent can kill it with everything it spawned. On
SIGTERM (the main scheduler recalls the node) it kills its workers, reports
``leaving`` and exits. If the daemon stops pinging for ``--dead-after``
seconds it does the same, so nothing survives a lost daemon for long.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Sequence

import zmq

from scavenger import protocol as P


@dataclass
class _Worker:
    name: str
    proc: subprocess.Popen[bytes]
    log: IO[bytes] | None
    kill_at: float | None = None  # SIGKILL deadline after a stop


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Agent:
    """The agent's state and loop (run in its own process by :func:`main`)."""

    def __init__(
        self,
        node: str,
        daemon: str,
        heartbeat_s: float = 0.5,
        dead_after_s: float = 10.0,
        log_dir: str | None = None,
    ) -> None:
        self.node = node
        self.heartbeat_s = heartbeat_s
        self.dead_after_s = dead_after_s
        self.log_dir = Path(log_dir) if log_dir else None
        self.workers: dict[str, _Worker] = {}
        self.leave_reason: str | None = None
        self.seq = 0
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, node.encode())
        self.sock.setsockopt(zmq.LINGER, 500)
        self.sock.connect(daemon)

    # -- wire
    def send(self, msg: P.AgentMessage) -> None:
        self.seq += 1
        try:
            self.sock.send(P.encode(msg, self.seq), zmq.NOBLOCK)
        except zmq.Again:
            pass  # daemon not reachable now; heartbeats will resume

    # -- workers
    def start_worker(self, msg: P.StartWorker) -> None:
        if msg.worker in self.workers:
            return  # idempotent
        if not msg.argv:
            self.send(P.WorkerExited(self.node, msg.worker, 127))
            return
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (msg.env or {}).items()})
        log: IO[bytes] | None = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log = open(self.log_dir / f"{msg.worker}.log", "ab")
        try:
            proc = subprocess.Popen(
                list(msg.argv),
                env=env,
                cwd=msg.cwd or None,
                stdin=subprocess.DEVNULL,
                stdout=log if log else subprocess.DEVNULL,
                stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            if log:
                log.write(f"agent {self.node}: cannot start {msg.argv!r}: {exc}\n".encode())
                log.close()
            self.send(P.WorkerExited(self.node, msg.worker, 127))
            return
        self.workers[msg.worker] = _Worker(msg.worker, proc, log)
        self.send(P.WorkerStarted(self.node, msg.worker, proc.pid))

    def stop_worker(self, name: str, grace: float) -> None:
        w = self.workers.get(name)
        if w is None or w.kill_at is not None:
            return  # idempotent
        _signal_group(w.proc, signal.SIGTERM)
        w.kill_at = time.monotonic() + max(0.0, float(grace))

    def reap(self) -> None:
        now = time.monotonic()
        for name, w in list(self.workers.items()):
            code = w.proc.poll()
            if code is None:
                if w.kill_at is not None and now >= w.kill_at:
                    _signal_group(w.proc, signal.SIGKILL)
                continue
            _signal_group(w.proc, signal.SIGKILL)  # leftovers of its group
            if w.log:
                w.log.close()
            del self.workers[name]
            self.send(P.WorkerExited(self.node, name, int(code)))

    def kill_all(self, grace: float = 1.0) -> None:
        for w in self.workers.values():
            _signal_group(w.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(w.proc.poll() is None for w in self.workers.values()):
            time.sleep(0.02)
        for w in self.workers.values():
            _signal_group(w.proc, signal.SIGKILL)
            try:
                w.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
        self.reap()

    # -- loop
    def handle(self, frame: bytes) -> None:
        try:
            msg = P.decode(frame)
        except P.ProtocolError as exc:
            print(f"agent {self.node}: dropped bad frame: {exc}", file=sys.stderr)
            return
        if isinstance(msg, P.StartWorker):
            self.start_worker(msg)
        elif isinstance(msg, P.StopWorker):
            self.stop_worker(msg.worker, msg.grace)
        elif isinstance(msg, P.Shutdown):
            self.leave_reason = "released"

    def run(self) -> int:
        self.send(P.Hello(self.node, os.getpid(), ()))
        last_daemon = time.monotonic()
        next_hb = 0.0
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        code = 0
        try:
            while self.leave_reason is None:
                events = dict(poller.poll(50))
                if self.sock in events:
                    while True:
                        try:
                            frame = self.sock.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        last_daemon = time.monotonic()
                        self.handle(frame)
                self.reap()
                now = time.monotonic()
                if now >= next_hb:
                    self.send(P.Heartbeat(self.node, tuple(self.workers), os.getpid()))
                    next_hb = now + self.heartbeat_s
                if now - last_daemon > self.dead_after_s:
                    self.leave_reason = "daemon_lost"
                    code = 3
        finally:
            self.kill_all()
            self.send(P.Leaving(self.node, self.leave_reason or "error"))
            self.sock.close()
            self.ctx.term()
        return code


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scavenger.agent", description=__doc__.splitlines()[0])
    ap.add_argument("--node", required=True)
    ap.add_argument("--daemon", required=True, help="the daemon's agent address, tcp://HOST:PORT")
    ap.add_argument("--heartbeat", type=float, default=0.5, help="seconds between heartbeats")
    ap.add_argument("--dead-after", type=float, default=10.0, help="exit if the daemon is silent this long")
    ap.add_argument("--log-dir", default=None, help="write each worker's output to DIR/WORKER.log")
    args = ap.parse_args(argv)
    agent = Agent(args.node, args.daemon, args.heartbeat, args.dead_after, args.log_dir)

    def on_term(signum: int, frame: object) -> None:
        agent.leave_reason = "recalled"

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
