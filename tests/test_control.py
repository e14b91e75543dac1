"""Control channel: Unix socket, SO_PEERCRED authority, schemas, and no wedge (issue E #1, #6)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import struct
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from malletrain.daemon.control import (
    MAX_PER_UID,
    Caller,
    Cancel,
    ControlError,
    ControlServer,
    Nodes,
    Ping,
    Request,
    RequestError,
    Shutdown,
    Status,
    Submit,
    admin_gids_from,
    ask,
    authorize,
    is_admin,
    parse_request,
    request,
    socket_path,
)

NOBODY = 65534
OWNERS = {"j000001": 0, "j000002": NOBODY}


class Daemonish:
    """A handler like the daemon's: records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[Request, Caller]] = []
        self.stopping = False

    def __call__(self, req: Request, caller: Caller) -> dict[str, Any]:
        self.calls.append((req, caller))
        if isinstance(req, Submit):
            if req.spec.get("explode"):
                raise RuntimeError("boom")
            return {"ok": True, "id": "j000003", "owner": req.owner_uid}
        if isinstance(req, Shutdown):
            self.stopping = True
        if isinstance(req, Cancel):
            return {"ok": True, "id": req.job}
        return {"ok": True, "cmd": req.cmd.value, "uid": caller.uid}


class Running:
    """A server served from a thread, for clients in this process."""

    def __init__(self, server: ControlServer) -> None:
        self.server = server
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.server.serve(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.server.close()


@pytest.fixture
def shared_state() -> Iterator[Path]:
    """A state dir every user can traverse (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="mt-ctl-"))
    os.chmod(d, 0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make(state: Path, shared: bool = False, **kw: Any) -> tuple[ControlServer, Daemonish]:
    handler = Daemonish()
    server = ControlServer(socket_path(state), handler, owner_of=OWNERS.get, shared=shared, **kw)
    return server, handler


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Running, Daemonish]]:
    server, handler = make(tmp_path)
    r = Running(server)
    yield r, handler
    r.stop()


def raw(state: Path, data: bytes, read: bool = True) -> dict[str, Any] | None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(socket_path(state)))
        s.sendall(data)
        if not read:
            return None
        buf = b""
        try:
            while chunk := s.recv(65536):
                buf += chunk
        except ConnectionResetError:
            pass
    (n,) = struct.unpack(">I", buf[:4])
    return json.loads(buf[4 : 4 + n])


def framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


# ---------------------------------------------------------------- round trips
def test_requests_reach_the_handler_with_the_callers_uid(tmp_path: Path, running: tuple[Running, Daemonish]) -> None:
    _, handler = running
    assert ask(tmp_path, {"cmd": "ping"}) == {"ok": True, "cmd": "ping", "uid": os.getuid()}
    assert ask(tmp_path, {"cmd": "status"})["cmd"] == "status"
    reply = ask(tmp_path, {"cmd": "submit", "spec": {"name": "x", "command": ["true"]}})
    assert reply == {"ok": True, "id": "j000003", "owner": os.getuid()}
    req, caller = handler.calls[-1]
    assert isinstance(req, Submit) and req.owner_uid == caller.uid == os.getuid() and caller.is_admin


def test_the_socket_directory_is_private(tmp_path: Path, running: tuple[Running, Daemonish]) -> None:
    path = socket_path(tmp_path)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_ISSOCK(path.lstat().st_mode) and stat.S_IMODE(path.lstat().st_mode) == 0o600


def test_no_daemon_is_none(tmp_path: Path) -> None:
    assert ask(tmp_path, {"cmd": "ping"}) is None
    server, _ = make(tmp_path)
    server.close()
    assert not socket_path(tmp_path).exists()
    assert ask(tmp_path, {"cmd": "ping"}) is None


def test_a_stale_socket_is_replaced_and_anything_else_refused(tmp_path: Path) -> None:
    server, _ = make(tmp_path)
    server._listener.close()  # a daemon killed -9 leaves its socket file behind
    server, _ = make(tmp_path)
    server.close()
    socket_path(tmp_path).write_text("not a socket")
    with pytest.raises(ControlError, match="not a socket"):
        make(tmp_path)


# ---------------------------------------------------------------- malformed requests: answered, never wedged
@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"[" * 100_000, "too_large"),  # no length prefix: the first bytes read as 1.5 GB
        (framed(b"[" * 100_000), "not_json"),
        (framed(b"\xff\xfe"), "not_json"),
        (framed(b"[1, 2]"), "malformed"),
        (framed(b'{"cmd": "rm -rf"}'), "unknown_cmd"),
        (framed(b'{"cmd": ["status"]}'), "unknown_cmd"),
        (framed(b'{"cmd": "cancel"}'), "bad_field"),
        (framed(b'{"cmd": "cancel", "id": 5}'), "bad_field"),
        (framed(b'{"cmd": "cancel", "id": "../../etc"}'), "bad_field"),
        (framed(b'{"cmd": "submit", "spec": "x"}'), "bad_field"),
        (framed(b'{"cmd": "submit", "spec": {}, "owner_uid": 0}'), "bad_field"),
        (framed(b'{"cmd": "ping"}') + b"trailing", "malformed"),
    ],
)
def test_a_malformed_request_gets_an_error_and_the_next_one_works(
    tmp_path: Path, running: tuple[Running, Daemonish], data: bytes, reason: str
) -> None:
    reply = raw(tmp_path, data)
    assert reply is not None and reply["ok"] is False and reply["reason"] == reason, reply
    assert ask(tmp_path, {"cmd": "ping"})["ok"] is True
    assert running[0].server.counts()[reason] == 1


def test_silent_and_half_sent_connections_time_out_without_blocking_others(tmp_path: Path) -> None:
    now = [0.0]
    server, _ = make(tmp_path, timeout_s=5.0, clock=lambda: now[0])
    try:
        idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        idle.connect(str(socket_path(tmp_path)))
        half = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        half.connect(str(socket_path(tmp_path)))
        half.sendall(framed(b'{"cmd": "ping"}')[:6])
        server.serve(0)
        good = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        good.connect(str(socket_path(tmp_path)))
        good.sendall(framed(b'{"cmd": "status"}'))
        assert server.serve(0) == 1  # answered while the other two hang
        good.settimeout(5)
        assert b'"status"' in good.recv(65536)
        now[0] = 6.0
        server.serve(0)
        assert server.counts()["timeout"] == 2
        idle.settimeout(5)
        assert idle.recv(10) == b""  # closed by the server
        for s in (idle, half, good):
            s.close()
    finally:
        server.close()


def test_a_failing_handler_is_an_error_reply(tmp_path: Path, running: tuple[Running, Daemonish]) -> None:
    reply = ask(tmp_path, {"cmd": "submit", "spec": {"explode": True}})
    assert reply is not None and reply["ok"] is False and "boom" in reply["error"]
    assert ask(tmp_path, {"cmd": "ping"})["ok"] is True


def test_one_user_cannot_hold_every_connection(tmp_path: Path) -> None:
    server, _ = make(tmp_path)
    try:
        idle = []
        for _ in range(MAX_PER_UID):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(socket_path(tmp_path)))
            idle.append(s)
        server.serve(0)
        extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        extra.connect(str(socket_path(tmp_path)))
        server.serve(0)
        extra.settimeout(5)
        data = extra.recv(65536)
        assert json.loads(data[4:])["reason"] == "busy"
        for s in idle + [extra]:
            s.close()
    finally:
        server.close()


# ---------------------------------------------------------------- authority
def test_authorize_table() -> None:
    user = Caller(1000, 1000, False)
    other = Caller(1001, 1001, False)
    admin = Caller(1002, 1002, True)
    owners = {"j1": 1000}.get
    assert authorize(Cancel("j1"), user, owners) is None
    assert "belongs to uid 1000" in (authorize(Cancel("j1"), other, owners) or "")
    assert authorize(Cancel("j1"), admin, owners) is None
    assert "no job" in (authorize(Cancel("j9"), admin, owners) or "")
    assert "needs an admin" in (authorize(Shutdown(), user, owners) or "")
    assert authorize(Shutdown(), admin, owners) is None
    for req in (Ping(), Status(), Nodes(), Submit({}, 1001, 1001)):
        assert authorize(req, other, owners) is None


def test_submit_is_owned_by_the_caller_never_by_the_request() -> None:
    caller = Caller(1000, 100, False)
    req = parse_request({"cmd": "submit", "spec": {"name": "x"}}, caller)
    assert req == Submit({"name": "x"}, 1000, 100)
    with pytest.raises(RequestError, match="unexpected fields"):
        parse_request({"cmd": "submit", "spec": {}, "owner_uid": 0}, caller)


def test_admins() -> None:
    assert is_admin(0, 0, frozenset())
    assert is_admin(os.geteuid(), 0, frozenset())
    assert not is_admin(NOBODY, NOBODY, frozenset())
    assert is_admin(NOBODY, NOBODY, frozenset({NOBODY}))  # nogroup, by the group database
    assert admin_gids_from(["nogroup", 7, "12"]) == frozenset({NOBODY, 7, 12})
    with pytest.raises(ValueError, match="does not exist"):
        admin_gids_from(["no-such-group-here"])


def as_user(uid: int, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a forked child that has dropped to ``uid`` (and its gid); return its JSON result."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(rfd)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            out = fn()
        except BaseException as exc:  # noqa: BLE001
            out, code = {"child_error": f"{type(exc).__name__}: {exc}"}, 1
        os.write(wfd, json.dumps(out).encode())
        os._exit(code)
    os.close(wfd)
    chunks = []
    while chunk := os.read(rfd, 65536):
        chunks.append(chunk)
    os.close(rfd)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_real_peer_credentials_limit_another_user(shared_state: Path) -> None:
    """Issue E #1: a local user cancelled root's job and shut the daemon down; now they are refused."""
    server, handler = make(shared_state, shared=True)
    r = Running(server)
    try:
        assert stat.S_IMODE(socket_path(shared_state).parent.stat().st_mode) == 0o711

        def attack() -> dict[str, Any]:
            ask_ = lambda req: ask(shared_state, req)
            return {
                "cancel_root": ask_({"cmd": "cancel", "id": "j000001"}),
                "cancel_own": ask_({"cmd": "cancel", "id": "j000002"}),
                "shutdown": ask_({"cmd": "shutdown"}),
                "submit": ask_({"cmd": "submit", "spec": {"name": "mine"}}),
                "status": ask_({"cmd": "status"}),
            }

        out = as_user(NOBODY, attack)
        assert "child_error" not in out, out
        assert out["cancel_root"]["ok"] is False and out["cancel_root"]["reason"] == "denied"
        assert "belongs to uid 0" in out["cancel_root"]["error"]
        assert out["cancel_own"] == {"ok": True, "id": "j000002"}
        assert out["shutdown"]["reason"] == "denied" and handler.stopping is False
        assert out["submit"] == {"ok": True, "id": "j000003", "owner": NOBODY}
        assert out["status"]["uid"] == NOBODY
        asked = [(type(req).__name__, caller.uid, caller.is_admin) for req, caller in handler.calls]
        assert asked == [("Cancel", NOBODY, False), ("Submit", NOBODY, False), ("Status", NOBODY, False)]
    finally:
        r.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_an_admin_group_member_may_shut_down(shared_state: Path) -> None:
    server, handler = make(shared_state, shared=True, admin_gids={NOBODY})
    r = Running(server)
    try:
        out = as_user(NOBODY, lambda: ask(shared_state, {"cmd": "shutdown"}))
        assert out == {"ok": True, "cmd": "shutdown", "uid": NOBODY} and handler.stopping
    finally:
        r.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_a_private_socket_is_closed_to_other_users(shared_state: Path) -> None:
    server, handler = make(shared_state, shared=False)
    r = Running(server)
    try:

        def attempt() -> str:
            try:
                request(socket_path(shared_state), {"cmd": "shutdown"})
            except ControlError as exc:
                return str(exc)
            return "connected"

        assert "permission denied" in as_user(NOBODY, attempt)
        assert handler.calls == []
    finally:
        r.stop()


def test_a_control_socket_whose_queue_is_full_is_no_answer_not_an_error(tmp_path: Path) -> None:
    """A daemon under a connection flood: its socket's queue of connections is full, and a connect with a
    timeout got EAGAIN at once, which ``request`` raised (BlockingIOError: a traceback from ``malletrain
    status``, and bench_faults' flood part stopped there). Now it waits for room until its timeout, then
    says no daemon answered."""
    from malletrain.daemon.control import request

    path = str(tmp_path / "c.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(0)  # never accepts
    queued: list[socket.socket] = []
    try:
        while True:  # fill its queue
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            queued.append(s)
            try:
                s.connect(path)
            except BlockingIOError:
                break
        assert request(path, {"cmd": "ping"}, timeout_s=0.3) is None
    finally:
        for s in queued:
            s.close()
        server.close()


@pytest.mark.parametrize("reply, gone", [(struct.pack(">I", 10) + b"{}", True), (struct.pack(">I", 1 << 30), False)],
                         ids=["cut short", "too big"])
def test_a_reply_cut_short_is_no_answer_and_a_reply_too_big_is_named(tmp_path: Path, reply: bytes, gone: bool) -> None:
    """The client reads the daemon's length-prefixed reply: a socket closed before the whole frame came is
    no daemon answering (None); a length past MAX_REPLY is refused, named, without reading it."""
    path = str(tmp_path / "c.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(reply)
        conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        if gone:
            assert request(path, {"cmd": "ping"}, timeout_s=5.0) is None
        else:
            with pytest.raises(ControlError, match="limit"):
                request(path, {"cmd": "ping"}, timeout_s=5.0)
    finally:
        thread.join(5.0)
        server.close()
