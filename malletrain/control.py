"""Talking to a running daemon: find it from its state dir, send one JSON request."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import zmq

DEFAULT_STATE_DIR = "~/.malletrain"


def state_dir(arg: str | None) -> Path:
    """``--state-dir``, else ``$MALLETRAIN_STATE_DIR``, else ``~/.malletrain``."""
    return Path(arg or os.environ.get("MALLETRAIN_STATE_DIR") or DEFAULT_STATE_DIR).expanduser()


def daemon_address(state: Path) -> str | None:
    """The control address the daemon wrote, if the file exists and its process lives."""
    try:
        info = json.loads((state / "daemon.json").read_text())
    except (OSError, ValueError):
        return None
    pid = info.get("pid")
    if not isinstance(pid, int):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    addr = info.get("control")
    return addr if isinstance(addr, str) else None


def request(address: str, req: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any] | None:
    """One request/reply; None if the daemon did not answer in time."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send(json.dumps(req).encode())
        if not sock.poll(int(timeout_s * 1000)):
            return None
        reply = json.loads(sock.recv())
        return reply if isinstance(reply, dict) else None
    finally:
        sock.close(0)


def ask(state: Path, req: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any] | None:
    """Send ``req`` to the daemon of ``state``; None if no daemon answers."""
    addr = daemon_address(state)
    return None if addr is None else request(addr, req, timeout_s)
