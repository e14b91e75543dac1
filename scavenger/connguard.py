"""Connection caps for a ZeroMQ listening socket: per peer and in total.

libzmq keeps every accepted TCP connection (one descriptor each): one local user holding ~1,000 idle
connections drove the daemon to EMFILE. A :class:`ConnectionGuard` watches the socket's
``ACCEPTED``/``DISCONNECTED`` events and cuts each connection beyond its caps at once: per peer (a
local peer is the *user* owning the socket, from ``/proc/net/tcp``, so nobody uses up another's cap;
a remote one its IP; root and the daemon's own user are not capped) and in total. A descriptor reused
before its event was read may be misattributed; its count corrects itself at the next disconnect.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import resource
import socket
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger(__name__)

PER_PEER = 128
"""Open connections one user (on this host) or one remote address may hold on one port."""
TOTAL = 8192
"""Open connections on one port, from everybody."""
NOFILE_WANTED = 65536
"""The daemon's descriptor limit, raised to this (or the hard limit, if lower) at start."""


def raise_nofile_limit(wanted: int = NOFILE_WANTED) -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` towards ``wanted`` (never above the hard limit, never
    lower than it is); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
    return int(soft)


def _hex_addr(host: str, port: int) -> str | None:
    """``host:port`` as ``/proc/net/tcp`` writes it (IPv4 only), or None."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.version != 4:
        return None
    return f"{int.from_bytes(ip.packed, 'little'):08X}:{port:04X}"


def tcp_owners() -> dict[tuple[str, str], int]:
    """``(local, remote) -> uid`` of every IPv4 TCP socket on this host, from ``/proc/net/tcp``
    (addresses as it writes them); empty if unreadable. One read serves a batch of connections."""
    out: dict[tuple[str, str], int] = {}
    try:
        with open("/proc/net/tcp") as fh:
            next(fh, None)
            for line in fh:
                cols = line.split()
                if len(cols) > 7:
                    out[(cols[1], cols[2])] = int(cols[7])
    except (OSError, ValueError):
        return {}
    return out


def local_peer_uid(peer: tuple[str, int], ours: tuple[str, int],
                   owners: dict[tuple[str, str], int] | None = None) -> int | None:
    """The uid owning the connecting end (``peer``) of a connection from this host to ``ours``
    (from ``owners``, default a fresh :func:`tcp_owners`); None if not local or not found."""
    want_local, want_remote = _hex_addr(*peer), _hex_addr(*ours)
    if want_local is None or want_remote is None:
        return None
    return (tcp_owners() if owners is None else owners).get((want_local, want_remote))


@dataclass
class ConnectionGuard:
    """Caps the TCP connections of ``sock`` (a bound ZeroMQ socket); call :meth:`poll` often."""

    sock: Any
    what: str
    per_peer: int = PER_PEER
    total: int = TOTAL
    trusted_uids: frozenset[int] = field(default_factory=lambda: frozenset({0, os.geteuid()}))
    open: dict[int, str] = field(default_factory=dict)  # fd -> peer key
    cut: dict[str, int] = field(default_factory=lambda: {"per_peer": 0, "total": 0})

    def __post_init__(self) -> None:
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)

    def poll(self) -> int:
        """Handle the connection events queued so far; returns how many connections were cut."""
        accepted: list[tuple[int, socket.socket]] = []  # (zmq's fd, our duplicate: the connection stays ours to cut)
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.ZMQError:  # Again: nothing more queued
                break
            fd = int(event.get("value", -1))
            if event["event"] == zmq.EVENT_ACCEPTED:
                try:
                    accepted.append((fd, socket.socket(fileno=os.dup(fd))))
                except OSError:
                    pass  # closed already
            else:
                self.open.pop(fd, None)
                for pending in [a for a in accepted if a[0] == fd]:  # accepted and gone in this batch
                    pending[1].close()
                    accepted.remove(pending)
        if not accepted:
            return 0
        owners = tcp_owners()
        cut = 0
        for fd, s in accepted:
            try:
                cut += self._accepted(fd, s, owners)
            finally:
                s.close()
        return cut

    def counts(self) -> dict[str, int]:
        per: dict[str, int] = {}
        for key in self.open.values():
            per[key] = per.get(key, 0) + 1
        return per

    def _accepted(self, fd: int, s: socket.socket, owners: dict[tuple[str, str], int]) -> int:
        key = self._peer_key(s, owners)
        held = sum(1 for k in self.open.values() if k == key)
        over = "total" if len(self.open) >= self.total else ""
        if not over and held >= self.per_peer and not key.startswith("trusted"):
            over = "per_peer"
        if not over:
            self.open[fd] = key
            return 0
        self.cut[over] += 1
        n = self.cut[over]
        if n == 1 or n % 1000 == 0:
            log.warning("%s: cut a connection from %s: %s cap reached (%d open, %d from it; %d cut so far)",
                        self.what, key, over.replace("_", " "), len(self.open), held, n)
        try:
            s.shutdown(socket.SHUT_RDWR)  # libzmq sees the end and closes its descriptor
        except OSError:
            pass
        return 1

    def _peer_key(self, s: socket.socket, owners: dict[tuple[str, str], int]) -> str:
        """``uid N`` for a connection from this host (whatever address it used), else ``address IP``."""
        try:
            peer = s.getpeername()
            ours = s.getsockname()
        except OSError:
            return "unknown"
        uid = local_peer_uid((str(peer[0]), int(peer[1])), (str(ours[0]), int(ours[1])), owners)
        if uid is None:
            return f"address {peer[0]}"
        return f"trusted uid {uid}" if uid in self.trusted_uids else f"uid {uid}"

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(0)
