"""Parsers on small hand-written logs: sacct -P, SWF, ALCF CSV; bad and empty input."""

from __future__ import annotations

import gzip
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

import traces
from traces import TraceError
from traces.sacct import expand_hostlist
from traces_helpers import assert_alternating


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


SACCT_P = """\
JobID|JobName|Partition|NNodes|Start|End|State|NodeList
100|train|standard|2|2024-01-02T10:00:00|2024-01-02T11:00:00|COMPLETED|r1i0n[1-2]
100.batch|batch||1|2024-01-02T10:00:00|2024-01-02T11:00:00|COMPLETED|r1i0n1
100.extern|extern||2|2024-01-02T10:00:00|2024-01-02T11:00:00|COMPLETED|r1i0n[1-2]
101|sim|standard|1|2024-01-02T10:30:00|Unknown|RUNNING|r1i0n3
102|big|standard|4|Unknown|Unknown|PENDING|None assigned
103|cx|standard|1|2024-01-02T10:45:00|2024-01-02T10:45:00|CANCELLED by 5|r1i0n4
104|late|standard|1|2024-01-02T11:00:00|2024-01-02T12:00:00|COMPLETED|r1i0n1
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_sacct_pipe_output(tmp_path: Path) -> None:
    tl = traces.read(write(tmp_path, "jobs.txt", SACCT_P))
    assert tl.format == "sacct"
    assert tl.nodes == ("r1i0n1", "r1i0n2", "r1i0n3")  # NodeList names; machine = peak busy = 3
    assert (tl.start, tl.end) == (utc("2024-01-02T10:00:00"), utc("2024-01-02T12:00:00"))
    assert tl.initial_idle == {"r1i0n3"}
    assert tl.idle_at(utc("2024-01-02T10:40:00")) == frozenset()
    assert tl.idle_at(utc("2024-01-02T11:30:00")) == {"r1i0n2"}  # 104 took r1i0n1 as 100 left it
    assert tl.idle_at(tl.end - 1) == {"r1i0n2"}  # the running job 101 holds r1i0n3 until the end
    assert "skipped 2 jobs: job steps" in tl.notes
    assert "skipped 1 jobs: never started" in tl.notes
    assert "skipped 1 jobs: no run time" in tl.notes
    assert "1 jobs without an end time: busy until the end of the log" in tl.notes
    assert_alternating(tl)


def test_sacct_machine_size_adds_synthetic_nodes(tmp_path: Path) -> None:
    tl = traces.read(write(tmp_path, "jobs.txt", SACCT_P), "sacct", nodes=5)
    assert tl.nodes == ("n0000", "n0001", "r1i0n1", "r1i0n2", "r1i0n3")
    assert tl.initial_idle == {"n0000", "n0001", "r1i0n3"}
    with pytest.raises(TraceError, match="names 3 distinct nodes, more than the machine size 2"):
        traces.read(tmp_path / "jobs.txt", nodes=2)


def test_sacct_csv_export_without_nodelist(tmp_path: Path) -> None:
    text = "JobID,NCPUS,NNodes,Submit,Start,End,ElapsedRaw,State\n" \
           "1,32,2,0,100,200,100,COMPLETED\n2,32,1,0,150,300,150,COMPLETED\n"
    tl = traces.read(write(tmp_path, "x.csv", text))
    assert tl.nodes == ("n0000", "n0001", "n0002")
    assert tl.idle_node_seconds() == pytest.approx(3 * 200 - (2 * 100 + 150))


def test_expand_hostlist() -> None:
    assert expand_hostlist("r1i0n[1-3,07],r2i1n4") == ("r1i0n1", "r1i0n2", "r1i0n3", "r1i0n07", "r2i1n4")
    assert expand_hostlist("c[01-02]s[8-9]") == ("c01s8", "c01s9", "c02s8", "c02s9")
    assert expand_hostlist("None assigned") is None
    assert expand_hostlist("") is None


SWF = """\
; Version: 2.2
; UnixStartTime: 1000
; MaxNodes: 4
; MaxProcs: 16
    1  0  10  100  8  -1 -1  8  200 -1 1 1 1 -1 1 -1 -1 -1
    2  5   5   50  4  -1 -1  4  100 -1 1 1 1 -1 1 -1 -1 -1 77 88
    3 20  -1   -1 -1  -1 -1 16  100 -1 5 1 1 -1 1 -1 -1 -1
    4 30   0    0 16  -1 -1 16  100 -1 5 1 1 -1 1 -1 -1 -1
    5 50  70   30 -1  -1 -1  5  100 -1 1 1 1 -1 1 -1 -1 -1
