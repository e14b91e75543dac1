"""Typed, versioned, signed messages on the wire (ZeroMQ frames of UTF-8 JSON).

A frame is one JSON object: the envelope ``{"v": 2, "type": ..., "job": ..., "seq": ...,
"payload": {...}}`` followed, as its last member, by ``"sig": "<64 hex digits>"``::

    {"v":2,"type":"report","job":"j000001","seq":7,"payload":{...},"sig":"9f2c...e1"}

``sig`` is ``HMAC-SHA256(secret, prefix)``, ``prefix`` every byte of the frame before ``,"sig":"``
(nothing is re-serialised to check it); the job's secret reaches its workers in
:data:`ENV_JOB_SECRET`. ``seq`` counts up from 1 in each sender; the monitor drops anything not
above the last one it accepted from that sender (a replay). Not CurveZMQ, because: the job id is
inside what the job's own key signs, so "signed for another job" fails like "forged" (CURVE would
need a ZAP handler mapping keys to jobs); a counter under the MAC stops replays across reconnects
(CURVE: within one connection); stdlib only, about 1.5 us a frame; reports are not secret.
Whoever reads a worker's environment can sign reports for that job only.

:func:`decode` and :func:`decode_report` check every field by type and range and raise only
:class:`MessageError`, whose ``reason`` the monitor counts, whatever the bytes.
"""

from __future__ import annotations

import binascii
import enum
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any

from contract.workerenv import ENV_JOB_SECRET  # the job's secret (64 hex digits), given to its workers

VERSION = 2
"""The envelope version this code writes and accepts (v1 was unsigned)."""

MAX_FRAME = 2048
"""Largest frame (bytes) the monitor decodes; a report is about 250 bytes."""

TRANSPORT_MAX_FRAME = 4096
"""``zmq.MAXMSGSIZE`` of the monitor socket: libzmq disconnects a peer that sends more."""

MAX_ID = 256
"""Longest job or worker id (characters)."""

MAX_SAMPLES = 2**31 - 1
"""Largest ``samples`` (global batch of one step) a report may carry."""

MAX_WORLD = 65536
"""Largest ``world_size`` a report may carry."""

MAX_TIMESTAMP = 1e11
"""Timestamps are unix seconds in ``[0, MAX_TIMESTAMP]`` (finite)."""

MAX_INT = 2**63 - 1
"""Largest ``seq`` or ``generation`` (fits SQLite's INTEGER)."""

SECRET_BYTES = 32

_SIG_OPEN = b',"sig":"'
_SIG_CLOSE = b'"}'
_SIG_HEX = 2 * 32
_TRAILER = len(_SIG_OPEN) + _SIG_HEX + len(_SIG_CLOSE)
_ENVELOPE_KEYS = frozenset(("v", "type", "job", "seq", "payload"))
_SIGNED_KEYS = _ENVELOPE_KEYS | {"sig"}
_REPORT_KEYS = frozenset(("samples", "timestamp", "world_size", "generation", "worker", "incarnation"))


class Reason(str, enum.Enum):
    """Why a frame was rejected (the monitor counts each)."""

    OVERSIZE = "oversize"
    """Longer than :data:`MAX_FRAME`."""
    NOT_JSON = "not_json"
    """Not UTF-8, not one JSON value, or nested too deep to parse."""
    MALFORMED = "malformed"
    """JSON, but not an envelope: not an object, a member missing, mistyped or unknown."""
    BAD_VERSION = "bad_version"
    """An envelope version other than :data:`VERSION`."""
    BAD_TYPE = "bad_type"
    """A message type the receiver does not take."""
    UNSIGNED = "unsigned"
    """No ``sig`` member."""
    UNKNOWN_JOB = "unknown_job"
    """For a job the receiver does not know (never creates state)."""
    BAD_SIGNATURE = "bad_signature"
    """``sig`` malformed or not the job's key's MAC of the frame (forged, tampered, other job's key)."""
    BAD_FIELD = "bad_field"
    """A payload field missing, unknown, mistyped or out of range."""
    REPLAYED = "replayed"
    """``seq`` not above the last accepted from that sender (or from a retired sender)."""
    INTERNAL = "internal"
    """The receiver failed on the frame (a bug; logged with its traceback)."""
    IMPLAUSIBLE = "implausible"
    """More progress than the job's nodes could have made since its last report (a job reporting
    for itself can sign anything: the monitor bounds what its reports may claim)."""


