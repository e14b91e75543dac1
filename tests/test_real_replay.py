"""The real replay's bookkeeping (benchmarks/bench_real_replay.py): which prod jobs a log window
becomes, and how idle, held and trained node-seconds are counted. The Slurm runs themselves are
the benchmark's; these parts decide its figures and are checked here without Slurm."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from traces import IdleTimeline

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_real_replay.py"


@pytest.fixture(scope="module")
def rr():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_real_replay", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_real_replay"] = mod
    spec.loader.exec_module(mod)
    return mod


def timeline() -> IdleTimeline:
    # a: busy until 100, idle until 200, busy to the end (300); b: idle throughout; c: idle until 50, then busy
    return IdleTimeline.from_arrays(
        source="t", format="nodes-csv", nodes=("a", "b", "c"), start=1000.0, end=1300.0,
        initial_idle=np.array([False, True, True]),
        times=np.array([1050.0, 1100.0, 1200.0]), node_ids=np.array([2, 0, 0]),
        idle=np.array([False, True, False]),
    )


def test_window_compressed_onto_the_cluster_nodes(rr) -> None:  # type: ignore[no-untyped-def]
    w = rr.compressed(timeline(), ["a", "c"], ("node1", "node2"), 10.0)
    assert w.nodes == ("node1", "node2") and w.start == 0.0 and w.end == 30.0
    assert w.initial_idle == frozenset({"node2"})
    assert [(e.time, e.node, e.idle) for e in w.events()] == [
        (5.0, "node2", False), (10.0, "node1", True), (20.0, "node1", False)]
    assert w.idle_node_seconds() == pytest.approx(10.0 + 5.0)  # a idle 100..200, c 0..50, /10


def test_busy_periods_become_prod_jobs(rr) -> None:  # type: ignore[no-untyped-def]
    w = rr.compressed(timeline(), ["a", "b", "c"], ("n1", "n2", "n3"), 10.0)
    jobs = rr.prod_jobs(w)
    assert [(j.node, j.at, j.length) for j in jobs] == [("n1", 0.0, 10.0), ("n3", 5.0, 25.0), ("n1", 20.0, 10.0)]
    assert [j.index for j in jobs] == [0, 1, 2]


def test_pick_nodes(rr) -> None:  # type: ignore[no-untyped-def]
    tl = timeline()
    assert rr.pick_nodes(tl, 2, "changes") == ["a", "c"]
    picks = {tuple(rr.pick_nodes(tl, 1, "random", seed)) for seed in range(40)}
    assert picks <= {("a",), ("b",), ("c",)} and len(picks) > 1
    assert rr.pick_nodes(tl, 3, "random", 1) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="fewer than 3 nodes change"):
        rr.pick_nodes(tl, 3, "changes")
    with pytest.raises(ValueError, match="--pick"):
        rr.pick_nodes(tl, 1, "best")


def test_trained_counts_only_steps_close_together_inside_the_window(rr, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "j1.n1.1.log"
    lines = ["not json", *(json.dumps({"ev": "step", "t": t}) for t in (10.0, 10.5, 11.0, 15.0, 15.5))]
    log.write_text("\n".join(lines) + "\n")
    # 10 -> 11 trained (two 0.5 s gaps), 11 -> 15 is a pause, 15 -> 15.5 trained
    assert rr.trained_seconds([log], 0.0, 100.0) == pytest.approx(1.5)
    assert rr.trained_seconds([log], 10.25, 15.25) == pytest.approx(0.75 + 0.25)
    assert rr.trained_seconds([tmp_path / "missing.log"], 0.0, 1.0) == 0.0


def test_held_counts_pilot_time_inside_the_window(rr) -> None:  # type: ignore[no-untyped-def]
    events = [
        {"kind": "pilot_started", "time": 5.0, "nodes": ["n1"]},
        {"kind": "pilot_started", "time": 12.0, "nodes": ["n2"]},
        {"kind": "pilot_ended", "time": 20.0, "nodes": ["n1"]},
        {"kind": "pilot_ended", "time": 25.0, "nodes": ["n3"]},  # never started: ignored
    ]
    # n1: 10..20 inside [10, 30]; n2: 12..30 (still running)
    assert rr.held_seconds(events, 10.0, 30.0) == pytest.approx(10.0 + 18.0)


def test_calibration_values_are_read_by_name(rr, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"schema": 1, "values": {"cold_start_s": {"value": 2.5, "unit": "s"}}}))
    assert rr.load_calibration(path) == {"cold_start_s": 2.5}
    assert rr.load_calibration(tmp_path / "none.json") == {}


def test_warmed_puts_the_initial_state_before_the_window(rr) -> None:  # type: ignore[no-untyped-def]
    w = rr.warmed(rr.compressed(timeline(), ["a", "c"], ("node1", "node2"), 10.0), 40.0)
    assert w.start == 0.0 and w.end == 70.0 and w.initial_idle == frozenset({"node2"})
    assert [(e.time, e.node, e.idle) for e in w.events()] == [
        (45.0, "node2", False), (50.0, "node1", True), (60.0, "node1", False)]


def test_the_simulator_side_warms_up_like_the_real_run(rr, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The real run's jobs train on the initially idle nodes before the window opens: with a warm-up the
    simulator's window holds no pilot or cold start, and only the window's node-seconds count."""
    values = {k: {"value": v, "unit": "s", "how": "test", "when": "2026-11-26", "command": "none"}
              for k, v in (("pilot_start_s", 2.0), ("cold_start_s", 10.0), ("restart_s", 10.0),
                           ("rescale_pause_s", 0.0), ("commit_interval_s", 0.0))}
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"schema": 1, "values": values}))
    one = IdleTimeline.from_arrays(source="t", format="nodes-csv", nodes=("node1",), start=0.0, end=100.0,
                                   initial_idle=np.array([True]), times=np.array([]),
                                   node_ids=np.array([], dtype=np.int64), idle=np.array([], dtype=bool))
    assert rr.simulator_predicts(one, 1, 1, cal, tmp_path) == pytest.approx(100.0 - 2.0 - 10.0)
    assert rr.simulator_predicts(one, 1, 1, cal, tmp_path, warmup=50.0) == pytest.approx(100.0)
