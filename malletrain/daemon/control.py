"""The control channel: the CLI asks the daemon over a Unix socket; the kernel says who asks.

One request per connection on ``<state dir>/control/control.sock``, each way a 4-byte big-endian
length and that many bytes of UTF-8 JSON. Not ZeroMQ: ``SO_PEERCRED`` gives the caller's uid and
gid from the kernel, a bad request costs one connection (each has a deadline) and never wedges the
channel, and the length comes first so an oversize request is refused unread.
:func:`authorize` says who may do what (docs/operators/security.md): anyone may ``ping``, ``status``,
``nodes`` and ``submit`` (as themselves); ``cancel`` needs the owner or an admin, ``shutdown`` an admin.
``shared=True`` (a root daemon for many users): the directory is 0711 and the socket 0666; else 0700."""

from __future__ import annotations

import enum
import grp
import json
import logging
import os
import pwd
import re
import selectors
import socket
import stat
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Union

from authframe import ChannelError

from contract.wire import recv_frame
from contract.workerenv import ENV_STATE_DIR  # the state folder where --state-dir is not given

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = "~/.malletrain"
SOCKET_DIR = "control"
SOCKET_NAME = "control.sock"

MAX_REQUEST = 256 * 1024
"""Largest request body (bytes) the server reads."""
MAX_REPLY = 64 * 1024 * 1024
"""Largest reply body (bytes) the client reads."""
MAX_CONNECTIONS = 64
MAX_PER_UID = 8
TIMEOUT_S = 5.0
"""A connection's whole life on the server: request in, reply out."""

_LEN = struct.Struct(">I")
_UCRED = struct.Struct("3i")
_JOB_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class ControlError(RuntimeError):
    """The control socket exists but cannot be used, or it broke the protocol; the text names it."""


class RequestError(ValueError):
    """A request that is not valid; ``reason`` classifies it (counted), the text says why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


# ---------------------------------------------------------------- paths
def state_dir(arg: str | None) -> Path:
    """``--state-dir``, else ``$MALLETRAIN_STATE_DIR``, else ``~/.malletrain``."""
    return Path(arg or os.environ.get(ENV_STATE_DIR) or DEFAULT_STATE_DIR).expanduser()


def socket_path(state: Path) -> Path:
    """Where the daemon of ``state`` listens."""
    return Path(state) / SOCKET_DIR / SOCKET_NAME


# ---------------------------------------------------------------- who asks
@dataclass(frozen=True)
class Caller:
    """The process at the other end of a connection, as the kernel reported it."""

    uid: int
    gid: int
    is_admin: bool
    pid: int = 0


def is_admin(uid: int, gid: int, admin_gids: frozenset[int]) -> bool:
    """Root, the daemon's own user, or a member (by the group database) of an admin group."""
    if uid in (0, os.geteuid()):
        return True
    if not admin_gids:
        return False
    groups = {gid}
    try:
        groups.update(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
    except (KeyError, OSError):
        pass  # a uid without a passwd entry has only the gid the kernel gave
    return bool(groups & admin_gids)


def peer_caller(conn: socket.socket, admin_gids: frozenset[int]) -> Caller:
    """The :class:`Caller` of a connected ``AF_UNIX`` socket (``SO_PEERCRED``)."""
    pid, uid, gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return Caller(uid, gid, is_admin(uid, gid, admin_gids), pid)


def admin_gids_from(names_or_ids: list[str | int] | tuple[str | int, ...]) -> frozenset[int]:
    """Group names or numbers (the daemon config's admin groups) as gids; ``ValueError`` naming an unknown one."""
    out: set[int] = set()
    for g in names_or_ids:
        if isinstance(g, int) and not isinstance(g, bool) and g >= 0:
            out.add(g)
        elif isinstance(g, str) and g.isdigit():
            out.add(int(g))
        elif isinstance(g, str):
            try:
                out.add(grp.getgrnam(g).gr_gid)
            except KeyError:
                raise ValueError(f"admin group {g!r} does not exist") from None
        else:
            raise ValueError(f"admin group {g!r} is not a group name or gid")
    return frozenset(out)


# ---------------------------------------------------------------- requests
class Cmd(str, enum.Enum):
    PING = "ping"
    STATUS = "status"
    NODES = "nodes"
    SUBMIT = "submit"
    CANCEL = "cancel"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True)
class Ping:
    cmd = Cmd.PING


@dataclass(frozen=True)
class Status:
    cmd = Cmd.STATUS


@dataclass(frozen=True)
class Nodes:
    cmd = Cmd.NODES