class MessageError(ValueError):
    """A frame that is not a valid message; ``reason`` classifies it, the text says why."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason


def quote(frame: bytes, n: int = 60) -> str:
    """A short, printable, log-safe quotation of untrusted bytes."""
    return repr(frame[:n]) + ("..." if len(frame) > n else "")


# ---------------------------------------------------------------- secrets
def new_secret() -> str:
    """A fresh random job secret (64 hex digits)."""
    return secrets.token_hex(SECRET_BYTES)


def job_secret(master_key: bytes, job_id: str) -> str:
    """The secret of ``job_id`` (64 hex digits): ``HMAC-SHA256(master_key, "malletrain job secret\\0" + id)``."""
    return hmac.new(master_key, b"malletrain job secret\0" + job_id.encode(), "sha256").hexdigest()


def secret_key(secret: str | bytes, where: str = ENV_JOB_SECRET) -> bytes:
    """The HMAC key of a secret in its text form, or ``ValueError`` naming ``where``."""
    text = secret.decode("ascii", "replace") if isinstance(secret, bytes) else secret
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != SECRET_BYTES:
        raise ValueError(f"{where}: a job secret is {2 * SECRET_BYTES} hex digits")
    return key


def sign(prefix: bytes, key: bytes) -> bytes:
    """The hex MAC of a frame prefix."""
    return binascii.hexlify(hmac.digest(key, prefix, "sha256"))


# ---------------------------------------------------------------- encoding
def encode(type_: str, job: str, seq: int, payload: dict[str, Any], key: bytes | None = None) -> bytes:
    """One frame; signed with ``key`` when given (unsigned frames are for tests and tools)."""
    body = json.dumps(
        {"v": VERSION, "type": type_, "job": job, "seq": seq, "payload": payload},
        separators=(",", ":"), allow_nan=False,
    ).encode()
    if key is None:
        return body
    prefix = body[:-1]
    return prefix + _SIG_OPEN + sign(prefix, key) + _SIG_CLOSE


@dataclass(frozen=True)
class Report:
    """One training step: ``samples`` its global batch, ``timestamp`` when it finished (unix
    seconds), ``world_size`` the workers it ran on. The sender is (``worker``, ``incarnation``): a
    worker restarted under the same name (a ``torchrun`` rank at every new world) is a new
    incarnation whose ``seq`` counts from 1 again; a report without one is incarnation 0.
    """

    job: str
    seq: int
    samples: int
    timestamp: float
    world_size: int
    generation: int = 0
    worker: str = ""
    incarnation: int = 0

    TYPE = "report"

    def encode(self, key: bytes | None = None) -> bytes:
        payload = {
            "samples": self.samples,
            "timestamp": self.timestamp,
            "world_size": self.world_size,
            "generation": self.generation,
            "worker": self.worker,
            "incarnation": self.incarnation,
        }
        return encode(self.TYPE, self.job, self.seq, payload, key)


# ---------------------------------------------------------------- decoding
@dataclass(frozen=True)
class Envelope:
    v: int
    type: str
    job: str
    seq: int
    payload: dict[str, Any]
    signed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"v": self.v, "type": self.type, "job": self.job, "seq": self.seq, "payload": self.payload}


_RAW_DECODE = json.JSONDecoder().raw_decode


def parse_json(frame: bytes, what: str = "frame") -> Any:
    """One JSON value from UTF-8 bytes, or :class:`MessageError` (never RecursionError etc.)."""
    try:
        text = frame.decode("utf-8")
        obj, end = _RAW_DECODE(text)
    except UnicodeDecodeError:
        raise MessageError(Reason.NOT_JSON, f"{what} is not UTF-8: {quote(frame)}") from None
    except RecursionError:
        raise MessageError(Reason.NOT_JSON, f"{what} is nested too deeply: {quote(frame)}") from None
    except ValueError as exc:  # JSONDecodeError, and int() refusing thousands of digits
        raise MessageError(Reason.NOT_JSON, f"{what} is not JSON ({exc}): {quote(frame)}") from None
    if end != len(text):
        raise MessageError(Reason.NOT_JSON, f"{what} is not exactly one JSON value: {quote(frame)}")
    return obj


def decode(frame: bytes) -> Envelope:
    """Parse and shape-check a frame (its signature is *not* checked: see :func:`verify`)."""
    if len(frame) > MAX_FRAME:
        raise MessageError(Reason.OVERSIZE, f"frame of {len(frame)} bytes (limit {MAX_FRAME})")
    return envelope_from_obj(parse_json(frame), frame)


def envelope_from_obj(obj: Any, frame: bytes = b"") -> Envelope:
    """Check an already-parsed frame (``frame`` is only quoted in errors); see :func:`decode`."""
    if type(obj) is not dict:
        raise MessageError(Reason.MALFORMED, f"not a JSON object: {quote(frame)}")
    v = obj.get("v")
    if type(v) is not int or v != VERSION:
        raise MessageError(Reason.BAD_VERSION, f"message version {_short(v)} (this daemon speaks {VERSION})")
    if not obj.keys() <= _SIGNED_KEYS:
        extra = sorted(str(k)[:40] for k in obj.keys() - _SIGNED_KEYS)
        raise MessageError(Reason.MALFORMED, f"unknown envelope members {extra}")
    type_, job, seq, payload = obj.get("type"), obj.get("job"), obj.get("seq"), obj.get("payload")
    if type(type_) is not str or not 0 < len(type_) <= 32:
        raise MessageError(Reason.MALFORMED, f"type {_short(type_)} is not a short string")
    if type(job) is not str or not 0 < len(job) <= MAX_ID:
        raise MessageError(Reason.MALFORMED, f"{type_} message: job {_short(job)} is not an id")
    if type(seq) is not int or not 1 <= seq <= MAX_INT:
        raise MessageError(Reason.MALFORMED, f"{type_} message for job {job!r}: seq {_short(seq)} is not in [1, 2^63)")
    if type(payload) is not dict:
        raise MessageError(Reason.MALFORMED, f"{type_} message for job {job!r}: payload is not an object")
    return Envelope(v, type_, job, seq, payload, "sig" in obj)


def verify(frame: bytes, key: bytes) -> None:
    """Check that ``frame`` ends in a signature that ``key`` made; else :class:`MessageError`."""
    if len(frame) <= _TRAILER or frame[-_TRAILER:-_SIG_HEX - 2] != _SIG_OPEN or frame[-2:] != _SIG_CLOSE:
        raise MessageError(Reason.BAD_SIGNATURE, f"sig is not the last member or not 64 hex digits: {quote(frame)}")
    if not hmac.compare_digest(sign(frame[:-_TRAILER], key), frame[-_SIG_HEX - 2:-2]):
        raise MessageError(Reason.BAD_SIGNATURE, "signature does not match the job's key")


def decode_report(env: Envelope) -> Report:
    """A report from an envelope of type ``report``, every field checked by type and range."""
    if env.type != Report.TYPE:
        raise MessageError(Reason.BAD_TYPE, f"expected a report, got {_short(env.type)}")
    p = env.payload
    if not p.keys() <= _REPORT_KEYS:
        raise _bad_field(env, f"unknown fields {sorted(str(k)[:40] for k in p.keys() - _REPORT_KEYS)}")
    samples = p.get("samples")
    if type(samples) is not int or not 0 <= samples <= MAX_SAMPLES:
        raise _bad_field(env, f"samples {_short(samples)} is not an int in [0, {MAX_SAMPLES}]")
    ts = p.get("timestamp")
    if type(ts) is int:
        ts = float(ts)
    if type(ts) is not float or not 0.0 <= ts <= MAX_TIMESTAMP:  # NaN fails both comparisons
        raise _bad_field(env, f"timestamp {_short(ts)} is not a finite number in [0, {MAX_TIMESTAMP:g}]")
    world = p.get("world_size")
    if type(world) is not int or not 1 <= world <= MAX_WORLD:
        raise _bad_field(env, f"world_size {_short(world)} is not an int in [1, {MAX_WORLD}]")
    gen = p.get("generation", 0)
    if type(gen) is not int or not 0 <= gen <= MAX_INT:
        raise _bad_field(env, f"generation {_short(gen)} is not an int in [0, 2^63)")
    worker = p.get("worker", "")
    if type(worker) is not str or len(worker) > MAX_ID or not worker.isprintable():
        raise _bad_field(env, f"worker {_short(worker)} is not a printable id of <= {MAX_ID} chars")
    incarnation = p.get("incarnation", 0)  # absent: a sender of the format before it, incarnation 0
    if type(incarnation) is not int or not 0 <= incarnation <= MAX_INT:
        raise _bad_field(env, f"incarnation {_short(incarnation)} is not an int in [0, 2^63)")
    return Report(env.job, env.seq, samples, ts, world, gen, worker, incarnation)


def _bad_field(env: Envelope, what: str) -> MessageError:
    return MessageError(Reason.BAD_FIELD, f"report for job {env.job[:64]!r} seq {env.seq}: {what}")


def _short(value: Any, n: int = 40) -> str:
    """``repr`` of an untrusted value, cut short (a 10^400 or a 100,000-item list stays small)."""
    if type(value) is int and value.bit_length() > 128:
        return f"<int of {value.bit_length()} bits>"
    text = repr(value) if not isinstance(value, (list, dict)) else f"<{type(value).__name__} of {len(value)}>"
    return text if len(text) <= n else text[:n] + "..."
