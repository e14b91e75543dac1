"""Standard Workload Format (Parallel Workloads Archive, v2.2).

18 whitespace-separated numeric fields per job (extra trailing columns tolerated), ``;`` header
lines; ``-1`` means unknown in every field. Fields used: 1 job number, 2 submit, 3 wait and 4 run
time (seconds after ``; UnixStartTime``), 5 allocated (else 8 requested) processors, 11 status.
How each is read (a wait of -1, jobs run in parts, processors to nodes by ``; MaxProcs`` /
``; MaxNodes``, the machine size) and what the notes count: docs/research.md (traces). Any other
negative value, a fractional processor count, a non-ASCII or non-finite number, or values beyond
``traces._text``'s limits are errors naming file and line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from traces._text import MAX_NODES, MAX_PROCS, MAX_TIME, line_error, parse_int, parse_number, read_text
from traces.jobs import JobTable, jobs_to_timeline
from traces.model import IdleTimeline

FORMAT = "swf"
N_FIELDS = 18
UNKNOWN = -1.0
PARTIAL = (2.0, 3.0, 4.0)  # status of a partial execution
HEADER_LIMITS = {"MaxNodes": (1, MAX_NODES), "MaxProcs": (1, MAX_PROCS), "UnixStartTime": (-MAX_TIME, MAX_TIME)}
FIELD_NAMES = ("job number", "submit time", "wait time", "run time", "allocated processors",
               "average CPU time", "used memory", "requested processors", "requested time",
               "requested memory", "status", "user", "group", "executable", "queue", "partition",
               "preceding job", "think time")


def read_swf(path: Path, nodes: int | None = None) -> IdleTimeline:
    return jobs_to_timeline(parse_swf(path), nodes)


@dataclass
class _Row:
    number: int  # line number
    text: str
    job: float
    submit: float
    wait: float
    run: float
    allocated: float
    requested: float
    status: float


@dataclass
class _Counts:
    no_wait: int = 0
    from_allocated: int = 0
    from_requested: int = 0
    over_machine: int = 0
    notes: list[str] = field(default_factory=list)


def parse_swf(path: Path) -> JobTable:
    header: dict[str, int] = {}
    rows: list[_Row] = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        text = line.strip()
        if not text:
            continue
        if text.startswith(";"):
            _header_line(path, number, text, header)
        else:
            rows.append(_parse_row(path, number, text))
    table = JobTable(path=path, format=FORMAT)
    per_node, machine, how = _processors_per_node(header)
    table.machine_size, table.machine_source = machine, how
    base = float(header.get("UnixStartTime", 0))
    partial_jobs = {r.job for r in rows if r.status in PARTIAL}
    counts = _Counts()
    for row in rows:
        if row.job in partial_jobs and row.status not in PARTIAL:
            table.skip("summary lines of jobs run in parts (the parts are replayed)")
            continue
        _add_job(path, row, base, per_node, machine, table, counts)
    table.notes.extend(_notes(header, per_node, counts))
    return table


def _header_line(path: Path, number: int, text: str, header: dict[str, int]) -> None:
    key, sep, value = text[1:].partition(":")
    key = key.strip()
    if not (sep and key in HEADER_LIMITS):
        return
    parsed = parse_int(value)
    if parsed is None:
        raise line_error(path, number, f"header {key} is not a plain integer", text)
    lo, hi = HEADER_LIMITS[key]
    if not lo <= parsed <= hi:
        raise line_error(path, number, f"header {key} {parsed} is outside [{lo:g}, {hi:g}]", text)
    header[key] = parsed


def _parse_row(path: Path, number: int, text: str) -> _Row:
    fields = text.split()
    if len(fields) < N_FIELDS:
        raise line_error(path, number, f"expected {N_FIELDS} fields, got {len(fields)}", text)
    values: list[float] = []
    for k, raw in enumerate(fields[:N_FIELDS]):
        value = parse_number(raw)
        if value is None:
            raise line_error(path, number, f"non-numeric field {k + 1} ({FIELD_NAMES[k]}) {raw[:40]!r}", text)
        values.append(value)
    row = _Row(number, text, values[0], values[1], values[2], values[3], values[4], values[7], values[10])
    for k, name in ((1, "submit time"), (2, "wait time"), (3, "run time")):
        _check_range(path, row, name, values[k], MAX_TIME)
    for k, name in ((4, "allocated processors"), (7, "requested processors")):
        _check_range(path, row, name, values[k], MAX_PROCS)
        if not values[k].is_integer():
            raise line_error(path, number, f"{name} {values[k]:g} is not a whole number", text)
    return row


def _check_range(path: Path, row: _Row, name: str, value: float, limit: float) -> None:
    if value < 0 and value != UNKNOWN:
        raise line_error(path, row.number, f"{name} {value:g} is negative (only -1, unknown, is allowed)", row.text)
    if value > limit:
        raise line_error(path, row.number, f"{name} {value:g} is beyond the limit {limit:g}", row.text)


def _processors_per_node(header: dict[str, int]) -> tuple[float, int | None, str]:
    """Processors per node, machine size in nodes (None: unknown), and where it comes from."""
    procs, nodes = header.get("MaxProcs"), header.get("MaxNodes")
    if nodes is not None:
        per_node = procs / nodes if procs is not None and procs > nodes else 1.0
        return per_node, nodes, "from the log header MaxNodes"
    if procs is not None:
        return 1.0, procs, "from the log header MaxProcs, no MaxNodes"
    return 1.0, None, ""


def _add_job(path: Path, row: _Row, base: float, per_node: float, machine: int | None, table: JobTable,
             counts: _Counts) -> None:
    if row.run <= 0:
        table.skip("no run time")
        return
    if row.submit == UNKNOWN:
        table.skip("unknown submit time")
        return
    wait = row.wait
    if wait == UNKNOWN:
        counts.no_wait += 1
        wait = 0.0
    procs = row.allocated
    if procs > 0:
        counts.from_allocated += 1
    else:
        procs = row.requested
        if procs <= 0:
            table.skip("unknown processor count")
            return
        counts.from_requested += 1
    size = math.ceil(procs / per_node - 1e-9)
    if size > (machine if machine is not None else MAX_NODES):
        if machine is None:
            raise line_error(path, row.number, f"{size} nodes, more than the {MAX_NODES} a machine may have", row.text)
        counts.over_machine += 1
        size = machine  # the excess could never run; the clamp is counted
    start = base + row.submit + wait
    table.add(start, start + row.run, size)


def _notes(header: dict[str, int], per_node: float, counts: _Counts) -> list[str]:
    notes: list[str] = []
    procs, nodes = header.get("MaxProcs"), header.get("MaxNodes")
    if per_node > 1:
        notes.append(
            f"processor fields are processors: MaxProcs {procs} / MaxNodes {nodes} = {per_node:g} per node; "
            f"job sizes rounded up to whole nodes"
        )
    elif procs is not None and procs == nodes:
        notes.append(f"MaxProcs = MaxNodes = {nodes}: processor fields count nodes")
    elif procs is not None and nodes is not None and procs < nodes:
        notes.append(f"MaxProcs {procs} < MaxNodes {nodes}: processor fields read as nodes")
    elif nodes is None or procs is None:
        notes.append("processor fields read as nodes (the header does not give both MaxProcs and MaxNodes)")
    if counts.no_wait:
        notes.append(f"{counts.no_wait} jobs with no wait time (-1): started at their submit time")
    notes.append(
        f"processors from field 5 (allocated) for {counts.from_allocated} jobs, "
        f"field 8 (requested) for {counts.from_requested}"
    )
    if counts.over_machine:
        notes.append(f"{counts.over_machine} jobs asked for more nodes than the machine has: cut to the machine")
    return notes

