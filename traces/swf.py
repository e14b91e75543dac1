"""Standard Workload Format (Parallel Workloads Archive, v2.2).

18 whitespace-separated fields per job (extra trailing columns tolerated);
``;`` header lines. Used here: 2 submit time, 3 wait time, 4 run time,
5 allocated processors (8 requested processors when -1). Times are seconds
relative to ``; UnixStartTime``. Processors become nodes with
``; MaxProcs`` / ``; MaxNodes`` processors per node; ``; MaxNodes`` (else
``; MaxProcs``) is the machine size. Jobs with no run time (cancelled before
starting) are skipped.
"""

from __future__ import annotations

import math
from pathlib import Path

from traces._text import read_text
from traces.jobs import JobTable, jobs_to_timeline
from traces.model import IdleTimeline, TraceError

FORMAT = "swf"
N_FIELDS = 18
HEADER_INTS = ("MaxNodes", "MaxProcs", "UnixStartTime")


def read_swf(path: Path, nodes: int | None = None) -> IdleTimeline:
    return jobs_to_timeline(parse_swf(path), nodes)


def parse_swf(path: Path) -> JobTable:
    header: dict[str, int] = {}
    rows: list[tuple[int, list[str]]] = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        text = line.strip()
        if not text:
            continue
        if text.startswith(";"):
            _header_line(path, number, text, header)
        else:
            rows.append((number, text.split()))
    table = JobTable(path=path, format=FORMAT)
    ppn = _procs_per_node(header)
    table.machine_size = header.get("MaxNodes", header.get("MaxProcs"))
    base = float(header.get("UnixStartTime", 0))
    for number, fields in rows:
        _add_job(path, number, fields, base, ppn, table)
    return table


def _header_line(path: Path, number: int, text: str, header: dict[str, int]) -> None:
    key, sep, value = text[1:].partition(":")
    key = key.strip()
    if sep and key in HEADER_INTS:
        try:
            header[key] = int(value.strip())
        except ValueError:
            raise TraceError(f"{path}:{number}: header {key} is not an integer: {text!r}") from None


def _procs_per_node(header: dict[str, int]) -> int:
    procs, nodes = header.get("MaxProcs"), header.get("MaxNodes")
    if procs and nodes and procs > nodes:
        return -(-procs // nodes)  # ceil: the largest job fits the machine
    return 1


def _add_job(path: Path, number: int, fields: list[str], base: float, ppn: int, table: JobTable) -> None:
    if len(fields) < N_FIELDS:
        raise TraceError(
            f"{path}:{number}: expected {N_FIELDS} fields, got {len(fields)}: {' '.join(fields)!r}"
        )
    try:
        values = [float(f) for f in fields[:N_FIELDS]]
    except ValueError:
        raise TraceError(f"{path}:{number}: non-numeric field: {' '.join(fields)!r}") from None
    submit, wait, run = values[1], values[2], values[3]
    procs, requested = int(values[4]), int(values[7])
    if run <= 0:
        table.skip("no run time")
        return
    if submit < 0 or wait < 0:
        table.skip("unknown submit or wait time")
        return
    if procs <= 0:
        procs = requested
    if procs <= 0:
        table.skip("unknown processor count")
        return
    start = base + submit + wait
    table.add(start, start + run, math.ceil(procs / ppn))
