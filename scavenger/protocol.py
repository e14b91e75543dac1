"""Messages between the daemon (ZeroMQ ROUTER) and node agents (DEALER).

Bodies are the job monitor's JSON envelopes (``job`` carries the node name) inside the authenticated
frames of :mod:`scavenger.channel`. :func:`decode` checks every field by type and range
(:data:`LIMITS`) and raises only :class:`ProtocolError`.
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable, Union

VERSION = 1
NAME_MAX = 255
"""Node and worker names: printable ASCII without spaces, at most this long."""
BATCH_JOB_MAX = 128
REASON_MAX = 64
LIST_MAX = 4096
"""Entries of ``argv``, ``env`` and ``workers`` at most."""
ARG_MAX = 128 * 1024
"""Characters of one argv entry or env value at most (``cwd``: 4096)."""
GRACE_MAX = 3600.0
PID_MAX = 2**31 - 1
SLOTS_MAX = 64
"""Worker processes one start may ask of a node at most (``contract.nodeshape.MAX_SLOTS``)."""


class ProtocolError(ValueError):
    """A frame that is not a valid agent message; the text says why."""


# ---- agent -> daemon ----------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """The agent on ``node`` (process ``pid``) connected; ``workers`` it already runs; ``batch_job``:
    its pilot (None for an agent started by hand)."""

    node: str
    pid: int
    workers: tuple[str, ...] = ()
    batch_job: str | None = None
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
    stopped: bool = False
    """The agent stopped it (a ``StopWorker``, its node recalled, its daemon lost): a stop code is then
    ours, not the job's. A job that exits 143 (or 137, 75, ...) by itself is not ``stopped``."""
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
    uid: int | None = None
    """Run as this user (the job's owner) with ``gid``; None: as the agent's own user.
    A root agent switches; any other agent refuses a uid that is not its own."""
    gid: int | None = None
    slots: int = 1
    """Worker processes to run on the node, one per slot (local ranks 0 .. slots-1), each with its
    own device, cores and ``LOCAL_RANK`` (:mod:`contract.nodeshape`); they end together."""
    umask: int | None = None
    """The file mode creation mask the worker runs with: its submitter's, recorded at submit (as Slurm
    carries it into a job); None: the agent's."""
    starts_own_ranks: bool = False
    """The worker's one process starts its ``slots`` ranks itself (``MALLETRAIN_LOCAL_RANKS`` tells it
    how many): the agent runs one process of it, as for one slot."""
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


TO_HUB_TYPES: tuple[type, ...] = (Hello, Heartbeat, WorkerStarted, WorkerExited, Leaving)
"""Messages an agent sends; the hub drops anything else."""
TO_AGENT_TYPES: tuple[type, ...] = (Ping, StartWorker, StopWorker, Shutdown)
"""Messages the daemon sends; the agent drops anything else."""


