"""Every parser on the real logs in ../shared/data."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np
import pytest

import traces
from traces.stats import fragment_lengths, trace_stats
from traces_helpers import assert_alternating, read_cached as _read




@pytest.fixture
def summit(summit_nodes: Path) -> traces.IdleTimeline:
    return _read(summit_nodes)


@pytest.fixture
def kth(kth_swf: Path) -> traces.IdleTimeline:
    return _read(kth_swf)


@pytest.fixture
def cirrus(cirrus_sacct: Path) -> traces.IdleTimeline:
    return _read(cirrus_sacct)


def test_summit_nodes_csv(summit: traces.IdleTimeline, summit_nodes: Path) -> None:
    assert summit.format == "nodes-csv"
    assert summit.n_nodes == 4734
    assert summit.start == 1612915732
    assert summit.span == pytest.approx(604144)
    assert all(len(n) == 6 and n[0] in "abcdefgh" for n in summit.nodes)  # Summit host names
    rows = sum(1 for line in gzip.open(summit_nodes, "rt") if line[:1].isdigit())
    assert summit.n_events == rows - summit.n_nodes  # every later row is a real change
    assert_alternating(summit)


def test_summit_idle_fraction(summit: traces.IdleTimeline) -> None:
    s = trace_stats(summit)
    # Time-weighted over the whole week: 7.29%. The data README's "about 8.7%" is
    # only reached without the quiet first two days (8.8% over days 3-7, below).
    assert s.idle_fraction == pytest.approx(0.0729, abs=0.001)
    assert s.peak_idle == 4083
    assert 0.08 < summit.window(summit.start + 2 * 86400, summit.end).idle_node_seconds() / (
        summit.end - summit.start - 2 * 86400
    ) / summit.n_nodes < 0.095
    assert s.fragment_p10_s < s.fragment_p50_s < s.fragment_p90_s < s.fragment_p99_s
    assert s.events_per_hour == pytest.approx(summit.n_events / (summit.span / 3600))


def test_summit_fragments_add_up(summit: traces.IdleTimeline) -> None:
    whole = fragment_lengths(summit, censored=True)
    assert whole.sum() == pytest.approx(summit.idle_node_seconds())
    assert fragment_lengths(summit).size == 209178


def _swf_jobs(path: Path) -> list[list[float]]:
    rows = []
    for line in gzip.open(path, "rt"):
        if not line.startswith(";") and line.strip():
            rows.append([float(x) for x in line.split()])
    return rows


def test_kth_swf(kth: traces.IdleTimeline, kth_swf: Path) -> None:
    assert kth.format == "swf"
    assert kth.n_nodes == 100  # ; MaxNodes: 100
    assert kth.nodes[0] == "n0000"
    jobs = [r for r in _swf_jobs(kth_swf) if r[3] > 0 and r[4] > 0]
    start = 843480031 + min(r[1] + r[2] for r in jobs)  # ; UnixStartTime
    end = 843480031 + max(r[1] + r[2] + r[3] for r in jobs)
    assert (kth.start, kth.end) == (start, end)
    assert f"{len(jobs)} jobs" in kth.notes
    assert "skipped 8 jobs: no run time" in kth.notes
    _, counts = kth.idle_counts()
    assert counts.min() >= 0 and counts.max() <= 100
    # Busy node-seconds are the jobs' node-seconds, less what clamping dropped (noted).
    busy = kth.n_nodes * kth.span - kth.idle_node_seconds()
    asked = sum(r[4] * r[3] for r in jobs)
    dropped = [n for n in kth.notes if n.startswith("clamped")]
    assert len(dropped) == 1
    dropped_h = float(dropped[0].split("(")[1].split()[0])
    assert busy == pytest.approx(asked - dropped_h * 3600, abs=0.1 * 3600)
    assert_alternating(kth)


def test_cirrus_sacct(cirrus: traces.IdleTimeline, cirrus_sacct: Path) -> None:
    assert cirrus.format == "sacct"
    with gzip.open(cirrus_sacct, "rt") as fh:
        rows = [r for r in csv.DictReader(fh) if r["Start"] != "None" and int(r["End"]) > int(r["Start"])]
    assert f"{len(rows)} jobs" in cirrus.notes
    assert "skipped 199 jobs: never started" in cirrus.notes
    assert cirrus.n_nodes == 557  # peak busy: no machine size in a sacct export
    assert not any(n.startswith("clamped") for n in cirrus.notes)
    busy = cirrus.n_nodes * cirrus.span - cirrus.idle_node_seconds()
    assert busy == pytest.approx(sum(int(r["NNodes"]) * (int(r["End"]) - int(r["Start"])) for r in rows))
    assert cirrus.start == min(int(r["Start"]) for r in rows)
    assert cirrus.end == max(int(r["End"]) for r in rows)
    assert_alternating(cirrus)


def test_cirrus_machine_size_override_clamps(cirrus_sacct: Path) -> None:
    tl = traces.read(cirrus_sacct, nodes=280)
    assert tl.n_nodes == 280
    assert any(n.startswith("clamped") for n in tl.notes)
    _, counts = tl.idle_counts()
    assert counts.min() == 0 and counts.max() <= 280
    assert_alternating(tl)


def test_find_data_finds_the_real_logs(summit_nodes: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from traces.data import data_dirs, find_data

    monkeypatch.setenv("MALLETRAIN_DATA", str(summit_nodes.parent))
    found = find_data(summit_nodes.name)
    assert found is not None and found.resolve() == summit_nodes.resolve()
    assert find_data("no-such-log.swf") is None
    (tmp_path / summit_nodes.name).write_text("shadow")
    monkeypatch.setenv("MALLETRAIN_DATA", str(tmp_path))
    assert find_data(summit_nodes.name) == tmp_path / summit_nodes.name  # the variable comes first
    monkeypatch.delenv("MALLETRAIN_DATA")
    assert data_dirs()[0] == Path(traces.__file__).resolve().parents[2] / "shared" / "data"


def test_detect_format(summit_nodes: Path, kth_swf: Path, cirrus_sacct: Path) -> None:
    assert traces.detect_format(summit_nodes) == "nodes-csv"
    assert traces.detect_format(kth_swf) == "swf"
    assert traces.detect_format(cirrus_sacct) == "sacct"
    assert traces.FORMATS == ("nodes-csv", "swf", "sacct", "alcf")


def test_window_of_real_trace_matches(summit: traces.IdleTimeline) -> None:
    a, b = summit.start + 86400.5, summit.start + 3 * 86400
    w = summit.window(a, b)
    assert w.idle_node_seconds() == pytest.approx(summit.idle_node_seconds(a, b))
    for t in np.linspace(a, b, 7):
        assert w.idle_at(t) == summit.idle_at(t)
    assert_alternating(w)


def test_a_report_names_the_data_folder_as_the_variable_never_a_path_of_this_machine(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from traces.data import without_data_dir
    monkeypatch.setenv("MALLETRAIN_DATA", str(tmp_path / "data"))
    shown = without_data_dir(f"Trace `{tmp_path}/data/summit.csv.gz`; scaling ../shared/data/summit-scaling.csv")
    assert shown == "Trace `$MALLETRAIN_DATA/summit.csv.gz`; scaling $MALLETRAIN_DATA/summit-scaling.csv"
    assert str(tmp_path) not in shown
