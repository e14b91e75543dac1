"""ALCF job logs (the "DIM_JOB_COMPOSITE" CSV published for Polaris, Theta, Aurora).

Columns (case-insensitive, any order): ``START_TIMESTAMP``, ``END_TIMESTAMP`` (or
``RUNTIME_SECONDS``), ``NODES_USED`` (else ``NODES_REQUESTED``) and ``LOCATION`` if present: node
names, comma-separated, ranges (``3832-3835``) and brackets expanded only as far as the job's node
count. ALCF cuts LOCATION short for large jobs: one that does not name exactly the job's node count
is ignored. Timestamps are ISO 8601 (naive: UTC) or unix seconds; node counts at most ``MAX_NODES``.
"""

from __future__ import annotations

import re
from pathlib import Path

from traces._text import MAX_NODES, MAX_TIME, Lines, data_lines, empty_error, parse_number
from traces.jobs import JobTable, jobs_to_timeline
from traces.model import IdleTimeline
from traces.sacct import UNSET, HostListError, NameBudget, expand_hostlist, parse_time, split_row

FORMAT = "alcf"
RANGE = re.compile(r"^([0-9]{1,9})-([0-9]{1,9})$")


def read_alcf(path: Path, nodes: int | None = None) -> IdleTimeline:
    return jobs_to_timeline(parse_alcf(path), nodes)


def parse_alcf(path: Path) -> JobTable:
    lines = data_lines(path)
    if not lines.texts:
        raise empty_error(path, "header or jobs")
    header = [c.strip().lower() for c in split_row(lines, 0)]
    need = [c for c in ("start_timestamp", "nodes_used") if c not in header]
    if "end_timestamp" not in header and "runtime_seconds" not in header:
        need.append("end_timestamp or runtime_seconds")
    if need:
        raise lines.error(0, f"ALCF header lacks column(s) {', '.join(c.upper() for c in need)}")
    col = {c: header.index(c) for c in header}
    if len(lines.texts) == 1:
        raise empty_error(path, "jobs after the header")
    table = JobTable(path=path, format=FORMAT)
    budget = NameBudget()
    for k in range(1, len(lines.texts)):
        _add_job(lines, k, split_row(lines, k), len(header), col, table, budget)
    return table


def _add_job(lines: Lines, k: int, row: list[str], width: int, col: dict[str, int], table: JobTable,
             budget: NameBudget) -> None:
    if len(row) != width:
        raise lines.error(k, f"expected {width} fields, got {len(row)}")
    start = parse_time(row[col["start_timestamp"]].strip(), lines, k)
    if start is None:
        table.skip("never started")
        return
    end = parse_time(row[col["end_timestamp"]].strip(), lines, k) if "end_timestamp" in col else None
    if end is None and "runtime_seconds" in col:
        runtime = _number(lines, k, row[col["runtime_seconds"]], "RUNTIME_SECONDS")
        if runtime is not None and not 0 <= runtime <= MAX_TIME:
            raise lines.error(k, f"RUNTIME_SECONDS {runtime:g} is outside [0, {MAX_TIME:g}]")
        end = None if runtime is None else start + runtime
    if end is None:
        end = float("inf")
    size = _size(lines, k, row, col)
    if size is None or size <= 0:
        table.skip("unknown node count")
        return
    if end <= start:
        table.skip("no run time")
        return
    names = _location(lines, k, row[col["location"]], size) if "location" in col else None
    if names is not None:
        budget.take(lines, k, len(names))
    table.add(start, end, size, names)


def _number(lines: Lines, k: int, text: str, column: str) -> float | None:
    text = text.strip()
    if text.lower() in UNSET:
        return None
    value = parse_number(text)
    if value is None:
        raise lines.error(k, f"{column} {text[:40]!r} is not a number")
    return value


def _size(lines: Lines, k: int, row: list[str], col: dict[str, int]) -> int | None:
    for column in ("nodes_used", "nodes_requested"):
        if column in col:
            value = _number(lines, k, row[col[column]], column.upper())
            if value is not None and value > 0:
                if not value.is_integer():
                    raise lines.error(k, f"{column.upper()} {value} is not a whole number of nodes")
                if value > MAX_NODES:
                    raise lines.error(k, f"{column.upper()} {value:g} is more than {MAX_NODES} nodes")
                return int(value)
    return None


def _location(lines: Lines, k: int, text: str, size: int) -> tuple[str, ...] | None:
    """The job's node names; None when unset or not naming exactly ``size`` nodes (cut short)."""
    try:
        names = expand_hostlist(text, limit=size)
    except HostListError as exc:
        raise lines.error(k, f"bad LOCATION: {exc}") from None
    if names is None:
        return None
    ranges = [RANGE.match(name) for name in names]
    total = sum(int(m.group(2)) - int(m.group(1)) + 1 if m else 1 for m in ranges)
    if total > size or any(m and int(m.group(2)) < int(m.group(1)) for m in ranges):
        return None
    out: list[str] = []
    for name, m in zip(names, ranges):
        if m:
            lo, hi = m.group(1), m.group(2)
            out.extend(str(v).zfill(len(lo)) for v in range(int(lo), int(hi) + 1))
        else:
            out.append(name)
    return tuple(out)
