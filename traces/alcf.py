"""ALCF job logs (the "DIM_JOB_COMPOSITE" CSV published for Polaris, Theta, Aurora).

Columns used (case-insensitive, any order): ``START_TIMESTAMP``,
``END_TIMESTAMP`` (or ``RUNTIME_SECONDS`` after the start), ``NODES_USED``
(``NODES_REQUESTED`` when unset) and ``LOCATION`` when present: the job's
node names, comma-separated (``x3005c0s19b1n0,...``; numeric ranges such as
``3832-3835`` and Slurm-style brackets are expanded). ALCF cuts LOCATION short
for large jobs; a LOCATION that does not name exactly as many distinct nodes
as the job used is ignored and the job gets free nodes instead. Timestamps
are ISO 8601 (naive read as UTC) or unix seconds.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from traces._text import Lines, data_lines, empty_error
from traces.jobs import JobTable, jobs_to_timeline
from traces.model import IdleTimeline
from traces.sacct import UNSET, expand_hostlist, parse_time

FORMAT = "alcf"
RANGE = re.compile(r"^(\d+)-(\d+)$")


def read_alcf(path: Path, nodes: int | None = None) -> IdleTimeline:
    return jobs_to_timeline(parse_alcf(path), nodes)


def parse_alcf(path: Path) -> JobTable:
    lines = data_lines(path)
    if not lines.texts:
        raise empty_error(path, "header or jobs")
    rows = list(csv.reader(io.StringIO("\n".join(lines.texts))))
    header = [c.strip().lower() for c in rows[0]]
    need = [c for c in ("start_timestamp", "nodes_used") if c not in header]
    if "end_timestamp" not in header and "runtime_seconds" not in header:
        need.append("end_timestamp or runtime_seconds")
    if need:
        raise lines.error(0, f"ALCF header lacks column(s) {', '.join(c.upper() for c in need)}")
    col = {c: header.index(c) for c in header}
    if len(rows) == 1:
        raise empty_error(path, "jobs after the header")
    table = JobTable(path=path, format=FORMAT)
    for k in range(1, len(rows)):
        _add_job(lines, k, rows[k], len(header), col, table)
    return table


def _add_job(lines: Lines, k: int, row: list[str], width: int, col: dict[str, int], table: JobTable) -> None:
    if len(row) != width:
        raise lines.error(k, f"expected {width} fields, got {len(row)}")
    start = parse_time(row[col["start_timestamp"]].strip(), lines, k)
    if start is None:
        table.skip("never started")
        return
    end = parse_time(row[col["end_timestamp"]].strip(), lines, k) if "end_timestamp" in col else None
    if end is None and "runtime_seconds" in col:
        runtime = _number(lines, k, row[col["runtime_seconds"]], "RUNTIME_SECONDS")
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
    names = _location(row[col["location"]]) if "location" in col else None
    table.add(start, end, size, names)


def _number(lines: Lines, k: int, text: str, column: str) -> float | None:
    text = text.strip()
    if text.lower() in UNSET:
        return None
    try:
        return float(text)
    except ValueError:
        raise lines.error(k, f"{column} {text!r} is not a number") from None


def _size(lines: Lines, k: int, row: list[str], col: dict[str, int]) -> int | None:
    for column in ("nodes_used", "nodes_requested"):
        if column in col:
            value = _number(lines, k, row[col[column]], column.upper())
            if value is not None and value > 0:
                if not value.is_integer():
                    raise lines.error(k, f"{column.upper()} {value} is not a whole number of nodes")
                return int(value)
    return None


def _location(text: str) -> tuple[str, ...] | None:
    names = expand_hostlist(text)
    if names is None:
        return None
    out: list[str] = []
    for name in names:
        m = RANGE.match(name)
        if m:
            lo, hi = m.group(1), m.group(2)
            out.extend(str(v).zfill(len(lo)) for v in range(int(lo), int(hi) + 1))
        else:
            out.append(name)
    return tuple(out)
