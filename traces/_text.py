"""Reading log files as text: gzip by magic bytes, line numbers kept for errors."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

from traces.model import TraceError

GZIP_MAGIC = b"\x1f\x8b"


def read_text(path: Path) -> str:
    """The whole file as text; gzip is detected by content, not by name."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, expected a log file") from None
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise TraceError(f"{path}: broken gzip data: {exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def head_text(path: Path, n_bytes: int = 65536) -> str:
    """The first ``n_bytes`` of the (decompressed) file, for format detection."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
        opener = gzip.open if magic == GZIP_MAGIC else open
        with opener(path, "rb") as fh:
            raw = fh.read(n_bytes)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, expected a log file") from None
    except (OSError, EOFError) as exc:
        raise TraceError(f"{path}: unreadable: {exc}") from None
    return raw.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Lines:
    """The data lines of a file (comments and blanks removed) with their 1-based line numbers."""

    path: Path
    texts: list[str]
    numbers: list[int]

    def error(self, k: int, reason: str) -> TraceError:
        """An error naming file, line and content of data line ``k``."""
        text = self.texts[k]
        shown = text if len(text) <= 120 else text[:117] + "..."
        return TraceError(f"{self.path}:{self.numbers[k]}: {reason}: {shown!r}")


def data_lines(path: Path, comment: str = "#") -> Lines:
    """Non-blank lines not starting with ``comment``."""
    texts: list[str] = []
    numbers: list[int] = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith(comment):
            texts.append(stripped)
            numbers.append(number)
    return Lines(path, texts, numbers)


def empty_error(path: Path, what: str) -> TraceError:
    return TraceError(f"{path}: empty log: no {what}")
