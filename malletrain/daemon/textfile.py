"""Bytes of a user's file -> text, bounded and UTF-8, with errors that name the file (job files, config), and
a bad value of it cut short for such an error."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any


def read_user_file(path: Path, max_bytes: int, what: str, error: type[Exception]) -> bytes:
    """The bytes of ``path``, a regular file (never waits on a FIFO, never reads a device), at most
    ``max_bytes`` + 1 of them (enough for :func:`decode_text` to say it is too big); ``error`` names it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise error(f"{path}: is a directory, not a {what}")
        if not stat.S_ISREG(mode):
            raise error(f"{path}: is not a regular file (a device, FIFO or socket), not a {what}")
        try:
            return fh.read(max_bytes + 1)
        except OSError as exc:
            raise error(f"{path}: cannot read: {exc.strerror or exc}") from None


def decode_text(path: Path, data: bytes, max_bytes: int, what: str, error: type[Exception]) -> str:
    """``data`` as text; too big or not UTF-8 raises ``error`` naming ``path`` (``what``: e.g. "job file")."""
    if len(data) > max_bytes:
        raise error(f"{path}: {what} is {len(data)} bytes; at most {max_bytes}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr`` of a bad value, cut so an error message stays one readable line."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # e.g. an int with too many digits to print
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