@dataclass(frozen=True)
class Submit:
    """``spec`` is the job file's object (the daemon validates it); ``owner_uid`` is the caller's uid."""

    spec: dict[str, Any]
    owner_uid: int
    owner_gid: int
    umask: int | None = None  # the submitter's, which its workers run with (None: not sent, the daemon's)
    cmd = Cmd.SUBMIT


@dataclass(frozen=True)
class Cancel:
    job: str
    cmd = Cmd.CANCEL


@dataclass(frozen=True)
class Shutdown:
    cmd = Cmd.SHUTDOWN


Request = Union[Ping, Status, Nodes, Submit, Cancel, Shutdown]

_BARE: dict[Cmd, Callable[[], Request]] = {Cmd.PING: Ping, Cmd.STATUS: Status, Cmd.NODES: Nodes, Cmd.SHUTDOWN: Shutdown}

_FIELDS: dict[Cmd, frozenset[str]] = {
    Cmd.PING: frozenset(), Cmd.STATUS: frozenset(), Cmd.NODES: frozenset(),
    Cmd.SUBMIT: frozenset({"spec"}), Cmd.CANCEL: frozenset({"id"}), Cmd.SHUTDOWN: frozenset(),
}


def parse_request(obj: Any, caller: Caller) -> Request:
    """A typed request from a decoded JSON value, or :class:`RequestError` naming the field."""
    if type(obj) is not dict:
        raise RequestError("malformed", f"a request is a JSON object, got {type(obj).__name__}")
    raw = obj.get("cmd")
    try:
        cmd = Cmd(raw) if type(raw) is str else None
    except ValueError:
        cmd = None
    if cmd is None:
        known = ", ".join(c.value for c in Cmd)
        raise RequestError("unknown_cmd", f"unknown command {str(raw)[:40]!r}; known: {known}")
    extra = set(obj) - _FIELDS[cmd] - {"cmd"} - ({"umask"} if cmd is Cmd.SUBMIT else set())  # (submit's is optional)
    if extra:
        raise RequestError("bad_field", f"{cmd.value}: unexpected fields {sorted(str(k)[:40] for k in extra)}")
    missing = _FIELDS[cmd] - set(obj)
    if missing:
        raise RequestError("bad_field", f"{cmd.value}: missing fields {sorted(missing)}")
    if cmd is Cmd.SUBMIT:
        spec = obj["spec"]
        if type(spec) is not dict:
            raise RequestError("bad_field", f"submit: spec must be an object (the job file), got {type(spec).__name__}")
        umask = obj.get("umask")
        if umask is not None and (type(umask) is not int or not 0 <= umask <= 0o777):
            raise RequestError("bad_field", f"submit: umask {str(umask)[:40]!r} is not a umask (0 to 0o777)")
        return Submit(spec, caller.uid, caller.gid, umask)
    if cmd is Cmd.CANCEL:
        jid = obj["id"]
        if type(jid) is not str or not _JOB_ID.fullmatch(jid):
            raise RequestError("bad_field", f"cancel: id {str(jid)[:40]!r} is not a job id")
        return Cancel(jid)
    return _BARE[cmd]()


def authorize(req: Request, caller: Caller, owner_of: Callable[[str], int | None]) -> str | None:
    """None if ``caller`` may make ``req``, else why not. ``owner_of(job)`` is the owner's uid (None: no such job)."""
    if isinstance(req, Shutdown):
        return None if caller.is_admin else f"shutdown needs an admin; uid {caller.uid} is not one"
    if isinstance(req, Cancel):
        owner = owner_of(req.job)
        if owner is None:
            return f"no job {req.job}"
        if owner != caller.uid and not caller.is_admin:
            return f"job {req.job} belongs to uid {owner}, not uid {caller.uid}"
    return None


Handler = Callable[[Request, Caller], dict[str, Any]]


# ---------------------------------------------------------------- framing
def pack(obj: dict[str, Any]) -> bytes:
    body = json.dumps(obj, separators=(",", ":"), default=str, allow_nan=False).encode()
    return _LEN.pack(len(body)) + body


def unpack_body(body: bytes, what: str) -> Any:
    """JSON from a body; :class:`RequestError` (never RecursionError, UnicodeError...) otherwise."""
    try:
        return json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise RequestError("not_json", f"{what} is not UTF-8") from None
    except RecursionError:
        raise RequestError("not_json", f"{what} is nested too deeply") from None
    except ValueError as exc:
        raise RequestError("not_json", f"{what} is not JSON: {str(exc)[:80]}") from None


# ---------------------------------------------------------------- server
class _Phase(enum.Enum):
    READING = "reading"
    WRITING = "writing"


@dataclass
class _Conn:
    sock: socket.socket
    caller: Caller
    deadline: float
    inbuf: bytearray = field(default_factory=bytearray)
    out: memoryview | None = None
    phase: _Phase = _Phase.READING


