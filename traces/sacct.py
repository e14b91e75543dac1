"""Slurm accounting: ``sacct -P`` output (``|``) or a CSV export (``,``).

A header row names the columns (any order, case-insensitive). Needed:
``JobID``, ``Start``, ``End`` and ``NNodes`` (or ``AllocNodes``); used when
present: ``NodeList`` (Slurm host lists such as ``r1i0n[1-3,7]``), ``State``.
Times are unix seconds or ISO 8601 (``2024-01-02T03:04:05``, read as UTC);
``Unknown``, ``None`` or empty mean unset. Job steps (``123.batch``, ``123.0``)
are skipped, as they run on their job's nodes; so are jobs that never started
or have no run time. A job with no end is busy until the end of the log.
"""

from __future__ import annotations

import csv
import io
import re
from datetime import datetime, timezone
from pathlib import Path

from traces._text import Lines, data_lines, empty_error
from traces.jobs import JobTable, jobs_to_timeline
from traces.model import IdleTimeline

FORMAT = "sacct"
UNSET = {"", "unknown", "none", "n/a"}
REQUIRED = ("jobid", "start", "end")
NODE_COLUMNS = ("nnodes", "allocnodes")


def read_sacct(path: Path, nodes: int | None = None) -> IdleTimeline:
    return jobs_to_timeline(parse_sacct(path), nodes)


def parse_sacct(path: Path) -> JobTable:
    lines = data_lines(path)
    if not lines.texts:
        raise empty_error(path, "header or jobs")
    delimiter = "|" if "|" in lines.texts[0] else ","
    rows = list(csv.reader(io.StringIO("\n".join(lines.texts)), delimiter=delimiter))
    header = [c.strip().lower() for c in rows[0]]
    col = _columns(lines, header)
    if len(rows) == 1:
        raise empty_error(path, "jobs after the header")
    table = JobTable(path=path, format=FORMAT)
    for k in range(1, len(rows)):
        _add_job(lines, k, rows[k], len(header), col, table)
    return table


def _columns(lines: Lines, header: list[str]) -> dict[str, int]:
    missing = [c for c in REQUIRED if c not in header]
    size_col = next((c for c in NODE_COLUMNS if c in header), None)
    if missing or size_col is None:
        need = [c for c in missing] + ([] if size_col else ["NNodes or AllocNodes"])
        raise lines.error(0, f"sacct header lacks column(s) {', '.join(need)}")
    col = {c: header.index(c) for c in REQUIRED}
    col["nnodes"] = header.index(size_col)
    for optional in ("nodelist", "state"):
        if optional in header:
            col[optional] = header.index(optional)
    return col


def _add_job(lines: Lines, k: int, row: list[str], width: int, col: dict[str, int], table: JobTable) -> None:
    if len(row) < width:
        raise lines.error(k, f"expected {width} fields, got {len(row)}")
    if "." in row[col["jobid"]]:
        table.skip("job steps")
        return
    start = parse_time(row[col["start"]].strip(), lines, k)
    end = parse_time(row[col["end"]].strip(), lines, k)
    if start is None:
        table.skip("never started")
        return
    size_text = row[col["nnodes"]].strip()
    try:
        size = int(size_text)
    except ValueError:
        raise lines.error(k, f"node count {size_text!r} is not an integer") from None
    if end is None:
        end = float("inf")
    if end <= start or size <= 0:
        table.skip("no run time")
        return
    names = expand_hostlist(row[col["nodelist"]]) if "nodelist" in col else None
    table.add(start, end, size, names)


ISO = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?$")


def parse_time(text: str, lines: Lines, k: int) -> float | None:
    """Unix seconds or ISO 8601 (naive times read as UTC); None when unset."""
    if text.lower() in UNSET:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    if ISO.match(text):
        return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise lines.error(k, f"time {text!r} is neither unix seconds nor ISO 8601") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def expand_hostlist(text: str) -> tuple[str, ...] | None:
    """Slurm host list to names: ``a[01-03,7],b2`` -> a01 a02 a03 a7 b2; None when unset."""
    text = text.strip()
    if text.lower() in UNSET or text.lower().startswith("none"):
        return None
    names: list[str] = []
    for item in _split_top(text):
        names.extend(_expand_item(item))
    return tuple(names)


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _expand_item(item: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if m is None:
        return [item]
    head, tail = item[: m.start()], item[m.end():]
    out: list[str] = []
    for piece in m.group(1).split(","):
        lo, dash, hi = piece.partition("-")
        if not dash:
            values = [lo]
        elif lo.isdigit() and hi.isdigit():
            values = [str(v).zfill(len(lo)) for v in range(int(lo), int(hi) + 1)]
        else:
            values = [piece]
        for v in values:
            out.extend(_expand_item(head + v + tail))
    return out
