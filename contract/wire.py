"""The rendezvous store's wire: a job-keyed handshake, MACed frames, and the worker's client.

The store serves each job's keys (:mod:`contract.storekeys`) to that job's workers only, with the
agent channel's discipline (:mod:`authframe`) keyed by ``K = HMAC(secret, "malletrain-store-v1
key")`` (``secret``: ``MALLETRAIN_JOB_SECRET``). Every message is a 4-byte big-endian length and a
frame; the handshake (one per TCP connection)::

    worker -> store  C | nonce_w | len job | job | len worker | worker
    store  -> worker N | nonce_s
    worker -> store  F | HMAC(K, "worker" | job | worker | nonce_w | nonce_s)
    store  -> worker P | HMAC(K, "store"  | job | worker | nonce_w | nonce_s)   (or R | reason, then close)

then both use ``S = HMAC(K, "session" | job | worker | nonce_w | nonce_s)`` in a
:class:`authframe.Session`. A request is ``op | fields``, an answer ``status | fields`` (each
field 4-byte length + bytes). Nothing a peer sends is trusted before its proof.
"""

from __future__ import annotations

import enum
import hmac
import socket
import threading
from typing import Sequence

from authframe import MAX_FRAME, NONCE_BYTES, ChannelError, Kind, Session, mac, new_nonce

from contract.messages import secret_key
from contract.workerenv import format_address

LABEL = b"malletrain-store-v1 "
TO_STORE = b"worker->store"
TO_WORKER = b"store->worker"
LENGTH_BYTES = 4
MAX_REASON = 200
HANDSHAKE_TIMEOUT_S = 5.0
"""A peer that has not finished the handshake this long after connecting is dropped."""


class Op(bytes, enum.Enum):
    """A request's first byte."""

    SET = b"S"  # key, value
    GET = b"G"  # key -> value (or MISSING)
    CHECK = b"C"  # keys... -> b"1" if all exist
    ADD = b"A"  # key, delta (decimal) -> new value (decimal)
    DELETE = b"D"  # key -> b"1" if it existed


class Status(bytes, enum.Enum):
    """An answer's first byte."""

    OK = b"0"
    MISSING = b"1"
    REFUSED = b"E"  # reason


class StoreError(Exception):
    """Base of the store client's errors."""


class StoreRefused(StoreError):
    """The store refused a request or the handshake; the text says why (the server's reason)."""


class StoreConnectionLost(StoreError, ConnectionError):
    """The connection to the store is gone (the daemon stopped, restarted or is unreachable)."""


class StoreImpostor(StoreConnectionLost):
    """The server at the store's address cannot prove the job's key (not our daemon)."""


def store_key(secret: str) -> bytes:
    """The HMAC key of a job's store connections, from its secret (64 hex digits)."""
    return mac(secret_key(secret), LABEL + b"key")


def _transcript(what: bytes, job: str, worker: str, nonce_w: bytes, nonce_s: bytes) -> bytes:
    return LABEL + what + pack_fields(job.encode(), worker.encode()) + nonce_w + nonce_s


def worker_proof(key: bytes, job: str, worker: str, nonce_w: bytes, nonce_s: bytes) -> bytes:
    return mac(key, _transcript(b"worker", job, worker, nonce_w, nonce_s))


def store_proof(key: bytes, job: str, worker: str, nonce_w: bytes, nonce_s: bytes) -> bytes:
    return mac(key, _transcript(b"store", job, worker, nonce_w, nonce_s))


def session_for(key: bytes, job: str, worker: str, nonce_w: bytes, nonce_s: bytes, *, server: bool) -> Session:
    """The data session both sides derive after the handshake."""
    s = mac(key, _transcript(b"session", job, worker, nonce_w, nonce_s))
    return Session(s, TO_WORKER, TO_STORE) if server else Session(s, TO_STORE, TO_WORKER)


# ---- frames --------------------------------------------------------------------------------


def pack_fields(*fields: bytes) -> bytes:
    return b"".join(len(f).to_bytes(LENGTH_BYTES, "big") + f for f in fields)


def unpack_fields(data: bytes, what: str) -> list[bytes]:
    """The fields of ``data``; :class:`ChannelError` naming ``what`` if they do not add up."""
    out, i = [], 0
    while i < len(data):
        if i + LENGTH_BYTES > len(data):
            raise ChannelError("malformed", f"{what}: truncated field length")
        n = int.from_bytes(data[i:i + LENGTH_BYTES], "big")
        i += LENGTH_BYTES
        if i + n > len(data):
            raise ChannelError("malformed", f"{what}: field of {n} bytes runs past the frame")
        out.append(data[i:i + n])
        i += n
    return out


def hello_frame(nonce_w: bytes, job: str, worker: str) -> bytes:
    return Kind.CHALLENGE.value + nonce_w + pack_fields(job.encode(), worker.encode())


def parse_hello(frame: bytes) -> tuple[bytes, str, str]:
    """``(nonce_w, job, worker)`` of a hello; :class:`ChannelError` if it is not one."""
    if frame[:1] != Kind.CHALLENGE.value or len(frame) < 1 + NONCE_BYTES:
        raise ChannelError("malformed", f"hello of {len(frame)} bytes")
    fields = unpack_fields(frame[1 + NONCE_BYTES:], "hello")
    try:
        job, worker = (f.decode("ascii") for f in fields)
    except (ValueError, UnicodeDecodeError):
        raise ChannelError("malformed", "hello: not two ASCII ids (job, worker)") from None
    return frame[1:1 + NONCE_BYTES], job, worker


