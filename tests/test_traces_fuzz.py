"""Bad input: every reader, fuzzed. 0 tracebacks, 0 hangs; every error a TraceError naming file (and line).

Each example is a file written from a small grammar of the format with hostile
tokens spliced in (``nan``, ``inf``, ``1_000``, fullwidth digits, huge counts,
huge host-list ranges, quotes, NUL bytes), or raw random bytes, plain or
gzipped (``TRACES_FUZZ_EXAMPLES=5000`` for a deeper run than the default 150 per test). A reader must either return a timeline that holds its invariants or
raise ``TraceError`` naming the file; never another exception, never loop.
"""

from __future__ import annotations

import gzip
import math
import os
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import traces
from traces import TraceError
from traces._text import MAX_NODES
from traces.stats import trace_stats
from traces_helpers import assert_alternating

HOSTILE = [
    "nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-1e999", "1_000", "１２３", "٣", "1e308", "-1e308",
    "99999999999999999999999", "-5", "-1", "0", "1.5", "", " ", '"', '"a,b"', "[", "]", "a[1-999999999]",
    "n[0-99999]x[0-99999]", "a[3-1]", "a[[1-2]]", "\x00", "Unknown", "None", "2024-13-45T25:61:61",
    "2024-01-01T00:00:00", "9999-12-31T23:59:59", "0001-01-01T00:00:00", "１９７０-01-01T00:00:00",
    "1e5", "+7", ".5", "x" * 300,
]
SMALL = st.integers(-3, 5000).map(str)
TOKEN = st.one_of(SMALL, st.sampled_from(HOSTILE), st.text(max_size=6))
EXAMPLES = int(os.environ.get("TRACES_FUZZ_EXAMPLES", "150"))  # more for a deeper run
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _row(draw: st.DrawFn, width: int, sep: str) -> str:
    return sep.join(draw(st.lists(TOKEN, min_size=width - 1, max_size=width + 1)))


@st.composite
def nodes_csv_text(draw: st.DrawFn) -> str:
    rows = ["time,node,idle"]
    for _ in range(draw(st.integers(0, 8))):
        rows.append(",".join([draw(TOKEN), draw(st.sampled_from(["a", "b", "c", ""])), draw(st.sampled_from(["0", "1", "2", "nan"]))]))
    return "\n".join(rows) + "\n"


@st.composite
def swf_text(draw: st.DrawFn) -> str:
    header = [f"; {k}: {draw(TOKEN)}" for k in draw(st.lists(st.sampled_from(["MaxNodes", "MaxProcs", "UnixStartTime"]), max_size=3))]
    rows = [" ".join(draw(st.lists(TOKEN, min_size=17, max_size=19))) for _ in range(draw(st.integers(0, 6)))]
    return "\n".join(header + rows) + "\n"


@st.composite
def sacct_text(draw: st.DrawFn) -> str:
    sep = draw(st.sampled_from(["|", ","]))
    rows = [sep.join(["JobID", "NNodes", "Start", "End", "NodeList"])]
    rows += [_row(draw, 5, sep) for _ in range(draw(st.integers(0, 6)))]
    return "\n".join(rows) + "\n"


@st.composite
def alcf_text(draw: st.DrawFn) -> str:
    rows = ["START_TIMESTAMP,END_TIMESTAMP,RUNTIME_SECONDS,NODES_USED,NODES_REQUESTED,LOCATION"]
    rows += [_row(draw, 6, ",") for _ in range(draw(st.integers(0, 6)))]
    return "\n".join(rows) + "\n"


GRAMMARS = {"nodes-csv": nodes_csv_text(), "swf": swf_text(), "sacct": sacct_text(), "alcf": alcf_text()}