"""


def test_swf_headers_and_columns(tmp_path: Path) -> None:
    tl = traces.read(write(tmp_path, "log.swf", SWF))
    assert tl.format == "swf"
    assert tl.nodes == ("n0000", "n0001", "n0002", "n0003")  # ; MaxNodes
    assert (tl.start, tl.end) == (1010, 1150)  # ; UnixStartTime + submit + wait
    assert tl.initial_idle == {"n0003"}  # 8 procs = 2 nodes at 4 procs/node; 4 procs = 1 node
    t, c = tl.idle_counts()
    assert t.tolist() == [1010, 1060, 1110, 1110, 1120, 1120, 1150, 1150]
    assert c.tolist() == [1, 2, 3, 4, 3, 2, 3, 4]  # job 5: requested 5 procs -> 2 nodes
    assert tl.idle_node_seconds() == pytest.approx(50 * 1 + 50 * 2 + 10 * 4 + 30 * 2)
    assert "skipped 2 jobs: no run time" in tl.notes
    assert_alternating(tl)


def test_gzip_detected_by_content(tmp_path: Path) -> None:
    path = tmp_path / "log.dat"
    path.write_bytes(gzip.compress(SWF.encode()))
    assert traces.read(path).nodes == traces.read(write(tmp_path, "plain.swf", SWF)).nodes


ALCF = """\
JOB_NAME,QUEUE_NAME,QUEUED_TIMESTAMP,START_TIMESTAMP,END_TIMESTAMP,WALLTIME_SECONDS,RUNTIME_SECONDS,NODES_REQUESTED,NODES_USED,LOCATION,EXIT_CODE
a,prod,2024-03-01 09:00:00,2024-03-01 10:00:00,2024-03-01 11:00:00,3600,3600,2,2,"x3005c0s19b1n0,x3005c0s25b0n0",0
b,prod,2024-03-01 09:00:00,2024-03-01 10:30:00,2024-03-01 12:00:00,7200,5400,3,3,"x3005c0s31b0n0,x3005c0s",0
c,debug,2024-03-01 09:00:00,2024-03-01 10:45:00,,3600,900,1,,,0
d,debug,2024-03-01 09:00:00,,,3600,,1,,,
"""


def test_alcf_location_names_and_polaris_size(tmp_path: Path) -> None:
    tl = traces.read(write(tmp_path, "polaris.csv", ALCF), nodes=560)
    assert tl.format == "alcf"
    assert tl.n_nodes == 560
    assert tl.nodes[-2:] == ("x3005c0s19b1n0", "x3005c0s25b0n0")  # complete LOCATION only
    assert tl.nodes[0] == "n0000"
    assert len(tl.initial_idle) == 558 and "x3005c0s19b1n0" not in tl.initial_idle
    at = tl.idle_at(utc("2024-03-01 10:50:00"))
    assert len(at) == 560 - 2 - 3 - 1
    assert {"n0000", "n0001", "n0002", "n0003"}.isdisjoint(at)  # b (cut LOCATION) and c: free nodes
    assert {"x3005c0s19b1n0", "x3005c0s25b0n0"} <= tl.idle_at(utc("2024-03-01 11:30:00"))
    assert tl.end == utc("2024-03-01 12:00:00")
    assert "skipped 1 jobs: never started" in tl.notes
    assert_alternating(tl)


def test_alcf_default_machine_size_is_peak_busy(tmp_path: Path) -> None:
    tl = traces.read(write(tmp_path, "polaris.csv", ALCF))
    assert tl.nodes == ("n0000", "n0001", "n0002", "n0003", "x3005c0s19b1n0", "x3005c0s25b0n0")


MALFORMED = [
    ("nodes.csv", "time,node,idle\n1,a,0\n2,a,x\n", 3, "idle 'x'"),
    ("nodes.csv", "# c\n# c\ntime,node,idle\n1,a,0\n1,b,1\nabc,b,0\n", 6, "time 'abc'"),
    ("nodes.csv", "time,node,idle\n1,a,0\n\n2,a\n", 4, "3 comma-separated fields"),
    ("log.swf", "; MaxNodes: 4\n1 0 0 10 1 -1 -1 1 10 -1 1 1 1 -1 1 -1 -1 -1\n2 0 0 10 1\n", 3, "18 fields"),
    ("log.swf", "; MaxNodes: 4\n1 0 0 10 1 -1 -1 1 10 -1 1 1 1 -1 1 -1 -1 x\n", 2, "non-numeric"),
    ("log.swf", "; MaxNodes: four\n", 1, "MaxNodes"),
    ("s.txt", "JobID|NNodes|Start|End\n1|1|2024-01-01T00:00:00|2024-01-01T01:00:00\n2|1|yesterday|now\n", 3,
     "time 'yesterday'"),
    ("s.txt", "JobID|NNodes|Start|End\n1|two|2024-01-01T00:00:00|2024-01-01T01:00:00\n", 2, "node count 'two'"),
    ("s.txt", "JobID|NNodes|Start|End\n1|1|2024-01-01T00:00:00\n", 2, "expected 4 fields"),
    ("a.csv", "START_TIMESTAMP,END_TIMESTAMP,NODES_USED\n2024-03-01 10:00:00,2024-03-01 11:00:00,abc\n", 2,
     "NODES_USED 'abc'"),
]


@pytest.mark.parametrize(("name", "text", "line", "reason"), MALFORMED)
def test_malformed_line_names_file_and_line(tmp_path: Path, name: str, text: str, line: int, reason: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(TraceError) as err:
        traces.read(path)
    assert f"{path}:{line}:" in str(err.value)
    assert reason in str(err.value)


def test_missing_columns_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"s\.txt:1: sacct header lacks column\(s\) NNodes or AllocNodes"):
        traces.read(write(tmp_path, "s.txt", "JobID|Start|End\n1|0|10\n"))


def test_unknown_format_lists_supported(tmp_path: Path) -> None:
    path = write(tmp_path, "log.swf", SWF)
    with pytest.raises(TraceError) as err:
        traces.read(path, format="pbs")
    assert str(path) in str(err.value) and "'pbs'" in str(err.value)
    assert all(f in str(err.value) for f in traces.FORMATS)
    with pytest.raises(TraceError) as err:
        traces.read(write(tmp_path, "odd.csv", "model,nodes,samples_per_second\nx,1,2\n"))
    assert "odd.csv" in str(err.value) and all(f in str(err.value) for f in traces.FORMATS)


def test_forced_format_reads_a_mismatched_file_as_an_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"log\.swf:1: expected the header time,node,idle"):
        traces.read(write(tmp_path, "log.swf", SWF), format="nodes-csv")
    assert traces.read(tmp_path / "log.swf", format="SWF").format == "swf"


EMPTY = [
    ("zero", "", None),
    ("comments", "# nothing\n\n# here\n", None),
    ("nodes-header", "time,node,idle\n", None),
    ("swf-headers", "; Version: 2.2\n; MaxNodes: 10\n", None),
    ("sacct-header", "JobID|NNodes|Start|End\n", None),
    ("sacct-steps", "JobID|NNodes|Start|End\n1.batch|1|0|10\n2|1|Unknown|Unknown\n", None),
    ("alcf-header", "START_TIMESTAMP,END_TIMESTAMP,NODES_USED\n", None),
    ("swf-forced", "", "swf"),
    ("sacct-forced", "", "sacct"),
    ("alcf-forced", "\n", "alcf"),
    ("nodes-forced", "", "nodes-csv"),
]


@pytest.mark.parametrize(("name", "text", "fmt"), EMPTY)
def test_empty_log_is_an_error(tmp_path: Path, name: str, text: str, fmt: str | None) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(TraceError, match="empty log") as err:
        traces.read(path, fmt)
    assert str(path) in str(err.value)


def test_empty_gzip_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gz"
    path.write_bytes(gzip.compress(b""))
    with pytest.raises(TraceError, match="empty log"):
        traces.read(path)
    with pytest.raises(TraceError, match="no such file"):
        traces.read(tmp_path / "absent.swf")


def test_nodes_csv_rejects_machine_size(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="--nodes applies to job logs"):
        traces.read(write(tmp_path, "n.csv", "time,node,idle\n1,a,1\n"), nodes=3)


def test_nodes_csv_semantics(tmp_path: Path) -> None:
    text = "# c\ntime,node,idle\n10,a,1\n10,b,0\n20,b,1\n20,b,1\n25,c,1\n30,a,0\n30,a,1\n40,b,0\n"
    tl = traces.read(write(tmp_path, "n.csv", text))
    assert tl.nodes == ("a", "b", "c")  # c is first named later: busy until then
    assert (tl.start, tl.end) == (10, 40)
    assert tl.initial_idle == {"a"}
    events = [(e.time, e.node, e.idle) for e in tl.events()]
    assert events == [(20, "b", True), (25, "c", True), (40, "b", False)]  # repeats dropped
    assert np.array_equal(tl.idle_counts()[1], [1, 2, 3, 2])


def test_nodes_csv_irregular_layout_reads_the_same(tmp_path: Path) -> None:
    regular = "# c\ntime,node,idle\n10,a,1\n10,b,0\n20,b,1\n30,a,0\n"
    irregular = "# c\r\ntime, node, idle\r\n10,a,1\r\n\r\n10,b,0\r\n# mid-file comment\r\n20,b,1\r\n30,a,0\r\n"
    a = traces.read(write(tmp_path, "a.csv", regular))  # whole-buffer path
    b = traces.read(write(tmp_path, "b.csv", irregular), "nodes-csv")  # line-by-line path
    assert (a.nodes, a.initial_idle, a.start, a.end) == (b.nodes, b.initial_idle, b.start, b.end)
    assert [(e.time, e.node, e.idle) for e in a.events()] == [(e.time, e.node, e.idle) for e in b.events()]


# A log of the Parallel Workloads Archive with no wait times (-1 in every job).
SWF_NO_WAIT = """\
; UnixStartTime: 0
; MaxNodes: 4
; MaxProcs: 4
1   0 -1 100 2 -1 -1  2 200 -1 1 1 1 -1 1 -1 -1 -1
2  50 -1 100 1 -1 -1  1 200 -1 1 1 1 -1 1 -1 -1 -1
3  60 -1  -1 1 -1 -1  1 200 -1 5 1 1 -1 1 -1 -1 -1
4  -1 -1  10 1 -1 -1  1 200 -1 1 1 1 -1 1 -1 -1 -1
"""


def test_swf_without_wait_times_starts_jobs_at_submit(tmp_path: Path) -> None:
    tl = traces.read(write(tmp_path, "nowait.swf", SWF_NO_WAIT))
    assert (tl.start, tl.end) == (0, 150)
    assert [len(tl.idle_at(t)) for t in (10, 60, 120, 150)] == [2, 1, 3, 4]
    assert "2 jobs with no wait time (-1): started at their submit time" in tl.notes
    assert "skipped 1 jobs: no run time" in tl.notes  # job 3: cancelled, run time -1
    assert "skipped 1 jobs: unknown submit time" in tl.notes
    assert "processor fields are processors" not in " ".join(tl.notes)  # MaxProcs = MaxNodes
    assert_alternating(tl)


# 4 nodes of 8 processors: the processor fields count processors, not nodes.
SWF_PROCS = """\
; MaxNodes: 4
; MaxProcs: 32
1  0  0 100  8 -1 -1  8 200 -1 1 1 1 -1 1 -1 -1 -1
2  0  0 100  9 -1 -1 12 200 -1 1 1 1 -1 1 -1 -1 -1
3 10  0 100 -1 -1 -1  6 200 -1 1 1 1 -1 1 -1 -1 -1
4 20  0  50 64 -1 -1 64 200 -1 1 1 1 -1 1 -1 -1 -1
5 90  5   2  0 -1 -1 -1 200 -1 1 1 1 -1 1 -1 -1 -1
"""


def test_swf_processors_become_nodes(tmp_path: Path) -> None:
    tl = traces.read(write(tmp_path, "procs.swf", SWF_PROCS))
    assert tl.n_nodes == 4
    notes = " | ".join(tl.notes)
    assert "processor fields are processors: MaxProcs 32 / MaxNodes 4 = 8 per node" in notes
    assert "processors from field 5 (allocated) for 3 jobs, field 8 (requested) for 1" in notes
    assert "skipped 1 jobs: unknown processor count" in notes
    # 8 procs -> 1 node, 9 -> 2 nodes, 6 requested -> 1 node: all 4 nodes busy from 10 s
    assert tl.idle_at(5) == {"n0003"} and tl.idle_at(15) == frozenset()
    # job 4 (64 procs = 8 nodes > the machine) starts with no node free: clamped and counted
    assert "1 jobs asked for more nodes than the machine has: cut to the machine" in notes
    assert any(n.startswith("clamped 1 jobs") for n in tl.notes)
    assert_alternating(tl)


def test_swf_partial_executions_replay_the_parts(tmp_path: Path) -> None:
    text = ("; MaxNodes: 2\n"
            "7  0 0 100 1 -1 -1 1 200 -1 1 1 1 -1 1 -1 -1 -1\n"  # summary line of a job run in two parts
            "7  0 0  30 1 -1 -1 1 200 -1 2 1 1 -1 1 -1 -1 -1\n"
            "7 50 0  40 1 -1 -1 1 200 -1 3 1 1 -1 1 -1 -1 -1\n")
    tl = traces.read(write(tmp_path, "parts.swf", text))
    assert tl.idle_node_seconds() == pytest.approx(2 * 90 - 70)
    assert "skipped 1 jobs: summary lines of jobs run in parts (the parts are replayed)" in tl.notes


def test_swf_only_maxprocs_or_nothing(tmp_path: Path) -> None:
    job = "1 0 0 10 3 -1 -1 3 10 -1 1 1 1 -1 1 -1 -1 -1\n"
    tl = traces.read(write(tmp_path, "p.swf", "; MaxProcs: 5\n" + job))
    assert tl.n_nodes == 5 and "machine size 5 nodes (from the log header MaxProcs, no MaxNodes)" in tl.notes
    tl = traces.read(write(tmp_path, "n.swf", "; Version: 2.2\n" + job))
    assert tl.n_nodes == 3 and "machine size 3 nodes (peak busy)" in tl.notes