def send_frame(sock: socket.socket, frame: bytes) -> None:
    sock.sendall(len(frame).to_bytes(LENGTH_BYTES, "big") + frame)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock``; :class:`StoreConnectionLost` if it closes first."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise StoreConnectionLost("the store closed the connection")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket, limit: int = MAX_FRAME) -> bytes:
    """One length-prefixed frame of at most ``limit`` bytes (:class:`ChannelError` ``too_big`` otherwise)."""
    n = int.from_bytes(recv_exact(sock, LENGTH_BYTES), "big")
    if n > limit:
        raise ChannelError("too_big", f"frame of {n} bytes (limit {limit})")
    return recv_exact(sock, n)


def listen_socket(bind: str, port: int) -> int:
    """A listening TCP socket on ``bind``:``port`` (0: any free port): its fd, which the caller owns;
    an ``OSError`` names the address."""
    try:
        infos = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"rendezvous bind address {bind!r}: {exc}") from None
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restarted daemon reuses its port
        sock.bind(sockaddr)
        sock.listen(512)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {format_address((bind, port))}: {exc.strerror}") from None
    return sock.detach()


# ---- the worker's client -------------------------------------------------------------------


class StoreClient:
    """An authenticated connection to the daemon's store for one job and worker (one request at a
    time, none longer than ``timeout_s``). A lost connection raises :class:`StoreConnectionLost` and
    stays lost; a refused request :class:`StoreRefused`."""

    def __init__(self, address: tuple[str, int], job: str, worker: str, secret: str, timeout_s: float = 10.0) -> None:
        self.address = address
        self.job = job
        self.worker = worker
        self.timeout_s = timeout_s
        self._key = store_key(secret)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._session: Session | None = None
        self._connect()

    def _connect(self) -> None:
        try:
            sock = socket.create_connection(self.address, timeout=min(self.timeout_s, HANDSHAKE_TIMEOUT_S))
        except OSError as exc:
            raise StoreConnectionLost(f"cannot connect to the store at {self.address[0]}:{self.address[1]}: "
                                      f"{exc}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce_w = new_nonce()
            send_frame(sock, hello_frame(nonce_w, self.job, self.worker))
            answer = recv_frame(sock)
            if answer[:1] == Kind.REAUTH.value:
                raise StoreRefused(f"the store refused job {self.job}: {answer[1:MAX_REASON].decode('ascii', 'replace')}")
            if answer[:1] != Kind.NONCE.value or len(answer) != 1 + NONCE_BYTES:
                raise StoreImpostor(f"the server at {self.address[0]}:{self.address[1]} does not speak the store's "
                                    "handshake")
            nonce_s = answer[1:]
            send_frame(sock, Kind.FINISH.value + worker_proof(self._key, self.job, self.worker, nonce_w, nonce_s))
            answer = recv_frame(sock)
            if answer[:1] == Kind.REAUTH.value:
                raise StoreRefused(f"the store refused worker {self.worker} of job {self.job}: "
                                   f"{answer[1:MAX_REASON].decode('ascii', 'replace')}")
            want = store_proof(self._key, self.job, self.worker, nonce_w, nonce_s)
            if answer[:1] != Kind.PROOF.value or not hmac.compare_digest(answer[1:], want):
                raise StoreImpostor(f"the server at {self.address[0]}:{self.address[1]} cannot prove job "
                                    f"{self.job}'s key: not this job's daemon")
        except StoreError:
            sock.close()
            raise
        except (OSError, ChannelError) as exc:
            sock.close()
            raise StoreConnectionLost(f"handshake with the store at {self.address[0]}:{self.address[1]}: {exc}") from None
        except BaseException:
            sock.close()
            raise
        sock.settimeout(self.timeout_s)
        self._sock = sock
        self._session = session_for(self._key, self.job, self.worker, nonce_w, nonce_s, server=False)

    @property
    def local_host(self) -> str:
        """This end's address of the connection (the interface that reaches the daemon)."""
        if self._sock is None:
            raise StoreConnectionLost("the store connection is closed")
        return str(self._sock.getsockname()[0])

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
            self._sock = None

    def _request(self, op: Op, *fields: bytes) -> tuple[Status, list[bytes]]:
        with self._lock:
            sock, session = self._sock, self._session
            if sock is None or session is None:
                raise StoreConnectionLost("the store connection is closed")
            try:
                send_frame(sock, session.seal(op.value + pack_fields(*fields)))
                body = session.open(recv_frame(sock))
            except (OSError, ChannelError, StoreConnectionLost) as exc:
                sock.close()
                self._sock = None
                raise StoreConnectionLost(f"the store connection is gone: {exc}") from None
        try:
            status = Status(body[:1])
        except ValueError:
            raise StoreConnectionLost(f"the store answered status {body[:1]!r}") from None
        out = unpack_fields(body[1:], "answer")
        if status is Status.REFUSED:
            raise StoreRefused(b"".join(out).decode("utf-8", "replace"))
        return status, out

    def set(self, key: str, value: bytes | str) -> None:
        self._request(Op.SET, key.encode(), value.encode() if isinstance(value, str) else bytes(value))

    def get(self, key: str) -> bytes:
        """The value of ``key``; :class:`KeyError` if it does not exist."""
        value = self.get_or_none(key)
        if value is None:
            raise KeyError(f"store key {key} does not exist")
        return value

    def get_or_none(self, key: str) -> bytes | None:
        status, fields = self._request(Op.GET, key.encode())
        return None if status is Status.MISSING else fields[0]

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every one of ``keys`` exists."""
        _, fields = self._request(Op.CHECK, *(k.encode() for k in keys))
        return fields == [b"1"]

    def add(self, key: str, delta: int) -> int:
        _, fields = self._request(Op.ADD, key.encode(), str(int(delta)).encode())
        return int(fields[0])

    def delete_key(self, key: str) -> bool:
        _, fields = self._request(Op.DELETE, key.encode())
        return fields == [b"1"]