class ControlServer:
    """Serves requests on a Unix socket; :meth:`serve` never blocks longer than asked and never raises for a client."""

    def __init__(self, path: Path | str, handler: Handler,
                 admin_gids: frozenset[int] | set[int] | tuple[int, ...] = frozenset(),
                 owner_of: Callable[[str], int | None] = lambda job: None, shared: bool = False,
                 timeout_s: float = TIMEOUT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.handler = handler
        self.admin_gids = frozenset(admin_gids)
        self.owner_of = owner_of
        self.timeout_s = timeout_s
        self._clock = clock
        self.counters: dict[str, int] = {}
        self._conns: dict[int, _Conn] = {}
        self._sel = selectors.DefaultSelector()
        self._listener = _listen(self.path, shared)
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._spare_fd: int | None = _spare()  # closed to accept and drop a connection when out of descriptors

    # -- public
    def serve(self, timeout: float = 0.0) -> int:
        """Accept, read, answer and write for up to ``timeout`` s (0: one non-blocking pass); returns replies sent."""
        end = self._clock() + max(0.0, timeout)
        done = 0
        while True:
            now = self._clock()
            wait = max(0.0, min([end - now] + [c.deadline - now for c in self._conns.values()]))
            for key, _ in self._sel.select(wait):
                if key.data is None:
                    done += self._accept_all()
                else:
                    done += self._step(key.data)
            self._expire()
            if self._clock() >= end:
                return done

    def counts(self) -> dict[str, int]:
        """Requests answered and refused, by outcome (``ok``, ``denied``, ``not_json``...), for metrics."""
        return dict(self.counters)

    def close(self) -> None:
        if self._spare_fd is not None:
            os.close(self._spare_fd)
            self._spare_fd = None
        for conn in list(self._conns.values()):
            self._drop(conn)
        self._sel.close()
        self._listener.close()
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    # -- connections
    def _count(self, what: str) -> None:
        self.counters[what] = self.counters.get(what, 0) + 1

    def _accept_all(self) -> int:
        done = 0
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return done
            except OSError as exc:  # EMFILE and the like
                if not self._shed():
                    return done  # nothing waiting, or nothing to shed with: the next pass tries again
                self._count("no_descriptors")
                log.warning("control: accept failed: %s; a connection was dropped", exc)
                continue
            sock.setblocking(False)
            try:
                caller = peer_caller(sock, self.admin_gids)
            except OSError:
                sock.close()
                continue
            if len(self._conns) >= MAX_CONNECTIONS or sum(c.caller.uid == caller.uid for c in self._conns.values()) >= MAX_PER_UID:
                self._count("busy")
                _try_send(sock, pack({"ok": False, "error": "daemon busy: too many control connections",
                                      "reason": "busy"}))
                sock.close()
                continue
            conn = _Conn(sock, caller, self._clock() + self.timeout_s)
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)
            done += self._step(conn)  # the request is often already there

    def _shed(self) -> bool:
        """Out of descriptors: drop the waiting connection through the spare descriptor (so the listener
        does not stay readable and spin the loop); True if one was dropped."""
        if self._spare_fd is not None:
            os.close(self._spare_fd)
        try:
            self._listener.accept()[0].close()
            dropped = True
        except OSError:  # nothing waiting (Linux says EMFILE before it looks), or no spare to free
            dropped = False
        self._spare_fd = _spare()
        return dropped

    def _step(self, conn: _Conn) -> int:
        try:
            if conn.phase is _Phase.READING:
                return self._read(conn)
            self._write(conn)
        except OSError:
            self._drop(conn)
        return 0

    def _read(self, conn: _Conn) -> int:
        while True:
            try:
                chunk = conn.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return 0
            if not chunk:
                self._count("truncated")
                self._drop(conn)
                return 0
            conn.inbuf += chunk
            if len(conn.inbuf) >= _LEN.size:
                (n,) = _LEN.unpack_from(conn.inbuf)
                if n > MAX_REQUEST:
                    self._reply(conn, self._refuse("too_large", f"request of {n} bytes (limit {MAX_REQUEST})"))
                    return 1
                if len(conn.inbuf) >= _LEN.size + n:
                    if len(conn.inbuf) > _LEN.size + n:
                        reply = self._refuse("malformed", "bytes after the request")
                    else:
                        reply = self._answer(bytes(conn.inbuf[_LEN.size:]), conn.caller)
                    self._reply(conn, reply)
                    return 1

    def _answer(self, body: bytes, caller: Caller) -> dict[str, Any]:
        try:
            req = parse_request(unpack_body(body, "request"), caller)
        except RequestError as exc:
            return self._refuse(exc.reason, str(exc))
        denied = authorize(req, caller, self.owner_of)
        if denied is not None:
            log.warning("control: denied %s to uid %d (pid %d): %s", req.cmd.value, caller.uid, caller.pid, denied)
            return self._refuse("denied", denied)
        try:
            reply = self.handler(req, caller)
        except Exception as exc:  # the caller gets the error; the daemon goes on
            if not isinstance(exc, (ValueError, KeyError, LookupError)):
                log.exception("control: %s from uid %d failed", req.cmd.value, caller.uid)
            return self._refuse("failed", f"{req.cmd.value} failed: {exc}")
        if not isinstance(reply, dict):
            return self._refuse("failed", f"{req.cmd.value}: the daemon produced no reply")
        self._count("ok" if reply.get("ok", True) else "failed")
        return reply

    def _refuse(self, reason: str, error: str) -> dict[str, Any]:
        self._count(reason)
        return {"ok": False, "error": error, "reason": reason}

    def _reply(self, conn: _Conn, reply: dict[str, Any]) -> None:
        try:
            data = pack(reply)
        except (TypeError, ValueError) as exc:
            data = pack(self._refuse("failed", f"reply is not JSON: {exc}"))
        conn.out = memoryview(data)
        conn.phase = _Phase.WRITING
        self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        assert conn.out is not None
        while conn.out:
            try:
                sent = conn.sock.send(conn.out)
            except (BlockingIOError, InterruptedError):
                return
            conn.out = conn.out[sent:]
        self._drop(conn)

    def _expire(self) -> None:
        now = self._clock()
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            self._count("timeout")
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if fd >= 0 and self._conns.pop(fd, None) is not None:
            self._sel.unregister(conn.sock)
        conn.sock.close()


