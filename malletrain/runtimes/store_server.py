"""The daemon's rendezvous store: each job's keys, served to that job's workers only, bounded.

A TCP server (a thread per connection) speaking :mod:`contract.wire`. A connection serves the one job
whose key it proved in the handshake: only that job's keys in the schema
(:func:`contract.storekeys.parse_key`), the daemon's keys read-only, the checkpoint written only by a
worker the daemon started (:meth:`Authority.may_checkpoint`), at most :class:`StoreLimits` keys and
bytes a job. Connections are capped in total, per job and while handshaking, the handshaking slots
per peer (a local uid or a remote address), so one user cannot lock another's workers out. Refusals
are named, counted by reason (:attr:`RendezvousStore.rejected`) and logged at most once a second."""

from __future__ import annotations

import hmac
import logging
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from authframe import ChannelError, Kind, Session, new_nonce
from scavenger.connguard import local_peer_uid

from contract.storekeys import CHECKPOINT_KINDS, DAEMON_KINDS, BadKey, parse_key
from contract.wire import (
    HANDSHAKE_TIMEOUT_S, Op, Status, StoreConnectionLost, pack_fields, parse_hello, recv_frame, send_frame,
    session_for, store_key, store_proof, unpack_fields, worker_proof
)
from contract.workerenv import check_id

log = logging.getLogger("malletrain.runtimes.store")


class Authority(Protocol):
    """What the store asks its runtime about a peer."""

    def secret_of(self, job: str) -> str | None:
        """The job's secret, or None for a job the daemon does not run (refused)."""

    def may_checkpoint(self, job: str, worker: str) -> bool:
        """Whether ``worker`` is one the daemon started (or re-adopted) for ``job``."""


@dataclass(frozen=True)
class StoreLimits:
    """Bounds of the store (per job and per server)."""

    max_keys: int = 8192
    max_bytes: int = 1 << 30
    max_connections: int = 1024
    max_per_job: int = 256
    max_handshaking: int = 512
    max_handshaking_per_peer: int = 32
    """Handshaking connections one user of this host (or one remote address) may hold; root and the
    daemon's own user are not capped below ``max_handshaking``."""


MAX_COUNTER = 2**63 - 1
"""The largest magnitude a counter key (``add``) may hold or be moved by."""
TRUSTED_UIDS = frozenset({0, os.geteuid()})


SOCK_DIAG_BY_FAMILY = 20
NETLINK_SOCK_DIAG = 4
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
DIAG_UID_AT = 16 + 64
"""Offset of ``idiag_uid`` in the answer: the netlink header, then ``struct inet_diag_msg`` up to it."""


def _diag_uid(peer: tuple[str, int], ours: tuple[str, int]) -> int | None:
    """The uid owning the TCP socket ``peer`` -> ``ours`` of this host, asked of the kernel by its exact
    address (``sock_diag``: a hash lookup, ~10 us); None if there is none (a remote peer)."""
    sockid = (struct.pack("!HH", peer[1], ours[1]) + socket.inet_aton(peer[0]) + bytes(12)
              + socket.inet_aton(ours[0]) + bytes(12) + struct.pack("=III", 0, INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE))
    req = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.send(struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, 1, 1, 0) + req)  # NLM_F_REQUEST
        data = nl.recv(4096)
    if len(data) < DIAG_UID_AT + 4 or struct.unpack_from("=H", data, 4)[0] != SOCK_DIAG_BY_FAMILY:
        return None  # NLMSG_ERROR: no such socket here
    return int(struct.unpack_from("=I", data, DIAG_UID_AT)[0])


def _connecting_uid(peer: tuple[str, int], ours: tuple[str, int]) -> int | None:
    """The uid owning the connecting end of a local connection (None: remote, or not found), asked of the
    kernel for this socket (:func:`_diag_uid`; reading ``/proc/net/tcp`` per connection let a flood delay
    other users past their handshake), else by :func:`scavenger.connguard.local_peer_uid`."""
    if ":" not in peer[0]:
        try:
            return _diag_uid(peer, ours)
        except (OSError, struct.error):
            pass
    return local_peer_uid(peer, ours)


