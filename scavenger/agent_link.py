"""The agent's authenticated link to the daemon (a mixin of :class:`scavenger.agent.Agent`).

Both sides prove the agent key (:mod:`scavenger.channel`) before anything runs; then the agent says
hello and flushes the worker events it held. A server that cannot prove the key gets nothing run:
the agent logs why (the first time and every 30th) and keeps trying, backing off.
"""

from __future__ import annotations

import hmac
import logging
import os
import random
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from scavenger import channel as C
from scavenger import protocol as P

log = logging.getLogger("scavenger.agent")

AUTH_RETRY_S = 1.0
AUTH_RETRY_MAX_S = 8.0
"""A challenge left unanswered is sent again after :data:`AUTH_RETRY_S`, then after twice as long at
each further silence up to this, with +-20% jitter: a hub slower than a second (a whole machine
reconnecting to a busy head node) then answers a challenge the agent still holds, instead of every
retry making its answer to the last one useless; and thousands of agents do not retry in step."""
CONNECT_RETRY_S = 0.05
OUTBOX_MAX = 1024


class DaemonLink:
    """The wire, the handshake and incoming frames; :class:`scavenger.agent.Agent` sets the state in
    its ``__init__`` and carries out the messages (:meth:`handle`)."""

    node: str
    daemon: str
    key: bytes
    batch_job: str | None
    workers: dict[str, Any]
    seq: int
    session: C.Session | None
    nonce_a: bytes | None  # our challenge in flight
    nonce_h: bytes | None  # the server's nonce, once it answered (we sent our proof)
    next_auth: float
    auth_wait: float  # how long the next challenge waits for its answer (grows while unanswered)
    outbox: list[P.AgentMessage]  # worker events while no session: sent after hello
    refused: dict[str, int]  # why frames or servers were refused, and how often
    refusals_in_a_row: int  # proofs the server refused since the last session
    sock: zmq.Socket
    monitor: zmq.Socket

    def handle(self, body: bytes) -> None:
        raise NotImplementedError

    def send(self, msg: P.AgentMessage) -> None:
        """Send ``msg`` sealed in the session; worker events wait in the outbox while there is none."""
        if self.session is None:
            if isinstance(msg, (P.WorkerStarted, P.WorkerExited)) and len(self.outbox) < OUTBOX_MAX:
                self.outbox.append(msg)
            return
        self.seq += 1
        frame = self.session.seal(P.encode(msg, self.seq))
        try:
            self.sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # the connection went away: this session is over
            self._lose_session("the connection to the daemon dropped")
            if isinstance(msg, (P.WorkerStarted, P.WorkerExited)) and len(self.outbox) < OUTBOX_MAX:
                self.outbox.append(msg)

    def _send_raw(self, frame: bytes) -> bool:
        try:
            self.sock.send(frame, zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def _refuse(self, reason: str, detail: str) -> None:
        """Log (the first time, then every 30th) why a server or a frame was refused."""
        n = self.refused[reason] = self.refused.get(reason, 0) + 1
        if n == 1 or n % 30 == 0:
            log.warning("node %s: refused %s (%s, %d times): nothing is executed without the key's proof",
                        self.node, detail, reason, n)

    def _lose_session(self, why: str) -> None:
        if self.session is not None:
            log.info("node %s: %s; authenticating again", self.node, why)
        self.session = None
        self.nonce_a = self.nonce_h = None
        self.next_auth = 0.0

    def authenticate(self, now: float) -> None:
        """Send a fresh challenge if no session and none in flight (or the last one went unanswered)."""
        if self.session is not None or now < self.next_auth:
            return
        if self.nonce_a is not None:
            self._refuse("no_answer", f"the server at {self.daemon}: no answer to the handshake within "
                                      f"{self.auth_wait:.1f} s")
            self.auth_wait = min(2 * self.auth_wait, AUTH_RETRY_MAX_S)
        self.nonce_a, self.nonce_h = C.new_nonce(), None
        self.next_auth = now + self.auth_wait * random.uniform(0.8, 1.2)
        if not self._send_raw(C.challenge_frame(self.nonce_a)):
            self.nonce_a = None  # not connected (yet): try again soon
            self.next_auth = now + CONNECT_RETRY_S

    def _on_nonce(self, frame: bytes) -> None:
        """The server's nonce: prove the key over both nonces (worthless to anyone but this server)."""
        if self.nonce_a is None or self.nonce_h is not None or self.session is not None:
            self._refuse("unexpected_nonce", f"a handshake nonce from {self.daemon} that answers no challenge")
            return
        try:
            self.nonce_h = C.parse_nonce(frame)
        except C.ChannelError as exc:
            self._refuse(exc.reason, f"the server at {self.daemon}: {exc}")
            return
        self._send_raw(C.finish_frame(C.agent_proof(self.key, self.node, self.nonce_a, self.nonce_h)))

    def _on_proof(self, frame: bytes) -> bool:
        """Check the server's proof; on success say hello. True if the server proved the key."""
        nonce_a, nonce_h = self.nonce_a, self.nonce_h
        if nonce_a is None or nonce_h is None or self.session is not None:
            self._refuse("unexpected_proof", f"a handshake proof from {self.daemon} that answers no challenge")
            return False
        self.nonce_a = self.nonce_h = None
        try:
            proof = C.parse_proof(frame)
        except C.ChannelError as exc:
            self._refuse(exc.reason, f"the server at {self.daemon}: {exc}")
            return False
        if not hmac.compare_digest(proof, C.hub_proof(self.key, self.node, nonce_a, nonce_h)):
            self._refuse("bad_proof", f"the server at {self.daemon}: it cannot prove the daemon's agent key")
            return False
        self.session = C.Session.for_agent(C.session_key(self.key, self.node, nonce_a, nonce_h))
        self.refusals_in_a_row = 0
        self.auth_wait = AUTH_RETRY_S
        log.info("node %s: authenticated the daemon at %s", self.node, self.daemon)
        self.send(P.Hello(self.node, os.getpid(), tuple(self.workers), self.batch_job))
        pending, self.outbox = self.outbox, []
        for msg in pending:
            self.send(msg)
        return True


    def receive(self, frame: bytes) -> bool:
        """Handle one frame from the server; True if it proved to come from the daemon."""
        try:
            kind = C.kind_of(frame)
        except C.ChannelError as exc:
            self._refuse(exc.reason, f"a frame from {self.daemon}: {exc}")
            return False
        if kind is C.Kind.NONCE:
            self._on_nonce(frame)
            return False
        if kind is C.Kind.PROOF:
            return self._on_proof(frame)
        if kind is C.Kind.REAUTH:
            if self.session is not None:
                self._lose_session("the daemon does not know this session (it restarted?)")
            elif self.nonce_h is not None:  # we sent our proof: the server says it does not hold
                try:
                    why = C.parse_reauth(frame)
                except C.ChannelError:
                    why = "?"
                self.refusals_in_a_row += 1
                if self.refusals_in_a_row == 1:
                    # after a (re)connect two challenges can cross (the server answers the first with a
                    # nonce the agent's second proof does not cover): not a wrong key; try again at once
                    log.info("node %s: the server at %s refused a handshake that crossed a reconnect (%s); "
                             "trying again", self.node, self.daemon, why)
                    self.next_auth = 0.0
                else:
                    self._refuse("refused_by_server", f"our proof at {self.daemon} (it says {why!r}, "
                                                      f"{self.refusals_in_a_row} times in a row): is --key-file "
                                                      "this daemon's agent key?")
                self.nonce_a = self.nonce_h = None  # retried at the next AUTH_RETRY_S (at once the first time)
            return False
        if kind is not C.Kind.DATA:
            self._refuse("wrong_direction", f"a {kind.name} frame from {self.daemon} (agents send those)")
            return False
        if self.session is None:
            self._refuse("no_session", f"a data frame from {self.daemon} before authentication")
            return False
        try:
            body = self.session.open(frame)
        except C.ChannelError as exc:
            self._refuse(exc.reason, f"a frame from {self.daemon}: {exc}")
            return False
        self.handle(body)
        return True


    def _on_connection_events(self) -> None:
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._lose_session(f"disconnected from {self.daemon}")
            elif event["event"] == zmq.EVENT_CONNECTED:
                self._lose_session(f"connected to {self.daemon}")  # a new server: prove it again

