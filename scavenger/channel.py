"""The authenticated agent channel: a per-daemon key, a mutual handshake, MACed frames.

The agent key (:data:`KEY_BYTES` random bytes in a 0600 file, reused across daemon restarts) reaches
agents as a *path* (``--key-file``), never on a command line. Handshake (the why:
docs/operators/security.md, agent channel)::

    agent -> hub   C | nonce_a                       (32 random bytes)
    hub   -> agent N | nonce_h                       (32 random bytes)
    agent -> hub   F | proof_a                       proof_a = HMAC(K, "agent" | node | nonce_a | nonce_h)
    hub   -> agent P | proof_h                       proof_h = HMAC(K, "hub"   | node | nonce_a | nonce_h)

The agent proves itself first, so the hub shows its proof only to key holders; a proof covers the
other side's fresh nonce, so it is worthless to anyone else. Both then use ``S = HMAC(K, "session" |
node | nonce_a | nonce_h)`` for the :mod:`authframe` data frames. ``R | reason`` (unauthenticated)
only asks the agent to authenticate again: a forger can at most cost a handshake.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

# the frames themselves are shared with the workers' store channel, one layer down
from authframe import (COUNTER_BYTES, MAC_BYTES, MAX_FRAME, NONCE_BYTES, TO_AGENT, TO_HUB, ChannelError, Kind,
                       Session, mac, new_nonce)

__all__ = [
    "AGENT_KEY_FILE", "COUNTER_BYTES", "KEY_BYTES", "MAC_BYTES", "MAX_FRAME", "MAX_REASON", "NONCE_BYTES", "TO_AGENT",
    "TO_HUB", "ChannelError", "KeyFileError", "Kind", "Session", "agent_proof", "challenge_frame", "create_key_file",
    "finish_frame", "hub_proof", "kind_of", "new_nonce", "nonce_frame", "parse_challenge", "parse_finish",
    "parse_nonce", "parse_proof", "parse_reauth", "proof_frame", "reauth_frame", "read_key_file", "session_key",
]

KEY_BYTES = 32
MAX_REASON = 64
AGENT_KEY_FILE = "agent.key"

_LABEL = b"malletrain-agent-v1 "
_KINDS: dict[bytes, Kind] = {k.value: k for k in Kind}


class KeyFileError(ValueError):
    """A key file (the agents', the monitor's) is missing, unsafe or malformed; the text names the file."""


# ---- the key file --------------------------------------------------------------------------


def create_key_file(path: Path | str, size: int = KEY_BYTES, what: str = "agent key file") -> bytes:
    """The key in ``path``, created (``size`` random bytes, mode 0600, atomically) if absent; reused
    otherwise. ``what`` names the file in errors."""
    p = Path(path)
    if not p.exists():
        tmp = p.with_name(f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(size))
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, p)  # never replaces a key another process made meanwhile
            except FileExistsError:
                pass
        finally:
            tmp.unlink(missing_ok=True)
    return read_key_file(p, size, what)


def read_key_file(path: Path | str, size: int = KEY_BYTES, what: str = "agent key file") -> bytes:
    """The key in ``path``: a regular file of this user (not a symlink), mode 0600 or stricter,
    exactly ``size`` bytes. ``what`` names the file in errors."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise KeyFileError(f"{what} {p}: cannot open: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise KeyFileError(
                f"{what} {p}: must be a regular file owned by uid {os.geteuid()} with mode 0600 "
                f"(is {stat.filemode(st.st_mode)}, uid {st.st_uid})"
            )
        key = f.read(size + 1)
    if len(key) != size:
        raise KeyFileError(f"{what} {p}: holds {len(key)} bytes, not {size}")
    return key


# ---- handshake -----------------------------------------------------------------------------


def _transcript(what: bytes, node: str, nonce_a: bytes, nonce_h: bytes) -> bytes:
    name = node.encode()
    return _LABEL + what + len(name).to_bytes(2, "big") + name + nonce_a + nonce_h


def hub_proof(key: bytes, node: str, nonce_a: bytes, nonce_h: bytes) -> bytes:
    return mac(key, _transcript(b"hub", node, nonce_a, nonce_h))


def agent_proof(key: bytes, node: str, nonce_a: bytes, nonce_h: bytes) -> bytes:
    return mac(key, _transcript(b"agent", node, nonce_a, nonce_h))


def session_key(key: bytes, node: str, nonce_a: bytes, nonce_h: bytes) -> bytes:
    return mac(key, _transcript(b"session", node, nonce_a, nonce_h))


def challenge_frame(nonce_a: bytes) -> bytes:
    return Kind.CHALLENGE.value + nonce_a


def nonce_frame(nonce_h: bytes) -> bytes:
    return Kind.NONCE.value + nonce_h


def proof_frame(proof: bytes) -> bytes:
    return Kind.PROOF.value + proof


def finish_frame(proof: bytes) -> bytes:
    return Kind.FINISH.value + proof


def reauth_frame(reason: str) -> bytes:
    return Kind.REAUTH.value + reason.encode("ascii", "replace")[:MAX_REASON]


def kind_of(frame: bytes) -> Kind:
    """The frame's kind; :class:`ChannelError` for an empty, oversized or unknown frame."""
    if not frame:
        raise ChannelError("malformed", "empty frame")
    if len(frame) > MAX_FRAME:
        raise ChannelError("too_big", f"frame of {len(frame)} bytes (limit {MAX_FRAME})")
    kind = _KINDS.get(frame[:1])
    if kind is None:
        raise ChannelError("malformed", f"unknown frame kind {frame[:1]!r}")
    return kind


def _fixed(frame: bytes, size: int, what: str) -> bytes:
    """The body of a frame whose body is exactly ``size`` bytes."""
    if len(frame) != 1 + size:
        raise ChannelError("malformed", f"{what} of {len(frame)} bytes, not {1 + size}")
    return frame[1:]


def parse_challenge(frame: bytes) -> bytes:
    return _fixed(frame, NONCE_BYTES, "challenge")


def parse_nonce(frame: bytes) -> bytes:
    return _fixed(frame, NONCE_BYTES, "nonce")


def parse_proof(frame: bytes) -> bytes:
    return _fixed(frame, MAC_BYTES, "proof")


def parse_finish(frame: bytes) -> bytes:
    return _fixed(frame, MAC_BYTES, "finish")


def parse_reauth(frame: bytes) -> str:
    if len(frame) > 1 + MAX_REASON:
        raise ChannelError("malformed", f"reauth of {len(frame)} bytes")
    return frame[1:].decode("ascii", "replace")
