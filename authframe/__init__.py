"""Authenticated frames: the one wire format the agent channel and the workers' store channel share.

Both sides of a connection hold a session key (derived by each channel's own handshake) and every
message is a data frame::

    D | counter (8 bytes, big-endian) | HMAC(S, direction | counter | body) | body

The counter strictly increases in each direction and the direction labels differ, so a frame cannot
be forged, replayed, reordered or reflected; frames are bounded (:data:`MAX_FRAME`) and start with
their :class:`Kind`. Below :mod:`scavenger.channel` and :mod:`contract.wire`; standard library only.
"""

from __future__ import annotations

import enum
import hmac
import secrets
from dataclasses import dataclass

NONCE_BYTES = 32
MAC_BYTES = 32
COUNTER_BYTES = 8
MAX_FRAME = 1 << 20
"""Largest frame either side accepts (a ``start_worker`` with its env and argv fits easily)."""

TO_HUB = b"agent->hub"
TO_AGENT = b"hub->agent"


class Kind(bytes, enum.Enum):
    """The first byte of every frame."""

    CHALLENGE = b"C"  # agent -> hub: nonce_a
    NONCE = b"N"  # hub -> agent: nonce_h
    FINISH = b"F"  # agent -> hub: proof_a
    PROOF = b"P"  # hub -> agent: proof_h
    REAUTH = b"R"  # hub -> agent: no session for you, authenticate again (unauthenticated hint)
    DATA = b"D"  # either way: counter, MAC, body


class ChannelError(ValueError):
    """A frame that fails the channel's checks; ``reason`` is a short counter key."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def mac(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA256 of ``data`` under ``key``."""
    return hmac.digest(key, data, "sha256")


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


@dataclass
class Session:
    """One authenticated connection: seals outgoing frames, opens incoming ones (labels
    :data:`TO_HUB`/:data:`TO_AGENT` in the agent's view, the reverse in the hub's)."""

    key: bytes
    send_label: bytes
    recv_label: bytes
    sent: int = 0
    received: int = 0  # highest counter accepted

    @classmethod
    def for_agent(cls, key: bytes) -> "Session":
        return cls(key, TO_HUB, TO_AGENT)

    @classmethod
    def for_hub(cls, key: bytes) -> "Session":
        return cls(key, TO_AGENT, TO_HUB)

    def seal(self, body: bytes) -> bytes:
        self.sent += 1
        counter = self.sent.to_bytes(COUNTER_BYTES, "big")
        return Kind.DATA.value + counter + mac(self.key, self.send_label + counter + body) + body

    def open(self, frame: bytes) -> bytes:
        """The body of a data frame, after checking its MAC and that its counter moved forward."""
        head = 1 + COUNTER_BYTES + MAC_BYTES
        if len(frame) < head or frame[:1] != Kind.DATA.value:
            raise ChannelError("malformed", f"data frame of {len(frame)} bytes")
        if len(frame) > MAX_FRAME:
            raise ChannelError("too_big", f"frame of {len(frame)} bytes (limit {MAX_FRAME})")
        counter_b, tag, body = frame[1 : 1 + COUNTER_BYTES], frame[1 + COUNTER_BYTES : head], frame[head:]
        if not hmac.compare_digest(tag, mac(self.key, self.recv_label + counter_b + body)):
            raise ChannelError("bad_mac", "the frame's MAC does not match (forged, reflected or another session)")
        counter = int.from_bytes(counter_b, "big")
        if counter <= self.received:
            raise ChannelError("replayed", f"counter {counter} not after {self.received} (replayed or reordered)")
        self.received = counter
        return body