@contextmanager
def no_hang(seconds: int = 60) -> Iterator[None]:
    """Turn a reader that never returns into a test failure instead of a stuck run."""
    def fail(signum: int, frame: object) -> None:
        raise AssertionError(f"reader still running after {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def check_read(path: Path, fmt: str | None, nodes: int | None = None) -> traces.IdleTimeline | None:
    """Read ``path``: a sound timeline, or a TraceError naming the file that no reader left to the last guard."""
    with no_hang():
        try:
            tl = traces.read(path, fmt, nodes=nodes)
        except TraceError as err:
            assert str(path) in str(err), err
            assert "cannot read as" not in str(err), f"a reader missed this case: {err}"
            return None
    assert_alternating(tl)
    assert math.isfinite(tl.start) and math.isfinite(tl.end) and tl.start <= tl.end
    assert 1 <= tl.n_nodes <= MAX_NODES
    _, counts = tl.idle_counts()
    assert counts.min() >= 0 and counts.max() <= tl.n_nodes
    s = trace_stats(tl)
    assert 0.0 <= s.idle_fraction <= 1.0 and math.isfinite(s.mean_idle)
    return tl


def _write(tmp_path: Path, name: str, data: bytes, gz: bool) -> Path:
    path = tmp_path / (name + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


@pytest.mark.parametrize("fmt", list(GRAMMARS))
def test_fuzz_grammar(fmt: str, tmp_path: Path) -> None:
    @FUZZ
    @given(text=GRAMMARS[fmt], gz=st.booleans(), forced=st.booleans(), nodes=st.sampled_from([None, 1, 3, 100]))
    def run(text: str, gz: bool, forced: bool, nodes: int | None) -> None:
        path = _write(tmp_path, "log", text.encode("utf-8", "surrogatepass"), gz)
        check_read(path, fmt if forced else None, None if fmt == "nodes-csv" else nodes)

    run()


@FUZZ
@given(data=st.binary(max_size=300), fmt=st.sampled_from([None, *traces.FORMATS]), gz=st.booleans())
def test_fuzz_bytes(data: bytes, fmt: str | None, gz: bool, tmp_path: Path) -> None:
    check_read(_write(tmp_path, "raw", data, gz), fmt)


@FUZZ
@given(text=st.text(max_size=200), fmt=st.sampled_from([None, *traces.FORMATS]))
def test_fuzz_text(text: str, fmt: str | None, tmp_path: Path) -> None:
    check_read(_write(tmp_path, "text", text.encode("utf-8", "surrogatepass"), False), fmt)


SWF_JOB = "1 0 0 10 1 -1 -1 1 10 -1 1 1 1 -1 1 -1 -1 -1"
# Inputs that were accepted as data, looped forever or crashed before; each must now be an error naming its line.
NONSENSE = [
    ("fullwidth time", "n.csv", "time,node,idle\n１２,a,1\n13,a,0\n", 2),
    ("underscore time", "n.csv", "time,node,idle\n1_000,a,1\n2000,a,0\n", 2),
    ("nan time", "n.csv", "time,node,idle\nnan,a,1\n", 2),
    ("inf time", "n.csv", "time,node,idle\n1,a,1\ninf,a,0\n", 3),
    ("huge time", "n.csv", "time,node,idle\n-1e308,a,1\n1e308,a,0\n", 2),
    ("negative MaxNodes", "l.swf", f"; MaxNodes: -5\n{SWF_JOB}\n", 1),
    ("underscore MaxNodes", "l.swf", f"; MaxNodes: 1_0\n{SWF_JOB}\n", 1),
    ("fullwidth MaxProcs", "l.swf", f"; MaxProcs: １０\n{SWF_JOB}\n", 1),
    ("nan swf field", "l.swf", "; Version: 2.2\n1 0 nan 10 1 -1 -1 1 10 -1 1 1 1 -1 1 -1 -1 -1\n", 2),
    ("inf run time", "l.swf", "; Version: 2.2\n1 0 0 inf 1 -1 -1 1 10 -1 1 1 1 -1 1 -1 -1 -1\n", 2),
    ("negative wait", "l.swf", "; Version: 2.2\n1 0 -7 10 1 -1 -1 1 10 -1 1 1 1 -1 1 -1 -1 -1\n", 2),
    ("fractional processors", "l.swf", "; Version: 2.2\n1 0 0 10 1.5 -1 -1 1 10 -1 1 1 1 -1 1 -1 -1 -1\n", 2),
    ("huge job, no machine", "l.swf", "; Version: 2.2\n1 0 0 10 999999999 -1 -1 1 10 -1 1 1 1 -1 1 -1 -1 -1\n", 2),
    ("nan sacct time", "s.txt", "JobID|NNodes|Start|End\n1|1|nan|nan\n", 2),
    ("fullwidth sacct time", "s.txt", "JobID|NNodes|Start|End\n1|1|１０|20\n", 2),
    ("underscore node count", "s.txt", "JobID|NNodes|Start|End\n1|1_0|10|20\n", 2),
    ("huge node count", "s.txt", "JobID|NNodes|Start|End\n1|99999999999999999999|10|20\n", 2),
    ("bad date", "s.txt", "JobID|NNodes|Start|End\n1|1|2024-13-45T25:61:61|20\n", 2),
    ("nested host list", "s.txt", "JobID|NNodes|Start|End|NodeList\n1|1|10|20|a[[1-2]]\n", 2),
    ("unclosed quote", "s.txt", 'JobID,NNodes,Start,End\n1,1,10,"20\n2,1,10,20\n', 2),
    ("huge field", "s.txt", "JobID,NNodes,Start,End\n1,1,10,\"" + "9" * 200000 + "\"\n", 2),
    ("inf alcf runtime", "a.csv", "START_TIMESTAMP,RUNTIME_SECONDS,NODES_USED\n10,inf,1\n", 2),
    ("huge alcf nodes", "a.csv", "START_TIMESTAMP,RUNTIME_SECONDS,NODES_USED\n10,5,1e12\n", 2),
]


@pytest.mark.parametrize(("name", "file", "text", "line"), NONSENSE, ids=[n[0] for n in NONSENSE])
def test_nonsense_is_an_error_naming_the_line(tmp_path: Path, name: str, file: str, text: str, line: int) -> None:
    path = tmp_path / file
    path.write_text(text)
    with no_hang():
        with pytest.raises(TraceError) as err:
            traces.read(path)
    assert f"{path}:{line}:" in str(err.value), err.value


def test_huge_host_list_costs_no_more_than_the_job(tmp_path: Path) -> None:
    # 1 node but a host list of 10^18 names: the list is ignored (it cannot be the job's), instantly.
    path = tmp_path / "s.txt"
    path.write_text("JobID|NNodes|Start|End|NodeList\n1|1|10|20|n[0-999999999]x[0-999999999]\n")
    with no_hang():
        tl = check_read(path, None)
    assert tl is not None and tl.nodes == ("n0000",)


def test_gzip_bomb_and_broken_gzip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import traces._text as text

    monkeypatch.setattr(text, "MAX_TEXT_BYTES", 1000)
    bomb = tmp_path / "bomb.gz"
    bomb.write_bytes(gzip.compress(b"time,node,idle\n" + b"1,a,1\n" * 10000))
    with pytest.raises(TraceError, match="more than"):
        traces.read(bomb, "nodes-csv")
    broken = tmp_path / "broken.gz"
    broken.write_bytes(gzip.compress(b"time,node,idle\n1,a,1\n")[:-12])
    with pytest.raises(TraceError, match=str(broken)):
        traces.read(broken, "nodes-csv")


def test_nan_in_a_job_table_cannot_loop(tmp_path: Path) -> None:
    from traces.jobs import JobTable, jobs_to_timeline

    table = JobTable(path=tmp_path / "x", format="test")
    table.add(float("nan"), 10.0, 1)
    with no_hang(), pytest.raises(TraceError, match="NaN"):
        jobs_to_timeline(table)


def test_strict_numbers() -> None:
    from traces._text import parse_int, parse_number

    assert [parse_number(x) for x in ("12", "-1.5", "3e4", ".5", "+7")] == [12.0, -1.5, 3e4, 0.5, 7.0]
    assert all(parse_number(x) is None for x in ("nan", "inf", "1_000", "１２", "1e999", "0x10", "", "1 2"))
    assert parse_int("-12") == -12 and parse_int("1.0") is None and parse_int("٣") is None
    assert np.isfinite(parse_number("1e308"))
