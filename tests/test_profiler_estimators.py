"""Throughput and rescale-cost estimators on recorded (synthesised) record streams."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiler.estimators import (
    RescaleCostEstimator,
    RescaleCosts,
    ThroughputEstimator,
    median_ci,
    rescale_events,
    summarize_rescales,
    throughput_by_world_size,
)
from profiler.records import Record, RecordError, Segment, synthesize


def test_exact_rates_per_world_size_without_noise() -> None:
    recs = synthesize([Segment(1, 20, 1.0, 100), Segment(4, 20, 1.25, 400, pause_before_s=18.0)])
    est = throughput_by_world_size(recs)
    assert est[1].rate == pytest.approx(100.0)
    assert est[4].rate == pytest.approx(320.0)
    # anchor record + 2 warm-up intervals are not counted
    assert est[1].n_steps == 20 - 1 - 2
    assert est[4].rel_ci == 0.0


def test_warmup_spikes_are_dropped() -> None:
    # 4 warm-up steps 20x slower after every rescale; only 4 steady steps per size
    segs = [
        Segment(2, 9, 0.5, 64, warmup_steps=4, warmup_factor=20.0),
        Segment(8, 9, 0.8, 256, pause_before_s=18.0, warmup_steps=4, warmup_factor=20.0),
    ]
    est = ThroughputEstimator(warmup_steps=4, min_steps=4)
    est.extend(synthesize(segs))
    assert est.estimate(2).rate == pytest.approx(128.0)
    assert est.estimate(8).rate == pytest.approx(320.0)
    assert est.estimate(8).n_steps == 4
    assert est.stable(8)
    # without dropping warm-up, the spikes are half the steps: wrong and not stable
    naive = ThroughputEstimator(warmup_steps=0, min_steps=4)
    naive.extend(synthesize(segs))
    assert naive.estimate(8).rate < 0.9 * 320.0
    assert not naive.stable(8)


def test_noisy_stream_converges_and_becomes_stable() -> None:
    recs = synthesize([Segment(16, 300, 0.4, 1024)], noise=0.05, seed=7)
    est = ThroughputEstimator()
    for i, rec in enumerate(recs):
        est.add(rec)
        if i == 4:
            assert not est.stable(16)  # 2 steady steps < min_steps
    e = est.estimate(16)
    assert e is not None and e.n_steps == 64  # the window
    assert e.total_steps == 300 - 3
    assert e.rate == pytest.approx(2560.0, rel=0.03)
    assert e.rel_ci <= 0.05 and est.stable(16)


def test_very_noisy_stream_is_not_declared_stable() -> None:
    est = ThroughputEstimator()
    est.extend(synthesize([Segment(4, 400, 1.0, 100)], noise=0.6, seed=3))
    e = est.estimate(4)
    assert e is not None and e.rel_ci > 0.05
    assert not est.stable(4)
    assert est.stable(4, rel_ci=0.5)


def test_median_ignores_a_checkpoint_hiccup() -> None:
    recs = synthesize([Segment(1, 30, 1.0, 10)])
    # one 60 s checkpoint stall inside the segment, same world size
    shifted = [Record(r.samples, r.timestamp + (60.0 if i >= 15 else 0.0), r.world_size) for i, r in enumerate(recs)]
    est = throughput_by_world_size(shifted)
    assert est[1].rate == pytest.approx(10.0)
    assert rescale_events(shifted) == []  # a stall is not a rescale


def test_returning_to_a_size_adds_to_its_window() -> None:
    recs = synthesize(
        [Segment(2, 10, 1.0, 20), Segment(4, 10, 1.0, 40, pause_before_s=5), Segment(2, 10, 1.0, 20, pause_before_s=5)]
    )
    est = ThroughputEstimator()
    est.extend(recs)
    assert est.estimate(2).total_steps == 2 * (10 - 3)
    assert est.rates() == {2: pytest.approx(20.0), 4: pytest.approx(40.0)}
    assert est.world_size == 2


def test_out_of_order_record_names_it_and_leaves_state_intact() -> None:
    est = ThroughputEstimator(warmup_steps=0, min_steps=1)
    est.add(Record(10, 1.0, 1))
    est.add(Record(10, 2.0, 1))
    with pytest.raises(RecordError, match=r"record #2: timestamp 1\.5"):
        est.add(Record(10, 1.5, 1))
    with pytest.raises(RecordError, match="record #2"):
        est.add(Record(10, 2.0, 1))
    est.add(Record(10, 3.0, 1))
    assert est.estimate(1).n_steps == 2
    costs = RescaleCostEstimator()
    costs.add(Record(10, 1.0, 1))
    with pytest.raises(RecordError, match="not after"):
        costs.add(Record(10, 0.5, 2))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"samples": 0, "timestamp": 1.0, "world_size": 1}, "samples"),
        ({"samples": 1, "timestamp": float("nan"), "world_size": 1}, "timestamp"),
        ({"samples": 1, "timestamp": 1.0, "world_size": 0}, "world_size"),
        ({"samples": 1.5, "timestamp": 1.0, "world_size": 1}, "samples"),
        ({"samples": True, "timestamp": 1.0, "world_size": 1}, "samples"),
        ({"samples": 1, "timestamp": math.inf, "world_size": 1}, "timestamp"),
        ({"samples": 1, "timestamp": "1.0", "world_size": 1}, "timestamp"),
        ({"samples": 1, "timestamp": 1.0, "world_size": 2.0}, "world_size"),
        ({"samples": 1, "timestamp": 1.0, "world_size": True}, "world_size"),
    ],
)
def test_bad_record_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(RecordError, match=field):
        Record(**kwargs)


def test_a_record_takes_an_int_timestamp() -> None:
    assert Record(1, 5, 2).timestamp == 5 and Record(1, -7, 2) == Record(1, -7.0, 2)


def test_bad_knobs_are_rejected() -> None:
    with pytest.raises(ValueError, match="warmup_steps"):
        ThroughputEstimator(warmup_steps=-1)
    with pytest.raises(ValueError, match="window"):
        ThroughputEstimator(window=3, min_steps=5)
    with pytest.raises(ValueError, match="settle_steps"):
        RescaleCostEstimator(settle_steps=0)


def test_rescale_pauses_separate_up_and_down() -> None:
    segs = [
        Segment(1, 12, 1.0, 100),
        Segment(4, 12, 1.25, 400, pause_before_s=18.0, warmup_steps=2),
        Segment(2, 12, 1.1, 200, pause_before_s=12.0, warmup_steps=2),
        Segment(8, 12, 1.6, 800, pause_before_s=19.0, warmup_steps=2),
        Segment(4, 12, 1.25, 400, pause_before_s=11.0, warmup_steps=2),
    ]
    events = rescale_events(synthesize(segs))
    assert [(e.from_size, e.to_size) for e in events] == [(1, 4), (4, 2), (2, 8), (8, 4)]
    assert [e.pause_s for e in events] == pytest.approx([18.0, 12.0, 19.0, 11.0])
    assert [e.is_up for e in events] == [True, False, True, False]
    costs = summarize_rescales(events)
    assert costs.n_up == 2 and costs.n_down == 2
    assert costs.up_s == pytest.approx(18.5) and costs.down_s == pytest.approx(11.5)


def test_rescale_pauses_with_noise_are_close() -> None:
    segs = [Segment(2, 40, 0.5, 64)]
    for i in range(10):
        segs.append(Segment(8 if i % 2 == 0 else 2, 40, 0.6 if i % 2 == 0 else 0.5, 256 if i % 2 == 0 else 64,
                            pause_before_s=18.0 if i % 2 == 0 else 12.0, warmup_steps=2))
    costs = RescaleCostEstimator()
    costs.extend(synthesize(segs, noise=0.05, seed=11))
    c = costs.costs()
    assert c.n_up == 5 and c.n_down == 5
    assert c.up_s == pytest.approx(18.0, abs=0.1)
    assert c.down_s == pytest.approx(12.0, abs=0.1)


def test_incremental_rescale_event_closes_after_settling() -> None:
    recs = synthesize([Segment(1, 5, 1.0, 10), Segment(2, 8, 1.0, 20, pause_before_s=7.0)])
    est = RescaleCostEstimator(warmup_steps=2, settle_steps=3)
    est.extend(recs[:5 + 1 + 2 + 2])  # anchor + warm-up + 2 of the 3 settle steps
    assert est.pending and est.events() == []
    assert est.costs().n_up == 0 and est.costs().up_s is None
    est.add(recs[10])
    assert not est.pending
    assert [e.pause_s for e in est.events()] == pytest.approx([7.0])
    assert est.costs().up_s == pytest.approx(7.0) and est.costs().down_s is None


def test_rescale_before_settling_uses_old_step_time() -> None:
    # the job rescales again right after the anchor record at 4 nodes: no step at 4 is known
    recs = synthesize(
        [
            Segment(1, 10, 2.0, 10),
            Segment(4, 1, 2.0, 40, pause_before_s=5.0),
            Segment(1, 10, 2.0, 10, pause_before_s=3.0),
        ]
    )
    events = rescale_events(recs)
    assert [(e.from_size, e.to_size) for e in events] == [(1, 4), (4, 1)]
    assert events[0].pause_s == pytest.approx(5.0)  # old size's median step (2 s) subtracted
    assert events[1].pause_s == pytest.approx(3.0)


def test_median_ci_orders_and_brackets() -> None:
    med, lo, hi = median_ci([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (med, lo, hi) == (3.0, 1.0, 5.0)
    med, lo, hi = median_ci(float(i) for i in range(1, 101))
    assert lo < med < hi and med == 50.5 and 35 <= lo <= 45 and 55 <= hi <= 65
    with pytest.raises(ValueError):
        median_ci([])


segment_st = st.builds(
    Segment,
    world_size=st.integers(1, 16),
    steps=st.integers(1, 12),
    step_s=st.floats(0.05, 5.0),
    samples=st.integers(1, 4096),
    pause_before_s=st.floats(0.0, 30.0),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(segment_st, min_size=1, max_size=8))
def test_property_noise_free_streams(raw: list[Segment]) -> None:
    # drop a segment at the same size as the one before it: every listed boundary is a real rescale
    segs = [s for i, s in enumerate(raw) if i == 0 or s.world_size != raw[i - 1].world_size]
    recs = synthesize(segs)
    inc = ThroughputEstimator(window=None)
    inc.extend(recs)
    assert inc.estimates() == throughput_by_world_size(recs)
    for ws, e in inc.estimates().items():
        truths = {s.samples / s.step_s for s in segs if s.world_size == ws}
        assert any(math.isclose(e.rate, t, rel_tol=1e-6) for t in truths) or len(truths) > 1
        assert e.n_steps >= 1
    events = rescale_events(recs)
    changes = [(a, b) for a, b in zip(segs, segs[1:]) if a.world_size != b.world_size]
    assert [(e.from_size, e.to_size) for e in events] == [(a.world_size, b.world_size) for a, b in changes]
    for ev, (a, b) in zip(events, changes):
        assert ev.pause_s >= 0.0
        if b.steps >= 4:  # anchor + 2 warm-up + 1 steady step at the new size: exact
            assert ev.pause_s == pytest.approx(b.pause_before_s, abs=1e-6)


step_st = st.tuples(st.floats(0.01, 2.0), st.integers(1, 8))
run_st = st.tuples(st.integers(1, 3), st.lists(step_st, min_size=1, max_size=30))


@settings(max_examples=80, deadline=None)
@given(st.lists(run_st, min_size=1, max_size=5), st.sampled_from([None, 5, 8]))
def test_estimates_are_those_of_the_sorted_window(runs: list[tuple[int, list[tuple[float, int]]]],
                                                  window: int | None) -> None:
    # the window is kept sorted as rates come and go: every estimate is the one median_ci of the
    # window in arrival order gives (equal rates and evictions included)
    est = ThroughputEstimator(warmup_steps=1, window=window, min_steps=5)
    t = 0.0
    rates: dict[int, list[float]] = {}
    last_ws, pos = 0, 0
    for ws, dt, samples in ((ws, dt, samples) for ws, run in runs for dt, samples in run):
        prev, t = t, float(round(t + max(0.1, round(dt, 1)), 1))  # repeated rates
        pos = pos + 1 if ws == last_ws else 1
        est.add(Record(samples, t, ws))
        if pos > 2:  # past the segment's first record and its warm-up step
            rates.setdefault(ws, []).append(samples / (t - prev))
        last_ws = ws
        for size, all_rates in rates.items():
            kept = all_rates if window is None else all_rates[-window:]
            med, lo, hi = median_ci(kept)
            e = est.estimate(size)
            assert e is not None and (e.rate, e.n_steps, e.total_steps) == (med, len(kept), len(all_rates))
            assert e.rel_ci == ((hi - lo) / (2.0 * med) if len(kept) >= 5 else math.inf)


def test_noisy_records_are_uniform_draws_of_their_seed() -> None:
    # synthesize's noise is random.Random(seed).uniform(1 - noise, 1 + noise) per step, whatever the
    # generator does to draw it fast
    import random

    rng = random.Random(11)
    recs = synthesize([Segment(2, 6, 0.5, 64, warmup_steps=2, warmup_factor=2.0)], start=3.0, noise=0.03, seed=11)
    t = 3.0
    for i, rec in enumerate(recs):
        t += 0.5 * (2.0 if 1 <= i <= 2 else 1.0) * rng.uniform(0.97, 1.03)
        assert rec == Record(64, t, 2)


def test_a_streams_rescales_are_found_and_summarised_once_each() -> None:
    from profiler.estimators import RescaleSummary
    from profiler.records import iter_records

    segs = [Segment(2, 30, 0.5, 512, warmup_steps=2), Segment(4, 40, 0.3, 1024, pause_before_s=7.0),
            Segment(2, 12, 0.5, 512, pause_before_s=3.0)]
    costs = RescaleCostEstimator()
    costs.extend(iter_records(segs, start=1.0, noise=0.03, seed=5))
    costs.flush()
    events = costs.events()
    assert [(e.from_size, e.to_size) for e in events] == [(2, 4), (4, 2)]
    assert events[0].pause_s == pytest.approx(7.0, abs=0.2) and events[1].pause_s == pytest.approx(3.0, abs=0.2)
    summary = RescaleSummary()
    for event in events:
        summary.add(event)
    assert summary.costs() == summarize_rescales(events)
    with pytest.raises(RecordError, match="samples"):
        Record(0, 1.0, 1)


@given(st.lists(st.tuples(st.booleans(), st.floats(0.0, 100.0)), max_size=12))
@settings(max_examples=60, deadline=None)
def test_rescale_summary_is_summarize_rescales(pauses: list[tuple[bool, float]]) -> None:
    from profiler.estimators import RescaleEvent, RescaleSummary

    import statistics

    events = [RescaleEvent(2, 4 if up else 1, p, float(i), p + 1.0) for i, (up, p) in enumerate(pauses)]
    summary = RescaleSummary()
    for k, e in enumerate(events, start=1):
        summary.add(e)  # read after every event: the summary kept is always the one of all so far
        ups = [x.pause_s for x in events[:k] if x.is_up]
        downs = [x.pause_s for x in events[:k] if not x.is_up]
        expected = RescaleCosts(statistics.median(ups) if ups else None,
                                statistics.median(downs) if downs else None, len(ups), len(downs))
        assert summary.costs() == expected
    assert summarize_rescales(events) == (summary.costs() if events else RescaleCosts(None, None, 0, 0))
