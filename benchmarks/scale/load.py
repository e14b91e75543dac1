"""Simulated node agents and their workers, many per process, speaking the real protocols.

    python benchmarks/scale/load.py SETTINGS.json

One process runs every agent the harness sends it (``start NODE PILOT``), each a
ZeroMQ DEALER named after its node that does what :class:`scavenger.agent.Agent` does
on the wire: the authenticated handshake of :mod:`scavenger.channel` with the
daemon's agent key, ``hello`` (with its pilot's batch job id), heartbeats every
``heartbeat`` seconds, ``worker_started``/``worker_exited`` for the daemon's
``start_worker``/``stop_worker``, and ``leaving`` when it is recalled (``stop NODE``).

A started worker is simulated in the same process, as the toy runtime's worker
behaves: it marks itself ready in the runtime's directory, reads the job's published
member list (``DIR/<job>.json``) and, while it is a member, sends one signed
:class:`contract.messages.Report` per step (``rate`` steps a second) to the job
monitor, signed with the job secret the daemon gave it (``MALLETRAIN_JOB_SECRET``).
``reporters = "rank0"``: only each job's first member reports (the toy and torch
runtimes); ``"all"``: every member does.

Reports go out on one PUSH socket per process (``zmq.NOBLOCK``: a report the socket
refuses is counted as lost, never waited for). At ``exit`` the process writes its
counts (sent, refused, recall times) to ``out`` as JSON.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from contract.messages import Report, secret_key
from contract.workerenv import ENV_JOB, ENV_JOB_SECRET, ENV_TOY_DIR, ENV_WORKER
from scavenger import channel as C
from scavenger import protocol as P


@dataclass
class SimWorker:
    job: str
    id: str
    key: bytes
    seq: int = 0
    next_step: float = 0.0


@dataclass
class SimAgent:
    node: str
    pilot: str
    sock: Any
    session: C.Session | None = None
    nonce_a: bytes | None = None
    nonce_h: bytes | None = None
    next_auth: float = 0.0
    tries: int = 0
    next_hb: float = 0.0
    seq: int = 0
    workers: dict[str, SimWorker] = field(default_factory=dict)


@dataclass
class JobMembers:
    """A job's published member list as the toy runtime's workers read it."""

    path: Path
    mtime: float = -1.0
    gen: int = 0
    members: tuple[str, ...] = ()
    checked: float = 0.0

    def refresh(self, now: float) -> None:
        if now - self.checked < 0.05:
            return
        self.checked = now
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError:
            return
        if mtime == self.mtime:
            return
        try:
            obj = json.loads(self.path.read_text())
            self.gen, self.members, self.mtime = int(obj["gen"]), tuple(obj["members"]), mtime
        except (OSError, ValueError, KeyError, TypeError):
            pass  # written atomically, so only a race with a rename: read it next time


class Load:
    """The agents and workers of one load process."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.hub = settings["hub"]
        self.key = C.read_key_file(settings["key_file"])
        self.heartbeat = float(settings["heartbeat"])
        self.rate = float(settings["rate"])
        self.reporters = settings["reporters"]
        self.samples = int(settings.get("samples", 32))
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, 65536)  # one DEALER per agent: thousands (the default allows 1,023)
        self.control = self.ctx.socket(zmq.PULL)
        self.control.connect(settings["control"])
        self.status = self.ctx.socket(zmq.PUSH)
        self.status.connect(settings["status"])
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.setsockopt(zmq.SNDHWM, 100_000)
        self.push.setsockopt(zmq.LINGER, 5000)
        self.push.connect(settings["monitor"])
        self.poller = zmq.Poller()
        self.poller.register(self.control, zmq.POLLIN)
        self.agents: dict[str, SimAgent] = {}
        self.by_sock: dict[Any, SimAgent] = {}
        self.members: dict[str, JobMembers] = {}
        self.reporting = True
        self.sent = 0
        self.refused = 0
        self.recalled: dict[str, list[float]] = {}
        self.frames_in = 0
        self.frames_out = 0
        self.out = settings["out"]
        self.pid = os.getpid()

    # ---------------------------------------------------------------- agents
    def start_agent(self, node: str, pilot: str) -> None:
        old = self.agents.pop(node, None)
        if old is not None:
            self._close(old)
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, node.encode())
        sock.setsockopt(zmq.LINGER, 200)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.connect(self.hub)
        agent = SimAgent(node, pilot, sock)
        self.agents[node] = agent
        self.by_sock[sock] = agent
        self.poller.register(sock, zmq.POLLIN)

    def stop_agent(self, node: str, why: str) -> None:
        agent = self.agents.pop(node, None)
        if agent is None:
            return
        if why == "recalled":
            self.recalled.setdefault(node, []).append(time.time())
        self.send(agent, P.Leaving(node, why))
        self._close(agent)

    def _close(self, agent: SimAgent) -> None:
        self.poller.unregister(agent.sock)
        self.by_sock.pop(agent.sock, None)
        agent.sock.close()

    def send(self, agent: SimAgent, msg: P.AgentMessage) -> None:
        if agent.session is None:
            return
        agent.seq += 1
        try:
            agent.sock.send(agent.session.seal(P.encode(msg, agent.seq)), zmq.NOBLOCK)
            self.frames_out += 1
        except zmq.Again:
            agent.session = None  # the connection went: authenticate again

    def authenticate(self, agent: SimAgent, now: float) -> None:
        if agent.session is not None or now < agent.next_auth:
            return
        agent.nonce_a, agent.nonce_h = C.new_nonce(), None
        # the agent retries every 1 s; a loaded hub answers later than that, and each retry makes
        # the last answer useless (see docs/research/scale.md): back off, 16 s doubling to 64 s, with jitter
        agent.tries += 1
        agent.next_auth = now + min(64.0, 8.0 * 2.0 ** agent.tries) * random.uniform(0.75, 1.25)
        try:
            agent.sock.send(C.challenge_frame(agent.nonce_a), zmq.NOBLOCK)
        except zmq.Again:
            agent.nonce_a, agent.next_auth = None, now + 0.1  # not connected yet: no try spent
            agent.tries -= 1

    def receive(self, agent: SimAgent, frame: bytes, now: float) -> None:
        self.frames_in += 1
        kind = C.kind_of(frame)
        if kind is C.Kind.NONCE and agent.nonce_a is not None and agent.nonce_h is None:
            agent.nonce_h = C.parse_nonce(frame)
            agent.sock.send(C.finish_frame(C.agent_proof(self.key, agent.node, agent.nonce_a, agent.nonce_h)))
        elif kind is C.Kind.PROOF and agent.nonce_a is not None and agent.nonce_h is not None:
            proof = C.parse_proof(frame)
            if proof != C.hub_proof(self.key, agent.node, agent.nonce_a, agent.nonce_h):
                raise RuntimeError(f"node {agent.node}: the hub could not prove the agent key")
            agent.session = C.Session.for_agent(C.session_key(self.key, agent.node, agent.nonce_a, agent.nonce_h))
            agent.nonce_a = agent.nonce_h = None
            agent.tries = 0
            self.send(agent, P.Hello(agent.node, self.pid, tuple(agent.workers), agent.pilot))
            agent.next_hb = now + self.heartbeat
        elif kind is C.Kind.REAUTH:
            agent.session, agent.next_auth = None, 0.0
        elif kind is C.Kind.DATA and agent.session is not None:
            self.handle(agent, P.decode(agent.session.open(frame)), now)

    def handle(self, agent: SimAgent, msg: P.AgentMessage, now: float) -> None:
        if isinstance(msg, P.StartWorker):
            if msg.worker in agent.workers:
                return
            job = msg.env[ENV_JOB]
            worker = SimWorker(job, msg.worker, secret_key(msg.env[ENV_JOB_SECRET]), next_step=now)
            agent.workers[msg.worker] = worker
            toy = Path(msg.env[ENV_TOY_DIR])
            (toy / f"{job}.ready.{msg.worker}").touch()
            if job not in self.members:
                self.members[job] = JobMembers(toy / f"{job}.json")
            self.send(agent, P.WorkerStarted(agent.node, msg.worker, self.pid))
        elif isinstance(msg, P.StopWorker):
            if agent.workers.pop(msg.worker, None) is not None:
                self.send(agent, P.WorkerExited(agent.node, msg.worker, -15))
        elif isinstance(msg, P.Shutdown):
            self.stop_agent(agent.node, "released")

    # ---------------------------------------------------------------- workers
    def report(self, now: float) -> None:
        period = 1.0 / self.rate
        for job in self.members.values():
            job.refresh(now)
        wall = time.time()
        for agent in self.agents.values():
            for w in agent.workers.values():
                if now < w.next_step:
                    continue
                w.next_step = max(w.next_step + period, now - period)
                job = self.members.get(w.job)
                if job is None or w.id not in job.members:
                    continue
                if self.reporters == "rank0" and job.members[0] != w.id:
                    continue
                n = len(job.members)
                w.seq += 1
                frame = Report(w.job, w.seq, self.samples * n, wall, n, job.gen, w.id).encode(w.key)
                try:
                    self.push.send(frame, zmq.NOBLOCK)
                    self.sent += 1
                except zmq.Again:
                    self.refused += 1

    # ---------------------------------------------------------------- loop
    def command(self, msg: dict[str, Any]) -> bool:
        op = msg["op"]
        if op == "start":
            self.start_agent(msg["node"], msg["pilot"])
        elif op == "stop":
            self.stop_agent(msg["node"], msg["why"])
        elif op == "count":
            self.status.send_json({"sent": self.sent, "refused": self.refused})
        elif op == "quiet":
            self.reporting = False
        elif op == "exit":
            return False
        return True

    def run(self) -> None:
        running = True
        while running:
            events = dict(self.poller.poll(10))
            now = time.monotonic()
            if self.control in events:
                while running:
                    try:
                        running = self.command(json.loads(self.control.recv(zmq.NOBLOCK)))
                    except zmq.Again:
                        break
            for sock, _ in events.items():
                agent = self.by_sock.get(sock)
                while agent is not None and agent.node in self.agents:
                    try:
                        frame = sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self.receive(agent, frame, now)
            for agent in list(self.agents.values()):
                if agent.session is None:
                    self.authenticate(agent, now)
                elif now >= agent.next_hb:
                    agent.next_hb = now + self.heartbeat
                    self.send(agent, P.Heartbeat(agent.node, tuple(agent.workers), self.pid))
            if self.reporting:
                self.report(now)
        for node in list(self.agents):
            self.stop_agent(node, "released")
        cpu = os.times()
        Path(self.out).write_text(json.dumps({
            "sent": self.sent, "refused": self.refused, "recalled": self.recalled,
            "cpu_s": cpu.user + cpu.system, "frames_in": self.frames_in, "frames_out": self.frames_out,
        }))
        self.push.close()
        self.status.close()
        self.ctx.destroy(linger=1000)


def main(argv: list[str]) -> int:
    Load(json.loads(Path(argv[0]).read_text())).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
