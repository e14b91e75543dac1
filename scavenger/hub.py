"""The daemon's side of the node agents: one ZeroMQ ROUTER every agent connects to.

:meth:`AgentHub.poll` turns agent frames into events (agent up/gone, worker started/exited), pings
agents, and declares an agent gone after ``dead_after_s`` without heartbeats. Who counts as an agent,
and how a node's replacement agent takes over: docs/operators/security.md (agent channel). No agent
state exists before the handshake ends (at most :data:`MAX_PENDING` in progress, each
:data:`PENDING_TTL_S`); ``ROUTER_HANDOVER`` lets an agent's reconnection take over its stale one.
"""

from __future__ import annotations

import collections
import hmac
import itertools
import logging
import signal
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping, Union

import zmq

from scavenger.connguard import ConnectionGuard
from scavenger import channel as C
from scavenger import protocol as P
from scavenger.base import AgentGone, AgentUp

log = logging.getLogger(__name__)

PENDING_TTL_S = 10.0
MAX_PENDING = 16384
"""Handshakes in progress at most: every agent of the largest machine (10,624 nodes) may reconnect at
once (a daemon restart); beyond it the oldest is dropped (it retries)."""
MAX_FRAMES_PER_POLL = 4096
"""Frames one :meth:`AgentHub.poll` reads at most (about 0.1 s of work): the rest wait for the next."""
PINGS_PER_DEAD_AFTER = 10
"""An agent hears a ping this many times within the silence after which it leaves (its
``--dead-after``, the daemon's ``agent_dead_after``), and at least every :data:`MIN_PING_S`."""
MIN_PING_S = 0.5


def ping_interval(dead_after_s: float) -> float:
    """Seconds between two pings to every agent: no agent gives the daemon up by a late ping, and
    pinging 10,000 agents is not the hub's main work (every 0.5 s was 20,000 frames a second)."""
    return max(MIN_PING_S, dead_after_s / PINGS_PER_DEAD_AFTER)


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
    stopped: bool = False
    """Its agent stopped it (:class:`scavenger.protocol.WorkerExited`): a stop code is ours, not the job's."""


@dataclass(frozen=True)
class AgentWorkers:
    """An agent (new or reconnected) reports the workers it runs, for re-adoption; ``batch_job``: its
    pilot, None for local agents."""

    node: str
    pid: int
    workers: tuple[str, ...]
    batch_job: str | None = None


HubEvent = Union[AgentUp, AgentGone, WorkerStartedEvent, WorkerExitedEvent, AgentWorkers]


@dataclass
class _AgentInfo:
    pid: int = 0
    last_seen: float = 0.0
    workers: set[str] = field(default_factory=set)
    batch_job: str | None = None


@dataclass
class _Pending:
    nonce_a: bytes
    nonce_h: bytes
    expires: float
    earlier_h: bytes | None = None
    """The nonce sent for the challenge this one replaced (same agent, not expired): an agent that sent its
    challenge again before the first answer came (a slow loop, under load) proves its newer challenge with
    that answer, the first it reads."""


