"""Messages between the daemon (ZeroMQ ROUTER) and node agents (DEALER).

Frames are UTF-8 JSON envelopes of the same shape as the job monitor's
(``{"v", "type", "job", "seq", "payload"}``); here ``job`` carries the node
name. Unknown versions and malformed frames raise :class:`ProtocolError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Union

VERSION = 1


class ProtocolError(ValueError):
    """A frame that is not a valid agent message; the text says why."""


# ---- agent -> daemon ----------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """The agent on ``node`` (process ``pid``) connected; ``workers`` it already runs."""

    node: str
    pid: int
    workers: tuple[str, ...] = ()
    TYPE = "hello"


@dataclass(frozen=True)
class Heartbeat:
    """The agent is alive and runs ``workers``."""

    node: str
    workers: tuple[str, ...] = ()
    pid: int = 0
    TYPE = "heartbeat"


@dataclass(frozen=True)
class WorkerStarted:
    node: str
    worker: str
    pid: int
    TYPE = "worker_started"


@dataclass(frozen=True)
class WorkerExited:
    """Worker ``worker`` ended with ``code`` (negative: killed by that signal)."""

    node: str
    worker: str
    code: int
    TYPE = "worker_exited"


@dataclass(frozen=True)
class Leaving:
    """The agent is exiting (``reason``: recalled = SIGTERM, released, daemon_lost)."""

    node: str
    reason: str
    TYPE = "leaving"


# ---- daemon -> agent ----------------------------------------------------------------


@dataclass(frozen=True)
class Ping:
    """The daemon is alive (agents exit when pings stop)."""

    node: str
    TYPE = "ping"


@dataclass(frozen=True)
class StartWorker:
    """Run ``argv`` (no shell) with extra ``env`` in ``cwd`` as worker ``worker``; idempotent."""

    node: str
    worker: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    TYPE = "start_worker"


@dataclass(frozen=True)
class StopWorker:
    """SIGTERM worker ``worker``'s process group, SIGKILL after ``grace`` seconds; idempotent."""

    node: str
    worker: str
    grace: float = 2.0
    TYPE = "stop_worker"


@dataclass(frozen=True)
class Shutdown:
    """Stop every worker and exit (node released)."""

    node: str
    TYPE = "shutdown"


AgentMessage = Union[Hello, Heartbeat, WorkerStarted, WorkerExited, Leaving, Ping, StartWorker, StopWorker, Shutdown]
_TYPES: dict[str, type] = {
    c.TYPE: c
    for c in (Hello, Heartbeat, WorkerStarted, WorkerExited, Leaving, Ping, StartWorker, StopWorker, Shutdown)
}


def encode(msg: AgentMessage, seq: int = 0) -> bytes:
    payload: dict[str, Any] = {}
    for name in msg.__dataclass_fields__:
        if name == "node":
            continue
        value = getattr(msg, name)
        payload[name] = list(value) if isinstance(value, tuple) else value
    obj = {"v": VERSION, "type": msg.TYPE, "job": msg.node, "seq": seq, "payload": payload}
    return json.dumps(obj, separators=(",", ":")).encode()


def decode(frame: bytes) -> AgentMessage:
    """Parse a frame into one of the message dataclasses, or raise :class:`ProtocolError`."""
    try:
        obj = json.loads(frame)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}; frame starts {frame[:40]!r}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"not a JSON object: {frame[:40]!r}")
    if obj.get("v") != VERSION:
        raise ProtocolError(f"unsupported agent protocol version {obj.get('v')!r} (speaks {VERSION})")
    type_, node, payload = obj.get("type"), obj.get("job"), obj.get("payload")
    cls = _TYPES.get(type_) if isinstance(type_, str) else None
    if cls is None:
        raise ProtocolError(f"unknown agent message type {type_!r}")
    if not isinstance(node, str) or not node:
        raise ProtocolError(f"{type_} message has no node name")
    if not isinstance(payload, dict):
        raise ProtocolError(f"{type_} message from {node}: payload is not an object")
    kwargs: dict[str, Any] = {"node": node}
    for name, f in cls.__dataclass_fields__.items():
        if name == "node":
            continue
        if name in payload:
            value = payload[name]
            if isinstance(value, list):
                value = tuple(str(v) for v in value)
            kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ProtocolError(f"{type_} message from {node}: {exc}") from None
