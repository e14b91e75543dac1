"""Slurm accounting: ``sacct -P`` output (``|``) or a CSV export (``,``).

A header row names the columns (any order, case-insensitive). Needed:
``JobID``, ``Start``, ``End`` and ``NNodes`` (or ``AllocNodes``); used when
present: ``NodeList`` (Slurm host lists such as ``r1i0n[1-3,7]``), ``State``.
Times are unix seconds or ISO 8601 (``2024-01-02T03:04:05``, read as UTC);
``Unknown``, ``None`` or empty mean unset. Job steps (``123.batch``, ``123.0``)
are skipped, as they run on their job's nodes; so are jobs that never started
or have no run time. A job with no end is busy until the end of the log.

Each line is parsed on its own (a quote left open is an error of that line);
numbers are plain ASCII; a host list expands to no more names than its job
has nodes (else its names are ignored), and to at most ``MAX_NAMES`` names over
the whole log, so a line of a few bytes cannot ask for unbounded work.
"""

from __future__ import annotations

import csv
import re
from datetime import datetime, timezone
from pathlib import Path

from hostlist import HostListError, expand_hostlist
from traces._text import MAX_NAMES, MAX_NODES, MAX_TIME, Lines, data_lines, empty_error, parse_int, parse_number
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
    header = [c.strip().lower() for c in split_row(lines, 0, delimiter)]
    col = _columns(lines, header)
    if len(lines.texts) == 1:
        raise empty_error(path, "jobs after the header")
    table = JobTable(path=path, format=FORMAT)
    budget = NameBudget()
    for k in range(1, len(lines.texts)):
        _add_job(lines, k, split_row(lines, k, delimiter), len(header), col, table, budget)
    return table


def split_row(lines: Lines, k: int, delimiter: str = ",") -> list[str]:
    """The fields of data line ``k`` (CSV quoting, one line only)."""
    try:
        return next(csv.reader([lines.texts[k]], delimiter=delimiter, strict=True), [])
    except csv.Error as exc:
        raise lines.error(k, f"bad CSV: {exc}") from None


class NameBudget:
    """Names expanded from host lists so far; an error past ``MAX_NAMES``."""

    def __init__(self) -> None:
        self.used = 0

    def take(self, lines: Lines, k: int, n: int) -> None:
        self.used += n
        if self.used > MAX_NAMES:
            raise lines.error(k, f"host lists name more than {MAX_NAMES} nodes in total")


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


def _add_job(lines: Lines, k: int, row: list[str], width: int, col: dict[str, int], table: JobTable,
             budget: NameBudget) -> None:
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
    size = node_count(lines, k, row[col["nnodes"]], "node count")
    if end is None:
        end = float("inf")
    if end <= start or size <= 0:
        table.skip("no run time")
        return
    names = job_names(lines, k, row[col["nodelist"]], size, budget) if "nodelist" in col else None
    table.add(start, end, size, names)


def node_count(lines: Lines, k: int, text: str, what: str) -> int:
    """A whole number of nodes in [0, MAX_NODES]."""
    size = parse_int(text)
    if size is None:
        raise lines.error(k, f"{what} {text.strip()[:40]!r} is not an integer")
    if not 0 <= size <= MAX_NODES:
        raise lines.error(k, f"{what} {size} is outside [0, {MAX_NODES}]")
    return size


def job_names(lines: Lines, k: int, text: str, size: int, budget: NameBudget) -> tuple[str, ...] | None:
    """The node names of a host list, or None when unset or not naming ``size`` nodes."""
    try:
        names = expand_hostlist(text, limit=size)
    except HostListError as exc:
        raise lines.error(k, f"bad host list: {exc}") from None
    if names is not None:
        budget.take(lines, k, len(names))
    return names


ISO_ZONED = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?$", re.ASCII)


def parse_time(text: str, lines: Lines, k: int) -> float | None:
    """Unix seconds or ISO 8601 (naive times read as UTC); None when unset."""
    if text.lower() in UNSET:
        return None
    value = parse_number(text)
    if value is None:
        value = _iso_seconds(text, lines, k)
    if abs(value) > MAX_TIME:
        raise lines.error(k, f"time {text[:40]!r} is beyond {MAX_TIME:g} s")
    return value


def _iso_seconds(text: str, lines: Lines, k: int) -> float:
    if not ISO_ZONED.match(text):
        raise lines.error(k, f"time {text[:40]!r} is neither unix seconds nor ISO 8601")
    try:
        stamp = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError as exc:
        raise lines.error(k, f"time {text!r} is not a valid date: {exc}") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()
