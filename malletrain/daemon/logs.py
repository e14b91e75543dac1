"""The daemon's log: plain text (default) or JSON lines (``[log] format = "json"``).

A JSON line is one object (``time`` UTC ISO 8601 with milliseconds, ``level``, ``logger``,
``message``, and ``job``/``node``/``pilot``/``worker`` when code names them with
``extra=about(job=...)``); a traceback is one string in ``exc``, so a line is always one line. The
same warning (logger, level, template) is written once per ``REPEAT_WINDOW_S`` (:class:`RepeatFilter`),
so a failing disk costs one line a window, not ten a second."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Any, Callable

FIELDS = ("job", "node", "pilot", "worker")
"""Record attributes carried into every line that has them."""

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def about(job: str = "", node: str = "", pilot: str = "", worker: str = "") -> dict[str, str]:
    """``extra=`` for a log call about a job, node, pilot or worker (empty ones left out)."""
    given = {"job": job, "node": node, "pilot": pilot, "worker": worker}
    return {k: str(v) for k, v in given.items() if v}


def _fields(record: logging.LogRecord) -> dict[str, str]:
    out = {}
    for key in FIELDS:
        value = getattr(record, key, None)
        if value:
            out[key] = str(value)
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, then job/node/pilot/worker, exc."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"time": _iso(record.created), "level": record.levelname, "logger": record.name,
                                "message": record.getMessage()}
        line.update(_fields(record))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """The usual text line, with ``[job=... node=...]`` appended when the record names one."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        text = super().formatMessage(record)
        named = _fields(record)
        if named:
            text += " [" + " ".join(f"{k}={v}" for k, v in named.items()) + "]"
        return text


def _iso(created: float) -> str:
    secs = int(created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{int((created - secs) * 1000):03d}Z"


REPEAT_WINDOW_S = 30.0
"""A repeated warning or error is written at most once per this many seconds."""
REPEAT_KEYS_MAX = 1024
"""Distinct repeating messages remembered (the oldest is forgotten first)."""


class RepeatFilter(logging.Filter):
    """Lets the first of a repeating warning or error (same logger, level and template) through, then one
    per ``window_s`` saying how many were held back; INFO and below always pass."""

    def __init__(self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}  # key -> (last written, held back)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self.window_s:
            self._seen[key] = (last[0], last[1] + 1)
            return False
        if last is not None and last[1]:
            record.msg = f"{record.msg} ({last[1]} more like this in {now - last[0]:.0f} s held back)"
        self._seen.pop(key, None)
        self._seen[key] = (now, 0)
        if len(self._seen) > REPEAT_KEYS_MAX:
            del self._seen[next(iter(self._seen))]
        return True


def make_formatter(fmt: str) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return TextFormatter()
    raise ValueError(f"log format must be text or json, got {fmt!r}")


def setup_logging(fmt: str = "text", level: str = "info", stream: IO[str] | None = None) -> logging.Handler:
    """Send the root logger to ``stream`` in ``fmt``, replacing an earlier call's handler; returns it."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_malletrain", False):
            root.removeHandler(h)
            h.close()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(make_formatter(fmt))
    handler.addFilter(RepeatFilter())
    handler._malletrain = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(LEVELS[level])
    return handler
