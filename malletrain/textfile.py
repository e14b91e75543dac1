"""Bytes of a user's file -> text, bounded and UTF-8, with errors that name the file (job files, config)."""

from __future__ import annotations

from pathlib import Path


def decode_text(path: Path, data: bytes, max_bytes: int, what: str, error: type[Exception]) -> str:
    """``data`` as text; too big or not UTF-8 raises ``error`` naming ``path`` (``what``: e.g. "job file")."""
    if len(data) > max_bytes:
        raise error(f"{path}: {what} is {len(data)} bytes; at most {max_bytes}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
