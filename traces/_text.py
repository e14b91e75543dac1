"""Reading log files as text: gzip by magic bytes, line numbers kept for errors.

Also the limits every reader enforces, so that no input can make a reader
loop, exhaust memory or accept nonsense: numbers are plain ASCII decimals
(Python's ``float`` and ``int`` also take ``1_000``, fullwidth digits, ``nan``
and ``inf``), times and node counts have ranges, and the decompressed text
has a size limit.
"""

from __future__ import annotations

import gzip
import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from traces.model import TraceError

GZIP_MAGIC = b"\x1f\x8b"
MAX_TEXT_BYTES = 1 << 30  # decompressed size of one log
MAX_NODES = 1_000_000  # machine size (the largest machines have ~160k nodes)
MAX_PROCS = 1_000_000_000  # processors of one SWF job or machine
MAX_TIME = 1e11  # |time| in seconds: unix time up to the year 5138, or a relative time
MAX_NAMES = 10_000_000  # node names expanded from all host lists of one log

_INT = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")


def parse_int(text: str) -> int | None:
    """A plain ASCII integer (``-12``, ``+3``); None for anything else, ``1_000`` and ``１２`` included."""
    text = text.strip()
    if len(text) > 40 or not _INT.fullmatch(text):
        return None
    return int(text)


def parse_number(text: str) -> float | None:
    """A finite plain ASCII decimal (``12``, ``-1.5``, ``3e4``); None for anything else (nan, inf, ``1_0``)."""
    text = text.strip()
    if len(text) > 60 or not _NUMBER.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def read_text(path: Path) -> str:
    """The whole file as text; gzip is detected by content, not by name."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_TEXT_BYTES + 1)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, expected a log file") from None
    except OSError as exc:
        raise TraceError(f"{path}: unreadable: {exc}") from None
    if raw[:2] == GZIP_MAGIC:
        raw = _gunzip(path, raw)
    if len(raw) > MAX_TEXT_BYTES:
        raise TraceError(f"{path}: larger than the {MAX_TEXT_BYTES >> 20} MiB a log may have")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _gunzip(path: Path, raw: bytes) -> bytes:
    """Decompress every gzip member, refusing more than ``MAX_TEXT_BYTES`` (a gzip bomb)."""
    out: list[bytes] = []
    size = 0
    while raw:
        d = zlib.decompressobj(wbits=31)
        try:
            chunk = d.decompress(raw, MAX_TEXT_BYTES + 1 - size)
        except zlib.error as exc:
            raise TraceError(f"{path}: broken gzip data: {exc}") from None
        size += len(chunk)
        out.append(chunk)
        if size > MAX_TEXT_BYTES:
            raise TraceError(f"{path}: decompresses to more than the {MAX_TEXT_BYTES >> 20} MiB a log may have")
        if not d.eof:
            raise TraceError(f"{path}: broken gzip data: truncated")
        raw = d.unused_data
        if raw and raw[:2] != GZIP_MAGIC:
            break  # trailing garbage after the last member, as gzip(1) tolerates with a warning
    return b"".join(out)


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
    except (OSError, EOFError, zlib.error) as exc:
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
        return line_error(self.path, self.numbers[k], reason, self.texts[k])


def line_error(path: Path, number: int, reason: str, text: str) -> TraceError:
    """An error naming file, line number, reason and (the start of) the line."""
    shown = text if len(text) <= 120 else text[:117] + "..."
    return TraceError(f"{path}:{number}: {reason}: {shown!r}")


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