class StoreRefusal(ValueError):
    """A request the store does not carry out; ``reason`` is the counter key."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass
class JobSpace:
    """One job's keys and the bytes they hold."""

    values: dict[str, bytes] = field(default_factory=dict)
    used: int = 0

    def put(self, key: str, value: bytes, limits: StoreLimits | None) -> None:
        old = self.values.get(key)
        grown = len(value) - (len(old) if old is not None else -len(key))
        if limits is not None:
            if old is None and len(self.values) >= limits.max_keys:
                raise StoreRefusal("quota", f"job holds {len(self.values)} keys (limit {limits.max_keys})")
            if self.used + grown > limits.max_bytes:
                raise StoreRefusal("quota", f"job would hold {self.used + grown} bytes (limit {limits.max_bytes})")
        self.values[key] = value
        self.used += grown

    def delete(self, key: str) -> bool:
        old = self.values.pop(key, None)
        if old is None:
            return False
        self.used -= len(key) + len(old)
        return True


class RendezvousStore:
    """The store's keys and its server (see module docstring)."""

    def __init__(self, authority: Authority, limits: StoreLimits | None = None) -> None:
        self.authority = authority
        self.limits = limits or StoreLimits()
        self._spaces: dict[str, JobSpace] = {}
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._conns: dict[socket.socket, str] = {}  # connection -> job ("" while handshaking)
        self._shaking: dict[socket.socket, str] = {}  # handshaking connection -> its peer (user or address)
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self.rejected: dict[str, int] = {}
        self._count_lock = threading.Lock()
        self._logged: dict[str, float] = {}
        self.port = 0

    # -- the daemon's own access ------------------------------------------------------------
    def _space(self, key: str) -> JobSpace:
        job = parse_key(key).job
        return self._spaces.setdefault(job, JobSpace())

    def set(self, key: str, value: bytes | str) -> None:
        with self._lock:
            self._space(key).put(key, value.encode() if isinstance(value, str) else bytes(value), None)

    def get_or_none(self, key: str) -> bytes | None:
        with self._lock:
            space = self._spaces.get(parse_key(key).job)
            return None if space is None else space.values.get(key)

    def get(self, key: str) -> bytes:
        value = self.get_or_none(key)
        if value is None:
            raise KeyError(f"store key {key} does not exist")
        return value

    def check(self, keys: list[str]) -> bool:
        return all(self.get_or_none(k) is not None for k in keys)

    def add(self, key: str, delta: int) -> int:
        with self._lock:
            return self._add(self._space(key), key, delta, None)

    def delete_key(self, key: str) -> bool:
        with self._lock:
            space = self._spaces.get(parse_key(key).job)
            return space is not None and space.delete(key)

    def usage(self, job: str) -> tuple[int, int]:
        """``(keys, bytes)`` the job holds."""
        with self._lock:
            space = self._spaces.get(job)
            return (0, 0) if space is None else (len(space.values), space.used)

    @staticmethod
    def _add(space: JobSpace, key: str, delta: int, limits: StoreLimits | None) -> int:
        raw = space.values.get(key, b"0")
        try:
            value = int(raw) + delta if len(raw) <= 20 else None
        except ValueError:
            value = None
        if value is None or abs(value) > MAX_COUNTER:
            raise StoreRefusal("bad_value", f"store key {key[:80]} holds {raw[:20]!r}, not a counter "
                                            f"(an integer of magnitude at most {MAX_COUNTER})")
        space.put(key, str(value).encode(), limits)
        return value

    # -- serving ------------------------------------------------------------------------------
    def serve(self, listen_fd: int) -> None:
        """Serve on the listening socket ``listen_fd`` (owned from now on) in background threads."""
        sock = socket.socket(fileno=listen_fd)
        sock.settimeout(0.2)
        self._listener = sock
        self.port = int(sock.getsockname()[1])
        thread = threading.Thread(target=self._accept_loop, name="rdzv-accept", daemon=True)
        thread.start()
        self._threads.append(thread)

    def close(self) -> None:
        """Stop serving: the listener and every connection close (workers see the store gone)."""
        self._closed.set()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(timeout=2.0)
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _refused(self, reason: str, detail: str) -> None:
        with self._count_lock:
            n = self.rejected[reason] = self.rejected.get(reason, 0) + 1
            now = time.monotonic()
            due = now - self._logged.get(reason, -1e9) >= 1.0
            if due:
                self._logged[reason] = now
        if due:
            log.warning("rendezvous store: refused %s (%s; %d so far)", detail, reason, n)

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._closed.is_set():
            try:
                conn, peer = listener.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                if self._closed.is_set():
                    return
                self._refused("accept", f"a connection: accept failed: {exc}")
                time.sleep(0.1)
                continue
            who = self._peer_of(conn)
            with self._lock:
                full = self._full(who)
                if not full:
                    self._conns[conn] = ""
                    self._shaking[conn] = who
            if full:
                conn.close()
                self._refused("too_many", f"a connection from {peer[0]} ({who}): {full}")
                continue
            thread = threading.Thread(target=self._serve_conn, args=(conn, peer[0]), name="rdzv-conn", daemon=True)
            thread.start()
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    @staticmethod
    def _peer_of(conn: socket.socket) -> str:
        """``uid N`` for a connection from this host (``trusted`` for root and the daemon's user),
        else ``address IP``: whose share of the handshaking slots the connection takes."""
        try:
            peer, ours = conn.getpeername(), conn.getsockname()
        except OSError:
            return "unknown"
        uid = _connecting_uid((str(peer[0]), int(peer[1])), (str(ours[0]), int(ours[1])))
        if uid is None:
            return f"address {peer[0]}"
        return "trusted" if uid in TRUSTED_UIDS else f"uid {uid}"

    def _full(self, who: str) -> str:
        """Why a new connection of ``who`` is refused ('' if it is not); the caller holds the lock."""
        limits = self.limits
        if len(self._conns) >= limits.max_connections:
            return "too many connections"
        if len(self._shaking) >= limits.max_handshaking:
            return "too many connections handshaking"
        if who != "trusted" and sum(1 for w in self._shaking.values() if w == who) >= limits.max_handshaking_per_peer:
            return f"its {limits.max_handshaking_per_peer} handshaking connections are open"
        return ""

    def _serve_conn(self, conn: socket.socket, peer: str) -> None:
        try:
            session = self._handshake(conn, peer)
            if session is None:
                return
            job, worker, sess = session
            conn.settimeout(None)
            while not self._closed.is_set():
                try:
                    body = sess.open(recv_frame(conn))
                except ChannelError as exc:
                    self._refused(exc.reason, f"a frame from worker {worker} of job {job} at {peer}: {exc}")
                    return
                send_frame(conn, sess.seal(self._answer(job, worker, body)))
        except (OSError, StoreConnectionLost):
            return
        except Exception as exc:  # one bad request never leaves a traceback per connection: counted, logged at a rate
            self._refused("internal", f"a connection from {peer}: {type(exc).__name__}: {str(exc)[:200]}")
            return
        finally:
            with self._lock:
                self._conns.pop(conn, None)
                self._shaking.pop(conn, None)
            conn.close()

    def _handshake(self, conn: socket.socket, peer: str) -> tuple[str, str, Session] | None:
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            nonce_w, job, worker = parse_hello(recv_frame(conn, 4096))
            check_id("job", job)
            check_id("worker", worker)
        except (ChannelError, ValueError) as exc:
            self._refused("bad_hello", f"a connection from {peer}: {exc}")
            return None
        secret = self.authority.secret_of(job)
        nonce_s = new_nonce()
        send_frame(conn, Kind.NONCE.value + nonce_s)  # the same answer for a known and an unknown job
        try:
            finish = recv_frame(conn, 4096)
        except ChannelError as exc:
            self._refused(exc.reason, f"a connection from {peer}: {exc}")
            return None
        key = store_key(secret) if secret is not None else None
        if key is None or finish[:1] != Kind.FINISH.value or not hmac.compare_digest(
                finish[1:], worker_proof(key, job, worker, nonce_w, nonce_s)):
            self._refused("bad_proof", f"a connection from {peer} claiming worker {worker} of job {job}: "
                                       "it cannot prove the job's key")
            send_frame(conn, Kind.REAUTH.value + b"no proof of the job's key")
            return None
        with self._lock:
            per_job = sum(1 for j in self._conns.values() if j == job)
            self._shaking.pop(conn, None)
            if per_job >= self.limits.max_per_job:
                full = True
            else:
                full = False
                self._conns[conn] = job
        if full:
            self._refused("too_many", f"a connection of job {job} from {peer}: {per_job} open")
            send_frame(conn, Kind.REAUTH.value + b"too many connections for this job")
            return None
        send_frame(conn, Kind.PROOF.value + store_proof(key, job, worker, nonce_w, nonce_s))
        return job, worker, session_for(key, job, worker, nonce_w, nonce_s, server=True)

    def _answer(self, job: str, worker: str, body: bytes) -> bytes:
        try:
            return self._carry_out(job, worker, body)
        except StoreRefusal as exc:
            self._refused(exc.reason, f"worker {worker} of job {job}: {exc}")
            return Status.REFUSED.value + pack_fields(str(exc).encode())

    def _carry_out(self, job: str, worker: str, body: bytes) -> bytes:
        try:
            op = Op(body[:1])
            fields = unpack_fields(body[1:], "request")
        except (ValueError, ChannelError) as exc:
            raise StoreRefusal("malformed", f"a request that is not one: {exc}") from None
        try:
            keys = [f.decode("ascii") for f in (fields if op is Op.CHECK else fields[:1])]
        except UnicodeDecodeError:
            raise StoreRefusal("bad_key", "a key that is not ASCII") from None
        if not keys or (op in (Op.SET, Op.ADD) and len(fields) != 2) or (op in (Op.GET, Op.DELETE) and len(fields) != 1):
            raise StoreRefusal("malformed", f"{op.name} with {len(fields)} fields")
        for key in keys:
            self._check_key(job, worker, key, write=op in (Op.SET, Op.ADD, Op.DELETE))
        with self._lock:
            space = self._spaces.setdefault(job, JobSpace())
            if op is Op.GET:
                value = space.values.get(keys[0])
                return Status.MISSING.value if value is None else Status.OK.value + pack_fields(value)
            if op is Op.CHECK:
                return Status.OK.value + pack_fields(b"1" if all(k in space.values for k in keys) else b"0")
            if op is Op.SET:
                space.put(keys[0], fields[1], self.limits)
                return Status.OK.value
            if op is Op.DELETE:
                return Status.OK.value + pack_fields(b"1" if space.delete(keys[0]) else b"0")
            try:
                delta = int(fields[1])
            except ValueError:
                raise StoreRefusal("malformed", f"ADD {keys[0]} by {fields[1][:20]!r}, not an integer") from None
            return Status.OK.value + pack_fields(str(self._add(space, keys[0], delta, self.limits)).encode())

    def _check_key(self, job: str, worker: str, key: str, write: bool) -> None:
        try:
            parsed = parse_key(key)
        except BadKey as exc:
            raise StoreRefusal("bad_key", str(exc)) from None
        if parsed.job != job:
            raise StoreRefusal("other_job", f"key {key[:80]} of another job")
        if write and parsed.kind in DAEMON_KINDS:
            raise StoreRefusal("daemon_key", f"a write to {key}, which only the daemon writes")
        if write and parsed.kind in CHECKPOINT_KINDS and not self.authority.may_checkpoint(job, worker):
            raise StoreRefusal("checkpoint", f"a checkpoint write ({key}) from {worker}, not a worker of the job")

