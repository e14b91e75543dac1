"""The node agent: one per held node, inside the pilot job (or a local process).

    python -m scavenger.agent --node NAME --daemon tcp://HOST:PORT

It connects to the daemon (ZeroMQ DEALER, identity = node name), says hello,
heartbeats, and starts/stops job workers on command. Each worker runs in its
own process group so the agent can kill it with everything it spawned. On
SIGTERM (the main scheduler recalls the node) it kills its workers, reports
``leaving`` and exits. If the daemon stops pinging for ``--dead-after``
seconds it does the same, so nothing survives a lost daemon for long.

The agent logs (to stderr, which the backend sends to ``agent-NODE.log``) its
start and daemon, each worker's start, stop and exit code, a recall, and why it
exits. Each worker's stdout and stderr go to ``--log-dir``/``WORKER.log``.
"""

from __future__ import annotations

import argparse
import logging
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

log = logging.getLogger("scavenger.agent")

LOG_FORMAT = "%(asctime)s %(levelname)s agent pid %(process)d: %(message)s"


@dataclass
class _Worker:
    name: str
    proc: subprocess.Popen[bytes]
    log: IO[bytes] | None
    kill_at: float | None = None  # SIGKILL deadline after a stop


def _describe_exit(code: int) -> str:
    """``code 0`` / ``code 3`` / ``signal SIGKILL (-9)``: a worker's exit for a log line."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name} ({code})"
        except ValueError:
            return f"signal {-code} ({code})"
    return f"code {code}"


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
        self.daemon = daemon
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
            log.error("node %s: worker %s has an empty argv; reported as exit 127", self.node, msg.worker)
            self.send(P.WorkerExited(self.node, msg.worker, 127))
            return
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (msg.env or {}).items()})
        out: IO[bytes] | None = None
        log_path = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.log_dir / f"{msg.worker}.log"
            out = open(log_path, "ab")
        try:
            proc = subprocess.Popen(
                list(msg.argv),
                env=env,
                cwd=msg.cwd or None,
                stdin=subprocess.DEVNULL,
                stdout=out if out else subprocess.DEVNULL,
                stderr=subprocess.STDOUT if out else subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            log.error("node %s: cannot start worker %s (%r): %s; reported as exit 127",
                      self.node, msg.worker, list(msg.argv), exc)
            if out:
                out.write(f"agent {self.node}: cannot start {msg.argv!r}: {exc}\n".encode())
                out.close()
            self.send(P.WorkerExited(self.node, msg.worker, 127))
            return
        self.workers[msg.worker] = _Worker(msg.worker, proc, out)
        log.info("node %s: worker %s started, pid %d: %s (output: %s)", self.node, msg.worker, proc.pid,
                 " ".join(msg.argv), log_path or "discarded")
        self.send(P.WorkerStarted(self.node, msg.worker, proc.pid))

    def stop_worker(self, name: str, grace: float) -> None:
        w = self.workers.get(name)
        if w is None or w.kill_at is not None:
            return  # idempotent
        log.info("node %s: stopping worker %s (pid %d): SIGTERM, SIGKILL after %.1f s", self.node, name,
                 w.proc.pid, float(grace))
        _signal_group(w.proc, signal.SIGTERM)
        w.kill_at = time.monotonic() + max(0.0, float(grace))

    def reap(self) -> None:
        now = time.monotonic()
        for name, w in list(self.workers.items()):
            code = w.proc.poll()
            if code is None:
                if w.kill_at is not None and now >= w.kill_at:
                    log.warning("node %s: worker %s (pid %d) still running after its grace: SIGKILL",
                                self.node, name, w.proc.pid)
                    _signal_group(w.proc, signal.SIGKILL)
                    w.kill_at = float("inf")  # killed once
                continue
            _signal_group(w.proc, signal.SIGKILL)  # leftovers of its group
            if w.log:
                w.log.close()
            del self.workers[name]
            log.info("node %s: worker %s (pid %d) exited with %s", self.node, name, w.proc.pid, _describe_exit(code))
            self.send(P.WorkerExited(self.node, name, int(code)))

    def kill_all(self, grace: float = 1.0) -> None:
        if self.workers:
            log.info("node %s: stopping all workers (%s): SIGTERM, SIGKILL after %.1f s", self.node,
                     ", ".join(sorted(self.workers)), grace)
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
            log.warning("node %s: dropped a bad frame from the daemon: %s", self.node, exc)
            return
        if isinstance(msg, P.StartWorker):
            self.start_worker(msg)
        elif isinstance(msg, P.StopWorker):
            self.stop_worker(msg.worker, msg.grace)
        elif isinstance(msg, P.Shutdown):
            log.info("node %s: the daemon releases the node", self.node)
            self.leave_reason = "released"

    def run(self) -> int:
        log.info("node %s: agent start, pid %d, daemon %s (heartbeat %.1f s, gives up after %.1f s of silence)",
                 self.node, os.getpid(), self.daemon, self.heartbeat_s, self.dead_after_s)
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
                    log.warning("node %s: no word from the daemon for %.1f s", self.node, now - last_daemon)
                    self.leave_reason = "daemon_lost"
                    code = 3
        except BaseException as exc:
            log.exception("node %s: agent loop failed: %s", self.node, exc)
            raise
        finally:
            self.kill_all()
            self.send(P.Leaving(self.node, self.leave_reason or "error"))
            self.sock.close()
            self.ctx.term()
            log.info("node %s: agent exit %d, reason: %s", self.node, code, self.leave_reason or "error")
        return code


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scavenger.agent", description=__doc__.splitlines()[0])
    ap.add_argument("--node", required=True)
    ap.add_argument("--daemon", required=True, help="the daemon's agent address, tcp://HOST:PORT")
    ap.add_argument("--heartbeat", type=float, default=0.5, help="seconds between heartbeats")
    ap.add_argument("--dead-after", type=float, default=10.0, help="exit if the daemon is silent this long")
    ap.add_argument("--log-dir", default=None, help="write each worker's output to DIR/WORKER.log")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    agent = Agent(args.node, args.daemon, args.heartbeat, args.dead_after, args.log_dir)

    def on_term(signum: int, frame: object) -> None:
        if agent.leave_reason is None:
            log.info("node %s: %s: the node is recalled", agent.node, signal.Signals(signum).name)
        agent.leave_reason = "recalled"

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
