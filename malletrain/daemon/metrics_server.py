"""The metrics endpoint's HTTP server: a thread per request, as many as a share allows.

``prometheus_client.start_http_server`` keeps a thread per open connection (1,000 idle connections:
1,008 threads). This one serves at most :data:`MAX_THREADS` requests, :data:`PER_PEER` per local uid
or remote address, each given :data:`REQUEST_TIMEOUT_S`; one beyond a share is closed at once
(:attr:`BoundedWSGIServer.refused`), and a failed request is one rate-limited warning, not a traceback."""

from __future__ import annotations

import logging
import socket
import sys
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from scavenger.connguard import local_peer_uid

log = logging.getLogger("malletrain.daemon.metrics")

MAX_THREADS = 16
PER_PEER = 4
REQUEST_TIMEOUT_S = 5.0


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # (StreamRequestHandler sets it on the connection: a silent peer is dropped)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Nothing per request (a scraper every 15 s would fill the daemon's log)."""


def peer_of(conn: socket.socket) -> str:
    """``uid N`` for a connection from this host, else ``address IP``: whose share a request takes."""
    try:
        peer, ours = conn.getpeername(), conn.getsockname()
    except OSError:
        return "unknown"
    uid = local_peer_uid((str(peer[0]), int(peer[1])), (str(ours[0]), int(ours[1])))
    return f"address {peer[0]}" if uid is None else f"uid {uid}"


class BoundedWSGIServer(ThreadingMixIn, WSGIServer):
    """A thread per request within the shares of the module doc."""

    daemon_threads = True
    request_queue_size = 128  # (5 by default: a burst of connections would stall every scraper's SYN)
    max_threads = MAX_THREADS
    per_peer = PER_PEER

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._busy: dict[str, int] = {}
        self._who: dict[int, str] = {}
        self.refused = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        who = peer_of(request)
        with self._lock:
            full = sum(self._busy.values()) >= self.max_threads or self._busy.get(who, 0) >= self.per_peer
            if not full:
                self._busy[who] = self._busy.get(who, 0) + 1
                self._who[id(request)] = who
            else:
                self.refused += 1
        if full:
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self._done(request)
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A request that failed: one warning through the log (rate-limited there), no traceback."""
        exc = sys.exc_info()[1]
        log.warning("metrics endpoint: a request failed: %s", f"{type(exc).__name__}: {exc}"[:200])

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done(request)

    def _done(self, request: Any) -> None:
        with self._lock:
            who = self._who.pop(id(request), None)
            if who is not None:
                self._busy[who] -= 1
                if not self._busy[who]:
                    del self._busy[who]


def serve_metrics(host: str, port: int, app: Any) -> tuple[BoundedWSGIServer, threading.Thread]:
    """Serve the WSGI ``app`` on ``host:port`` in a daemon thread (IPv6 hosts too)."""

    class Server(BoundedWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    httpd = make_server(host, port, app, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return httpd, thread
