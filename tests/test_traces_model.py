"""IdleTimeline: normalisation of raw reports, window(), state queries."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces import IdleTimeline
from traces_helpers import assert_alternating


def build(initial: list[bool], reports: list[tuple[float, int, bool]], start: float = 0.0, end: float = 100.0):
    t = np.array([r[0] for r in reports], dtype=float)
    i = np.array([r[1] for r in reports], dtype=np.int64)
    s = np.array([r[2] for r in reports], dtype=bool)
    return IdleTimeline.from_arrays(
        source="test", format="test", nodes=[f"x{k}" for k in range(len(initial))],
        start=start, end=end, initial_idle=np.array(initial), times=t, node_ids=i, idle=s,
    )


def naive_state(initial: list[bool], reports: list[tuple[float, int, bool]], t: float) -> set[str]:
    """Replay the reports in time order (stable), the obvious way."""
    state = list(initial)
    for time, node, idle in sorted(reports, key=lambda r: r[0]):
        if time <= t:
            state[node] = idle
    return {f"x{k}" for k, v in enumerate(state) if v}


def test_from_arrays_normalises() -> None:
    reports = [(5, 0, True), (0, 1, True), (5, 0, True), (7, 1, True), (9, 0, False), (9, 0, True), (150, 1, False)]
    tl = build([False, False], reports)
    assert tl.initial_idle == {"x1"}  # the report at start folds into the initial state
    assert [(e.time, e.node, e.idle) for e in tl.events()] == [(5, "x0", True)]  # repeats, same-time pairs, late
    assert tl.node_ids.dtype == np.int32 and tl.times.dtype == np.float64


def test_from_arrays_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="node_ids outside"):
        build([False], [(1, 3, True)])
    with pytest.raises(ValueError, match="bad span"):
        build([False], [], start=10, end=5)


def test_window_rebases_and_keeps_ids() -> None:
    tl = build([True, False, False], [(10, 0, False), (20, 1, True), (30, 0, True), (40, 2, True), (50, 1, False)])
    w = tl.window(20, 45)
    assert (w.start, w.end) == (20, 45)
    assert w.initial_idle == {"x1"}  # x0 recalled at 10, x1 idle at exactly 20
    assert [(e.time, e.node, e.idle) for e in w.events()] == [(30, "x0", True), (40, "x2", True)]
    assert w.nodes == tl.nodes
    assert w.idle_node_seconds() == pytest.approx(tl.idle_node_seconds(20, 45))
    assert tl.window(tl.start, tl.end).times.tolist() == tl.times.tolist()
    with pytest.raises(ValueError, match="not inside"):
        tl.window(-1, 50)
    with pytest.raises(ValueError, match="not inside"):
        tl.window(60, 50)


def test_shifted_and_batches() -> None:
    tl = build([False, False], [(10, 0, True), (10, 1, True), (20, 0, False)])
    moved = tl.shifted(1000)
    assert (moved.start, moved.end, moved.times.tolist()) == (1000, 1100, [1010, 1010, 1020])
    batches = list(tl.batches())
    assert [(b.time, set(b.became_idle), b.recalled) for b in batches] == [(10, {"x0", "x1"}, ()), (20, set(), ("x0",))]


reports_strategy = st.lists(
    st.tuples(st.integers(0, 120).map(float), st.integers(0, 3), st.booleans()), max_size=40
)


@settings(max_examples=100, deadline=None)
@given(initial=st.lists(st.booleans(), min_size=4, max_size=4), reports=reports_strategy,
       cut=st.tuples(st.integers(0, 100), st.integers(0, 100)))
def test_normalised_timeline_replays_like_the_reports(initial, reports, cut) -> None:
    kept = [r for r in reports if r[0] <= 100]
    tl = build(initial, reports)
    assert_alternating(tl)
    for t in (0, 5, 33.5, 50, 99, 100):
        assert tl.idle_at(t) == naive_state(initial, kept, t)
    a, b = sorted(cut)
    w = tl.window(a, b)
    assert_alternating(w)
    assert w.idle_node_seconds() == pytest.approx(tl.idle_node_seconds(a, b))
    for t in (a, (a + b) / 2, b):
        assert w.idle_at(t) == tl.idle_at(t)