def _printable_name(value: Any, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit and value.isascii() and value.isprintable() \
        and " " not in value


AGENT_TAG_BYTES = 8
"""Random bytes in an agent's identity after its node's name (16 hex digits): told apart from any
other agent that ever ran on the node."""


def agent_identity(node: str) -> bytes:
    """A fresh ZeroMQ identity for an agent of ``node``: the node's name, a space (never in a node's name)
    and a random tag; the bare name where the two would not fit ZeroMQ's 255 bytes."""
    ident = f"{node} {secrets.token_hex(AGENT_TAG_BYTES)}".encode()
    return ident if len(ident) <= 255 else node.encode()


def node_of(ident: bytes) -> str:
    """The node an agent's identity names (what comes before its first space)."""
    return ident.partition(b" ")[0].decode("ascii", "replace")


def is_node_name(value: Any) -> bool:
    """A valid node (or worker) name: 1-NAME_MAX printable ASCII characters without spaces."""
    return _printable_name(value, NAME_MAX)


def _no_nul(value: Any, limit: int = ARG_MAX) -> bool:
    return isinstance(value, str) and len(value) <= limit and "\x00" not in value


def _check_name(value: Any) -> str:
    if not _printable_name(value, NAME_MAX):
        raise ValueError(f"must be 1-{NAME_MAX} printable ASCII characters without spaces, got {value!r:.80}")
    return value


def _check_int(lo: int, hi: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"must be an integer in [{lo}, {hi}], got {value!r:.80}")
        return value
    return check


def _check_names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > LIST_MAX:
        raise ValueError(f"must be a list of at most {LIST_MAX} names")
    return tuple(_check_name(v) for v in value)


def _check_argv(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > LIST_MAX or not all(_no_nul(v) for v in value):
        raise ValueError(f"must be a list of at most {LIST_MAX} strings without NUL, each <= {ARG_MAX} chars")
    return tuple(value)


def _check_env(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or len(value) > LIST_MAX:
        raise ValueError(f"must be an object of at most {LIST_MAX} entries")
    for k, v in value.items():
        if not k or "=" in k or not _no_nul(k, NAME_MAX) or not _no_nul(v):
            raise ValueError(f"bad entry {k!r:.80}: keys 1-{NAME_MAX} chars without '=' or NUL, "
                             f"values strings without NUL")
    return dict(value)


def _check_cwd(value: Any) -> str | None:
    if value is not None and not _no_nul(value, 4096):
        raise ValueError(f"must be null or a path of at most 4096 characters without NUL, got {value!r:.80}")
    return value


def _check_grace(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= GRACE_MAX:
        raise ValueError(f"must be a number of seconds in [0, {GRACE_MAX:g}], got {value!r:.80}")
    return float(value)


def _check_reason(value: Any) -> str:
    if not _printable_name(value, REASON_MAX):
        raise ValueError(f"must be 1-{REASON_MAX} printable ASCII characters without spaces, got {value!r:.80}")
    return value


def check_batch_job(value: Any) -> str | None:
    """None, or a batch job id: 1-BATCH_JOB_MAX printable ASCII characters without spaces."""
    if value is not None and not _printable_name(value, BATCH_JOB_MAX):
        raise ValueError(f"must be null or 1-{BATCH_JOB_MAX} printable ASCII characters without spaces, "
                         f"got {value!r:.80}")
    return value


def _check_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r:.80}")
    return value


def _check_umask(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777):
        raise ValueError(f"must be null or a umask in [0, 0o777], got {value!r:.80}")
    return value


def _check_optional_id(value: Any) -> int | None:
    """None, or a user or group id (0 .. 2**32 - 2)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32 - 1):
        raise ValueError(f"must be null or an id in [0, {2**32 - 2}], got {value!r:.80}")
    return value


LIMITS: dict[str, Callable[[Any], Any]] = {
    "pid": _check_int(0, PID_MAX),
    "workers": _check_names,
    "worker": _check_name,
    "code": _check_int(-255, 255),
    "reason": _check_reason,
    "argv": _check_argv,
    "env": _check_env,
    "cwd": _check_cwd,
    "grace": _check_grace,
    "batch_job": check_batch_job,
    "uid": _check_optional_id,
    "gid": _check_optional_id,
    "slots": _check_int(1, SLOTS_MAX),
    "stopped": _check_bool,
    "umask": _check_umask,
    "starts_own_ranks": _check_bool,
}
"""One check per payload field name (a name means the same in every message)."""


def decode(frame: bytes) -> AgentMessage:
    """Parse a body into one of the message dataclasses, or raise :class:`ProtocolError`."""
    if len(frame) > 1 << 20:
        raise ProtocolError(f"body of {len(frame)} bytes is too big")
    try:
        obj = json.loads(frame.decode("utf-8"))  # UTF-8 only (json.loads(bytes) also guesses UTF-16/32)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"not JSON: {str(exc)[:100]}; frame starts {frame[:40]!r}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"not a JSON object: {frame[:40]!r}")
    if obj.get("v") != VERSION or isinstance(obj.get("v"), bool):
        raise ProtocolError(f"unsupported agent protocol version {obj.get('v')!r:.40} (speaks {VERSION})")
    type_, node, payload = obj.get("type"), obj.get("job"), obj.get("payload")
    cls = _TYPES.get(type_) if isinstance(type_, str) else None
    if cls is None:
        raise ProtocolError(f"unknown agent message type {type_!r:.40}")
    if not isinstance(node, str) or not node:
        raise ProtocolError(f"{type_} message has no node name")
    if not _printable_name(node, NAME_MAX):
        raise ProtocolError(f"{type_} message: bad node name {node!r:.80}")
    if not isinstance(payload, dict):
        raise ProtocolError(f"{type_} message from {node}: payload is not an object")
    kwargs: dict[str, Any] = {"node": node}
    for name, f in cls.__dataclass_fields__.items():  # type: ignore[attr-defined]
        if name == "node" or name not in payload:
            continue
        try:
            kwargs[name] = LIMITS[name](payload[name])
        except ValueError as exc:
            raise ProtocolError(f"{type_} message from {node}: {name} {exc}") from None
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ProtocolError(f"{type_} message from {node}: {exc}") from None