def _spare() -> int | None:
    """A descriptor held in reserve (``/dev/null``), or None if none is free."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _try_send(sock: socket.socket, data: bytes) -> None:
    try:
        sock.send(data)
    except OSError:
        pass


def _listen(path: Path, shared: bool) -> socket.socket:
    """A non-blocking listening socket at ``path`` in a private (or traversable-only) directory."""
    if len(os.fsencode(path)) > 107:
        raise ControlError(f"{path}: a Unix socket path is at most 107 bytes; use a shorter state dir")
    _private_dir(path.parent, 0o711 if shared else 0o700)
    if shared:
        _traversable(path.parent.parent)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise ControlError(f"{path}: exists and is not a socket; refusing to replace it")
        os.unlink(path)  # a dead daemon's socket (the caller holds the state dir's lock)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o666 if shared else 0o600)
        sock.listen(64)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise ControlError(f"{path}: cannot listen: {exc.strerror or exc}") from None
    return sock


def _traversable(d: Path) -> None:
    """Let every user pass through ``d`` (the state dir) to the socket, without listing it: add o+x
    and g+x to a private directory of ours; the files in it stay 0600."""
    st = os.lstat(d)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o011 != 0o011:
            os.chmod(d, mode | 0o011)


def _private_dir(d: Path, mode: int) -> None:
    try:
        os.mkdir(d, mode)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ControlError(f"{d}: cannot create the control directory: {exc.strerror}") from None
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ControlError(f"{d}: must be a directory owned by uid {os.geteuid()} (not a link)")
    os.chmod(d, mode)


# ---------------------------------------------------------------- client
def request(path: Path | str, req: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any] | None:
    """One request/reply on the socket at ``path``; None if no daemon answered within ``timeout_s`` (a
    socket whose queue stayed full, a connection flood, too). Raises :class:`ControlError` if the socket
    exists but this user may not connect to it, or the daemon's reply breaks the protocol."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                sock.connect(str(path))
                break
            except BlockingIOError:  # its queue is full: with a timeout set, EAGAIN at once, not a wait
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.05)
            except (FileNotFoundError, ConnectionRefusedError):
                return None
            except PermissionError:
                raise ControlError(f"{path}: permission denied (the daemon's control socket)") from None
        try:
            sock.sendall(pack(req))
            body = recv_frame(sock, MAX_REPLY)  # (a length-prefixed frame, as the store's)
        except ChannelError as exc:
            raise ControlError(f"{path}: the reply: {exc}") from None
        except (TimeoutError, ConnectionError):  # (EPIPE and ECONNRESET are ConnectionErrors, a closed socket too)
            return None
        try:
            reply = unpack_body(body, "reply")
        except RequestError as exc:
            raise ControlError(f"{path}: {exc}") from None
        if not isinstance(reply, dict):
            raise ControlError(f"{path}: the reply is not a JSON object")
        return reply
    finally:
        sock.close()


def ask(state: Path, req: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any] | None:
    """Send ``req`` to the daemon of ``state``; None if no daemon answers (see :func:`request`)."""
    return request(socket_path(state), req, timeout_s)
