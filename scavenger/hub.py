"""The daemon's side of the node agents: one ZeroMQ ROUTER every agent connects to.

:meth:`AgentHub.poll` turns agent frames into events (agent up/gone, worker
started/exited), pings agents so they know the daemon lives, and declares an
agent gone when its heartbeats stop for ``dead_after_s`` seconds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Union

import zmq

from scavenger import protocol as P
from scavenger.base import AgentGone, AgentUp

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerStartedEvent:
    node: str
    worker: str
    pid: int


@dataclass(frozen=True)
class WorkerExitedEvent:
    node: str
    worker: str
    code: int


@dataclass(frozen=True)
class AgentWorkers:
    """An agent (new or reconnected) reports the workers it runs: for re-adoption."""

    node: str
    pid: int
    workers: tuple[str, ...]


HubEvent = Union[AgentUp, AgentGone, WorkerStartedEvent, WorkerExitedEvent, AgentWorkers]


@dataclass
class _AgentInfo:
    pid: int = 0
    last_seen: float = 0.0
    workers: set[str] = field(default_factory=set)


class AgentHub:
    """ROUTER socket for the node agents; ``address`` is what agents connect to."""

    def __init__(
        self,
        bind: str = "tcp://127.0.0.1:0",
        dead_after_s: float = 5.0,
        ping_s: float = 0.5,
        ctx: zmq.Context | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock  # the daemon injects its own clock (silence is measured on it)
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.bind(bind)
        self.address: str = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.dead_after_s = dead_after_s
        self.ping_s = ping_s
        self.agents: dict[str, _AgentInfo] = {}
        self.bad_frames = 0
        self._next_ping = 0.0
        self._seq = 0

    def alive(self) -> set[str]:
        return set(self.agents)

    def pid(self, node: str) -> int:
        info = self.agents.get(node)
        return info.pid if info else 0

    def workers(self, node: str) -> set[str]:
        info = self.agents.get(node)
        return set(info.workers) if info else set()

    def send(self, msg: P.AgentMessage) -> bool:
        """Send to ``msg.node``'s agent; False if it is not connected."""
        self._seq += 1
        try:
            self.sock.send_multipart([msg.node.encode(), P.encode(msg, self._seq)], zmq.NOBLOCK)
            return True
        except (zmq.Again, zmq.ZMQError) as exc:
            log.debug("agent %s unreachable: %s", msg.node, exc)
            return False

    def start_worker(self, node: str, worker: str, argv: tuple[str, ...], env: dict[str, str], cwd: str | None) -> bool:
        return self.send(P.StartWorker(node, worker, tuple(argv), dict(env), cwd))

    def stop_worker(self, node: str, worker: str, grace: float = 2.0) -> bool:
        return self.send(P.StopWorker(node, worker, grace))

    def poll(self, timeout_ms: int = 0) -> list[HubEvent]:
        out: list[HubEvent] = []
        if timeout_ms > 0:
            self.sock.poll(timeout_ms)
        now = self.clock()
        while True:
            try:
                ident, frame = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except ValueError:
                self.bad_frames += 1
                continue
            try:
                msg = P.decode(frame)
            except P.ProtocolError as exc:
                self.bad_frames += 1
                log.warning("agent frame dropped: %s", exc)
                continue
            if msg.node != ident.decode(errors="replace"):
                self.bad_frames += 1
                log.warning("agent %r sent a message as %r; dropped", ident, msg.node)
                continue
            out.extend(self._handle(msg, now))
        for node, info in list(self.agents.items()):
            if now - info.last_seen > self.dead_after_s:
                del self.agents[node]
                out.append(AgentGone(node, f"no heartbeat for {self.dead_after_s:g} s"))
        if now >= self._next_ping:
            for node in self.agents:
                self.send(P.Ping(node))
            self._next_ping = now + self.ping_s
        return out

    def _handle(self, msg: P.AgentMessage, now: float) -> list[HubEvent]:
        node = msg.node
        if isinstance(msg, P.Leaving):
            if self.agents.pop(node, None) is not None:
                return [AgentGone(node, msg.reason)]
            return []
        out: list[HubEvent] = []
        info = self.agents.get(node)
        if info is None:
            info = self.agents[node] = _AgentInfo()
            out.append(AgentUp(node))
            if isinstance(msg, P.Heartbeat):
                info.pid = int(msg.pid)
                out.append(AgentWorkers(node, info.pid, tuple(msg.workers)))
        info.last_seen = now
        if isinstance(msg, P.Hello):
            info.pid = int(msg.pid)
            info.workers = set(msg.workers)
            out.append(AgentWorkers(node, info.pid, tuple(msg.workers)))
        elif isinstance(msg, P.Heartbeat):
            info.workers = set(msg.workers)
        elif isinstance(msg, P.WorkerStarted):
            info.workers.add(msg.worker)
            out.append(WorkerStartedEvent(node, msg.worker, int(msg.pid)))
        elif isinstance(msg, P.WorkerExited):
            info.workers.discard(msg.worker)
            out.append(WorkerExitedEvent(node, msg.worker, int(msg.code)))
        return out

    def close(self) -> None:
        self.sock.close(0)
