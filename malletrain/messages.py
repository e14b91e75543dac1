"""Typed, versioned messages on the wire (ZeroMQ frames of UTF-8 JSON).

Every message is an envelope ``{"v": VERSION, "type": ..., "job": ..., "seq": ..., "payload": {...}}``.
Unknown versions and malformed frames raise :class:`MessageError` naming what is wrong;
a receiver logs and drops them and never dies of one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

VERSION = 1


class MessageError(ValueError):
    """A frame that is not a valid message; the text says why."""


@dataclass(frozen=True)
class Report:
    """One training step as seen by the user's training loop (the one line).

    ``samples`` is the global batch size of the step, ``timestamp`` the wall
    clock (unix seconds) when the step finished, ``world_size`` the number of
    workers (nodes) the step ran on, ``generation`` the membership generation.
    """

    job: str
    seq: int
    samples: int
    timestamp: float
    world_size: int
    generation: int = 0
    worker: str = ""

    TYPE = "report"

    def encode(self) -> bytes:
        payload = {
            "samples": self.samples,
            "timestamp": self.timestamp,
            "world_size": self.world_size,
            "generation": self.generation,
            "worker": self.worker,
        }
        return encode(self.TYPE, self.job, self.seq, payload)


def encode(type_: str, job: str, seq: int, payload: dict[str, Any]) -> bytes:
    return json.dumps(
        {"v": VERSION, "type": type_, "job": job, "seq": seq, "payload": payload},
        separators=(",", ":"),
    ).encode()


@dataclass(frozen=True)
class Envelope:
    v: int
    type: str
    job: str
    seq: int
    payload: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def decode(frame: bytes) -> Envelope:
    """Parse a frame into an :class:`Envelope`, or raise :class:`MessageError`."""
    try:
        obj = json.loads(frame)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MessageError(f"not JSON: {exc}; frame starts {frame[:40]!r}") from None
    return envelope_from_obj(obj, frame)


def envelope_from_obj(obj: Any, frame: bytes = b"") -> Envelope:
    """Check an already-parsed frame (``frame`` is only quoted in errors); see :func:`decode`."""
    if not isinstance(obj, dict):
        raise MessageError(f"not a JSON object: {frame[:40]!r}")
    v = obj.get("v")
    if v != VERSION:
        raise MessageError(f"unsupported message version {v!r} (this daemon speaks {VERSION})")
    type_, job, seq, payload = obj.get("type"), obj.get("job"), obj.get("seq"), obj.get("payload")
    if not isinstance(type_, str) or not type_:
        raise MessageError(f"message has no type: {frame[:80]!r}")
    if not isinstance(job, str):
        raise MessageError(f"{type_} message has no job id")
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise MessageError(f"{type_} message for job {job}: seq {seq!r} is not an integer")
    if not isinstance(payload, dict):
        raise MessageError(f"{type_} message for job {job}: payload is not an object")
    return Envelope(v, type_, job, seq, payload)


def decode_report(env: Envelope) -> Report:
    """A report from an envelope of type ``report``, with its fields checked."""
    if env.type != Report.TYPE:
        raise MessageError(f"expected a report, got {env.type!r}")
    p = env.payload
    try:
        samples = p["samples"]
        ts = p["timestamp"]
        world = p["world_size"]
    except KeyError as exc:
        raise MessageError(f"report for job {env.job} seq {env.seq}: missing {exc.args[0]!r}") from None
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 0:
        raise MessageError(f"report for job {env.job} seq {env.seq}: samples {samples!r} is not an int >= 0")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise MessageError(f"report for job {env.job} seq {env.seq}: timestamp {ts!r} is not a number")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise MessageError(f"report for job {env.job} seq {env.seq}: world_size {world!r} is not an int >= 1")
    gen = p.get("generation", 0)
    worker = p.get("worker", "")
    return Report(env.job, env.seq, samples, float(ts), world, int(gen), str(worker))


_RAW_DECODE = json.JSONDecoder().raw_decode


def decode_batch(frames: list[bytes]) -> list[Envelope | MessageError]:
    """Decode many frames at once: per frame, its envelope or its error (as :func:`decode` says).

    Fast path for the usual batch (all ASCII, all valid): one bytes-to-str
    conversion for the lot and the C scanner per frame, each frame required to
    be exactly one JSON value. Anything else goes through :func:`decode` frame
    by frame, so every error names its own frame.
    """
    joined = b"".join(frames)
    if joined.isascii():
        text = joined.decode("ascii")
        out: list[Envelope | MessageError] = []
        pos = 0
        try:
            for frame in frames:
                end = pos + len(frame)
                obj, stop = _RAW_DECODE(text, pos)
                if stop != end:
                    raise ValueError("frame is not exactly one JSON value")
                out.append(envelope_from_obj(obj, frame))
                pos = end
            return out
        except ValueError:  # JSONDecodeError and MessageError are ValueErrors
            pass
    slow: list[Envelope | MessageError] = []
    for frame in frames:
        try:
            slow.append(decode(frame))
        except MessageError as exc:
            slow.append(exc)
    return slow