class AgentHub:
    """ROUTER socket for the node agents at ``address``. ``key_file``: the daemon's agent key
    (created 0600 if absent; None: a fresh one in a private temporary directory, removed by
    :meth:`close`); give agents :attr:`key_file` either way."""

    def __init__(self, bind: str = "tcp://127.0.0.1:0", dead_after_s: float = 5.0, ping_s: float | None = None,
                 ctx: zmq.Context | None = None, clock: Callable[[], float] = time.monotonic,
                 key_file: str | Path | None = None) -> None:
        self.clock = clock  # the daemon injects its own clock (silence is measured on it)
        self._tmpdir: str | None = None
        if key_file is None:
            self._tmpdir = tempfile.mkdtemp(prefix="malletrain-hub-")  # mode 0700
            key_file = Path(self._tmpdir) / C.AGENT_KEY_FILE
        self.key_file = str(key_file)
        try:
            self._key = C.create_key_file(key_file)
        except BaseException:
            self._remove_tmpdir()
            raise
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # an identity the router still holds (a connection whose end it has not processed yet) passes to the
        # new connection: without it the router drops the newcomer's frames unanswered for as long as that
        # connection lives (an agent reconnecting to a busy daemon)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.sock.setsockopt(zmq.MAXMSGSIZE, C.MAX_FRAME)
        try:
            self.sock.bind(bind)
        except zmq.ZMQError:
            self.sock.close(0)
            self._remove_tmpdir()
            raise
        self.address: str = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.guard = ConnectionGuard(self.sock, "agents")  # caps connections per user and in total
        self.dead_after_s = dead_after_s
        self.ping_s = ping_s if ping_s is not None else ping_interval(dead_after_s)
        self.agents: dict[str, _AgentInfo] = {}  # in the order they were last heard: the silent ones first
        self.rejected: collections.Counter[str] = collections.Counter()
        self.frames = 0  # frames read from agents, accepted or not (for metrics and benchmarks)
        self._routes: dict[str, bytes] = {}  # node -> the identity of the agent that last proved the key for it
        self._sessions: dict[bytes, C.Session] = {}  # identity -> its session (only the identities in _routes)
        self._pending: dict[bytes, _Pending] = {}  # identity -> its handshake in progress
        self._last_log: dict[str, float] = {}
        self._ping_due: dict[str, float] = {}  # node -> when its next ping is due, in that order
        self.lost = 0  # agents declared gone so far (left or fell silent): the daemon's loop wakes on it
        self._batch_jobs: tuple[int, Mapping[str, str | None]] = (-1, MappingProxyType({}))
        self.version = 0  # moves when an agent comes or goes or its batch job changes (callers skip work when equal)
        self._seq = 0

    @property
    def bad_frames(self) -> int:
        """Frames dropped for any reason (see :attr:`rejected` for the reasons)."""
        return sum(self.rejected.values())

    def alive(self) -> set[str]:
        return set(self.agents)

    def pid(self, node: str) -> int:
        info = self.agents.get(node)
        return info.pid if info else 0

    def workers(self, node: str) -> set[str]:
        info = self.agents.get(node)
        return set(info.workers) if info else set()

    def batch_jobs(self) -> Mapping[str, str | None]:
        """Every connected agent's node -> the batch job it said it runs in (None if none); read-only,
        built again only when :attr:`version` moved."""
        if self._batch_jobs[0] != self.version:
            self._batch_jobs = self.version, MappingProxyType({n: info.batch_job for n, info in self.agents.items()})
        return self._batch_jobs[1]

    def batch_job(self, node: str) -> str | None:
        """The batch job id ``node``'s agent said it runs in (its pilot), None if none or unknown."""
        info = self.agents.get(node)
        return info.batch_job if info else None

    def send(self, msg: P.AgentMessage) -> bool:
        """Send to ``msg.node``'s agent; False if it is not connected and authenticated."""
        ident = self._routes.get(msg.node)
        return ident is not None and self._seal_to(ident, msg)

    def _seal_to(self, ident: bytes, msg: P.AgentMessage) -> bool:
        session = self._sessions.get(ident)
        if session is None:
            return False
        self._seq += 1
        return self._send_raw(ident, session.seal(P.encode(msg, self._seq)))

    def _send_raw(self, ident: bytes, frame: bytes) -> bool:
        try:
            self.sock.send_multipart([ident, frame], zmq.NOBLOCK)
            return True
        except (zmq.Again, zmq.ZMQError) as exc:
            log.debug("agent %r unreachable: %s", ident[:300], exc)
            return False

    def _forget(self, node: str) -> None:
        """Drop ``node``'s route and session (its agent left or fell silent)."""
        ident = self._routes.pop(node, None)
        if ident is not None:
            self._sessions.pop(ident, None)
        self._ping_due.pop(node, None)

    def start_worker(self, node: str, worker: str, argv: tuple[str, ...], env: dict[str, str], cwd: str | None,
                     uid: int | None = None, gid: int | None = None, slots: int = 1,
                     umask: int | None = None, starts_own_ranks: bool = False) -> bool:
        """Ask ``node``'s agent to run ``argv``; as ``uid``/``gid`` (the job's owner) when given; ``slots``
        processes (local ranks) of it, each on its own part of the node (``starts_own_ranks``: one process
        that starts them itself); with ``umask`` (the submitter's)."""
        return self.send(P.StartWorker(node, worker, tuple(argv), dict(env), cwd, uid, gid, slots, umask,
                                       starts_own_ranks))

    def stop_worker(self, node: str, worker: str, grace: float = 2.0) -> bool:
        return self.send(P.StopWorker(node, worker, grace))

    def poll(self, timeout_ms: int = 0, max_frames: int = MAX_FRAMES_PER_POLL) -> list[HubEvent]:
        """Events from at most ``max_frames`` queued frames (the loop goes on while agents send faster);
        agents silent for ``dead_after_s`` are gone, judged only once the queue was read to its end."""
        out: list[HubEvent] = []
        self.guard.poll()
        if timeout_ms > 0:
            self.sock.poll(timeout_ms)
            self.guard.poll()
        now = self.clock()
        drained = False
        for _ in range(max_frames):
            try:
                parts = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                drained = True
                break
            self.frames += 1
            if len(parts) != 2:
                self._reject("malformed", "?", f"{len(parts)} message parts, not 2", now)
                continue
            ident, frame = parts
            node = P.node_of(ident)
            if not P.is_node_name(node):
                self._reject("bad_identity", repr(ident[:40]), "identity does not start with a node name", now)
                continue
            try:
                out.extend(self._receive(ident, node, frame, now))
            except C.ChannelError as exc:
                self._reject(exc.reason, node, str(exc), now)
            except P.ProtocolError as exc:
                self._reject("bad_message", node, str(exc), now)
        if drained:
            out.extend(self._silent(now))
        self._ping(now)
        return out

    def _silent(self, now: float) -> list[AgentGone]:
        """The agents silent for ``dead_after_s``, gone: the first of :attr:`agents` (the least
        recently heard), not a look at every agent (a poll runs many times a second)."""
        gone = list(itertools.takewhile(lambda n: now - self.agents[n].last_seen > self.dead_after_s, self.agents))
        self.version += bool(gone)
        self.lost += len(gone)
        for node in gone:
            del self.agents[node]
            self._forget(node)
        return [AgentGone(node, f"no heartbeat for {self.dead_after_s:g} s") for node in gone]

    def _ping(self, now: float) -> None:
        """Ping the agents whose ping is due, each every ``ping_s``: spread over the polls (a ping
        to all 4,608 agents at once kept one loop iteration busy for a tenth of a second)."""
        due = list(itertools.takewhile(lambda n: self._ping_due[n] <= now, self._ping_due))
        for node in due:
            del self._ping_due[node]
            if node in self.agents:
                self.send(P.Ping(node))
                self._ping_due[node] = now + self.ping_s

    # -- the channel
    def _receive(self, ident: bytes, node: str, frame: bytes, now: float) -> list[HubEvent]:
        """The events of one frame from the agent ``ident`` of ``node`` (none for a handshake step);
        raises when rejected."""
        kind = C.kind_of(frame)
        if kind is C.Kind.CHALLENGE:
            self._challenge(ident, C.parse_challenge(frame), now)
            return []
        if kind is C.Kind.FINISH:
            return self._finish(ident, node, C.parse_finish(frame), now)
        if kind is not C.Kind.DATA:
            raise C.ChannelError("wrong_direction", f"{kind.name} frames go to agents, not to the hub")
        session = self._sessions.get(ident)
        if session is None:
            if self._routes.get(node, ident) != ident:
                raise C.ChannelError("replaced", "data frame from an agent a newer agent of its node replaced")
            self._send_raw(ident, C.reauth_frame("no_session"))
            raise C.ChannelError("no_session", "data frame before a handshake (asked to authenticate)")
        msg = P.decode(session.open(frame))
        if msg.node != node:
            raise C.ChannelError("wrong_node", f"agent {node} sent a message as {msg.node!r}")
        if not isinstance(msg, P.TO_HUB_TYPES):
            raise C.ChannelError("wrong_direction", f"{msg.TYPE} messages go to agents, not to the hub")
        return self._handle(msg, now)

    def _challenge(self, ident: bytes, nonce_a: bytes, now: float) -> None:
        # _pending is in the order of its expiry times (one TTL, re-inserted at each challenge; the
        # clock does not go back): the expired and the oldest are at its front, found without a scan
        # (a scan per challenge made a whole machine's agents reconnecting at once quadratic)
        replaced = self._pending.pop(ident, None)
        earlier_h = replaced.nonce_h if replaced is not None and replaced.expires >= now else None
        for old in list(itertools.takewhile(lambda i: self._pending[i].expires < now, self._pending)):
            del self._pending[old]
        if len(self._pending) >= MAX_PENDING:
            oldest = next(iter(self._pending))
            del self._pending[oldest]
            self._reject("pending_evicted", P.node_of(oldest), f"more than {MAX_PENDING} handshakes in progress", now)
        nonce_h = C.new_nonce()
        self._pending[ident] = _Pending(nonce_a, nonce_h, now + PENDING_TTL_S, earlier_h)
        self._send_raw(ident, C.nonce_frame(nonce_h))

    def _finish(self, ident: bytes, node: str, proof: bytes, now: float) -> list[HubEvent]:
        """Check an agent's proof; on success its session, and the node's frames go to it (the events of
        the agent it replaces, if any)."""
        pending = self._pending.pop(ident, None)
        if pending is None or pending.expires < now:
            raise C.ChannelError("no_handshake", "handshake proof without a live challenge")
        # the nonce its proof covers: the one sent for its challenge, or the one sent for the challenge it
        # replaced (the two crossed: it read that answer first); either is fresh and used once
        nonce_h = next((h for h in (pending.nonce_h, pending.earlier_h) if h is not None and hmac.compare_digest(
            proof, C.agent_proof(self._key, node, pending.nonce_a, h))), None)
        if nonce_h is None:
            self._send_raw(ident, C.reauth_frame("bad_proof"))  # a hint for the agent's log; nothing kept
            raise C.ChannelError("bad_proof", "the agent cannot prove the daemon's agent key")
        out = self._replace(node, ident)
        self._routes[node] = ident
        self._sessions[ident] = C.Session.for_hub(C.session_key(self._key, node, pending.nonce_a, nonce_h))
        self._send_raw(ident, C.proof_frame(C.hub_proof(self._key, node, pending.nonce_a, nonce_h)))
        log.info("agent %s authenticated", node)
        return out

    def _replace(self, node: str, ident: bytes) -> list[HubEvent]:
        """A new agent ``ident`` proved the key for ``node`` while another held it (a pilot's replacement):
        the old one is told to leave and its workers count as stopped; the node stays up."""
        old = self._routes.get(node)
        if old is None or old == ident:
            return []
        self._seal_to(old, P.Shutdown(node))
        self._sessions.pop(old, None)
        info = self.agents.get(node)
        workers = sorted(info.workers) if info is not None else []
        if info is not None:
            info.workers = set()
        log.info("agent %s: a new agent replaces the one that ran %d workers; told the old one to leave",
                 node, len(workers))
        return [WorkerExitedEvent(node, w, 128 + signal.SIGTERM, stopped=True) for w in workers]

    def _reject(self, reason: str, node: str, detail: str, now: float) -> None:
        self.rejected[reason] += 1
        if now - self._last_log.get(reason, float("-inf")) >= 1.0:
            self._last_log[reason] = now
            log.warning("agent frame from %s rejected (%s; %d so far): %s", node, reason,
                        self.rejected[reason], detail)

    # -- messages
    def _handle(self, msg: P.AgentMessage, now: float) -> list[HubEvent]:
        node = msg.node
        if isinstance(msg, P.Leaving):
            self._forget(node)
            if self.agents.pop(node, None) is not None:
                self.version += 1
                self.lost += 1
                return [AgentGone(node, msg.reason)]
            return []
        out: list[HubEvent] = []
        info = self.agents.get(node)
        if info is None:
            info = _AgentInfo()
            self._ping_due.setdefault(node, now + self.ping_s)  # (every entry is now + ping_s: in due order)
            self.version += 1
            out.append(AgentUp(node))
            if isinstance(msg, P.Heartbeat):
                info.pid = int(msg.pid)
                out.append(AgentWorkers(node, info.pid, tuple(msg.workers)))
        else:
            del self.agents[node]
        self.agents[node] = info  # the most recently heard last
        info.last_seen = now
        if isinstance(msg, P.Hello):
            info.pid = int(msg.pid)
            info.workers = set(msg.workers)
            self.version += info.batch_job != msg.batch_job
            info.batch_job = msg.batch_job
            out.append(AgentWorkers(node, info.pid, tuple(msg.workers), msg.batch_job))
        elif isinstance(msg, P.Heartbeat):
            info.workers = set(msg.workers)
        elif isinstance(msg, P.WorkerStarted):
            info.workers.add(msg.worker)
            out.append(WorkerStartedEvent(node, msg.worker, int(msg.pid)))
        elif isinstance(msg, P.WorkerExited):
            info.workers.discard(msg.worker)
            out.append(WorkerExitedEvent(node, msg.worker, int(msg.code), bool(msg.stopped)))
        return out

    def close(self) -> None:
        self.guard.close()
        self.sock.close(0)
        self._remove_tmpdir()

    def _remove_tmpdir(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
