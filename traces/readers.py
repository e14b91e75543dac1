"""``read(path)``: any supported log to an ``IdleTimeline``, the format detected by content."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

from traces._text import head_text
from traces.alcf import read_alcf
from traces.model import IdleTimeline, TraceError
from traces.nodes_csv import read_nodes_csv
from traces.sacct import read_sacct
from traces.swf import read_swf

FORMATS: tuple[str, ...] = ("nodes-csv", "swf", "sacct", "alcf")

_SWF_ROW = re.compile(r"^-?\d+(\.\d+)?(\s+-?\d+(\.\d+)?){17,}\s*$")


def _read_nodes(path: Path, nodes: int | None) -> IdleTimeline:
    if nodes is not None:
        raise TraceError(f"{path}: --nodes applies to job logs, not to a nodes-csv node-state log")
    return read_nodes_csv(path)


_READERS: dict[str, Callable[[Path, int | None], IdleTimeline]] = {
    "nodes-csv": _read_nodes,
    "swf": read_swf,
    "sacct": read_sacct,
    "alcf": read_alcf,
}


def read(path: str | os.PathLike[str], format: str | None = None, *, nodes: int | None = None) -> IdleTimeline:
    """Read a log (gzip or plain) into an idle-node timeline: ``format`` one of ``FORMATS`` (None:
    detected), ``nodes`` the machine size of job logs; ``TraceError`` names file and line."""
    p = Path(path)
    fmt = detect_format(p) if format is None else format.strip().lower()
    if fmt not in _READERS:
        raise TraceError(f"{p}: unknown format {format!r}; supported formats: {', '.join(FORMATS)}")
    try:
        return _READERS[fmt](p, nodes)
    except TraceError:
        raise
    except (ValueError, OverflowError, MemoryError, RecursionError, UnicodeError) as exc:
        # Every reader checks its input line by line; this is the last guard, so that
        # a case they miss is still an error naming the file, never a traceback.
        raise TraceError(f"{p}: cannot read as {fmt}: {type(exc).__name__}: {exc}") from exc


def detect_format(path: Path) -> str:
    """The format of ``path`` from its first meaningful line; TraceError when unknown."""
    first = _first_line(path)
    if first is None:
        raise TraceError(f"{path}: empty log: nothing but blank or comment lines")
    if first.startswith(";") or _SWF_ROW.match(first):
        return "swf"
    cells = {c.strip().strip('"').lower() for c in re.split(r"[|,]", first)}
    if {"time", "node", "idle"} <= cells:
        return "nodes-csv"
    if "start_timestamp" in cells:
        return "alcf"
    if {"jobid", "start", "end"} <= cells:
        return "sacct"
    shown = first if len(first) <= 80 else first[:77] + "..."
    raise TraceError(
        f"{path}: cannot tell the log format from its first line {shown!r}; "
        f"supported formats: {', '.join(FORMATS)} (force one with --format)"
    )


def _first_line(path: Path) -> str | None:
    for line in head_text(path).splitlines():
        text = line.strip()
        if text and not text.startswith("#"):
            return text
    return None
