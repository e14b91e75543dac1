"""Synthetic traces: the embedded Summit model, fitting, KS distance, nodes-csv round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import traces
from traces import synthetic
from traces.bursts import idle_pool_ks
from traces.nodes_csv import write_nodes_csv
from traces.stats import fragment_lengths, trace_stats
from traces_helpers import assert_alternating, read_cached as _read



def test_ks_distance() -> None:
    assert synthetic.ks_distance([1, 2, 3], [1, 2, 3]) == 0.0
    assert synthetic.ks_distance([1, 2], [5, 6, 7]) == 1.0
    assert synthetic.ks_distance([1, 2, 3, 4], [3, 4, 5, 6]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="non-empty"):
        synthetic.ks_distance([], [1])


def test_summit_like_needs_no_data_and_matches_summit(summit_nodes: Path, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("MALLETRAIN_DATA", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    tl = synthetic.summit_like(seed=0)
    assert tl.n_nodes == 4608 and tl.span == 7 * 86400 and tl.start == 0.0
    assert "SYNTHETIC" in tl.source
    assert_alternating(tl)
    s = trace_stats(tl)
    real = _read(summit_nodes)
    assert s.idle_fraction == pytest.approx(trace_stats(real).idle_fraction, abs=0.01)
    assert synthetic.ks_distance(fragment_lengths(tl), fragment_lengths(real)) <= 0.05  # measured 0.045
    assert idle_pool_ks(tl, real) <= 0.10  # measured 0.060
    assert s.peak_idle > 3000  # bursts: the real week peaks at 4083; independent nodes gave 402


def test_independent_nodes_have_no_bursts(summit_nodes: Path) -> None:
    tl = synthetic.summit_like(seed=0, bursty=False)
    real = _read(summit_nodes)
    assert synthetic.ks_distance(fragment_lengths(tl), fragment_lengths(real)) < 0.04  # measured 0.028
    assert trace_stats(tl).peak_idle < 600
    assert idle_pool_ks(tl, real) > 0.3  # why the bursty model is the default


def test_bursty_generation_is_deterministic_and_fits_small_machines() -> None:
    a = synthetic.summit_like(64, 3 * 86400, seed=5)
    b = synthetic.summit_like(64, 3 * 86400, seed=5)
    assert a.times.tolist() == b.times.tolist() and a.initial_idle == b.initial_idle
    assert_alternating(a)
    _, counts = a.idle_counts()
    assert counts.max() <= int(synthetic.SUMMIT_BURSTS.peak_fraction * 64)
    tiny = synthetic.summit_like(16, 86400, 3)  # the daemon's local backend: summit_like(nodes, duration, seed)
    assert tiny.n_nodes == 16 and tiny.span == 86400
    assert_alternating(tiny)
    with pytest.raises(ValueError, match="not both"):
        synthetic.generate(10, 100, fragments=synthetic.SUMMIT, bursts=synthetic.SUMMIT_BURSTS)


def test_bursty_idle_fraction_over_seeds() -> None:
    fractions = [trace_stats(synthetic.summit_like(512, 7 * 86400, seed=k)).idle_fraction for k in range(4)]
    assert np.mean(fractions) == pytest.approx(synthetic.SUMMIT.idle_fraction, abs=0.015)


def test_idle_pool_ks() -> None:
    a = synthetic.generate(50, 86400, seed=1)
    assert idle_pool_ks(a, a) == 0.0
    assert idle_pool_ks(a, a.shifted(100.0)) == 0.0  # time-weighted distributions, not times
    b = synthetic.generate(50, 86400, seed=1, fragments=synthetic.FragmentModel(
        floor_s=30.0, weights=(1.0,), mus=(6.0,), sigmas=(0.5,), idle_fraction=0.6, busy_sigma=0.8))
    assert idle_pool_ks(a, b) > 0.9


def test_generate_is_deterministic_per_seed() -> None:
    a = synthetic.generate(50, 86400, seed=3, start=1000.0)
    b = synthetic.generate(50, 86400, seed=3, start=1000.0)
    c = synthetic.generate(50, 86400, seed=4, start=1000.0)
    assert a.times.tolist() == b.times.tolist() and a.initial_idle == b.initial_idle
    assert a.times.tolist() != c.times.tolist()
    assert (a.start, a.end) == (1000.0, 1000.0 + 86400)
    assert np.all(a.times == np.round(a.times))
    with pytest.raises(ValueError, match="n_nodes"):
        synthetic.generate(0, 10)


def test_generate_hits_the_idle_fraction_of_any_model() -> None:
    model = synthetic.FragmentModel(
        floor_s=30.0, weights=(1.0,), mus=(6.0,), sigmas=(0.5,), idle_fraction=0.4, busy_sigma=0.8
    )
    tl = synthetic.generate(300, 20 * 86400, fragments=model, seed=1)
    assert trace_stats(tl).idle_fraction == pytest.approx(0.4, abs=0.02)
    lengths = fragment_lengths(tl)
    assert lengths.min() >= 30
    assert np.median(lengths) == pytest.approx(30 + np.exp(6.0), rel=0.05)


def test_fit_recovers_a_known_model() -> None:
    truth = synthetic.FragmentModel(
        floor_s=60.0, weights=(0.3, 0.7), mus=(3.0, 7.0), sigmas=(0.5, 0.8), idle_fraction=0.2, busy_sigma=1.0
    )
    fitted = synthetic.fit_fragments(synthetic.generate(400, 30 * 86400, fragments=truth, seed=2), components=2)
    assert fitted.weights == pytest.approx(truth.weights, abs=0.05)
    assert fitted.mus == pytest.approx(truth.mus, abs=0.25)
    assert fitted.idle_fraction == pytest.approx(0.2, abs=0.02)


@pytest.mark.slow
def test_embedded_summit_model_is_a_fresh_fit(summit_nodes: Path) -> None:
    real = _read(summit_nodes)
    fresh = synthetic.fit_fragments(real)
    assert fresh == synthetic.SUMMIT
    assert synthetic.fit_bursts(real, fresh) == synthetic.SUMMIT_BURSTS


def test_fit_rejects_too_few_fragments() -> None:
    tl = synthetic.generate(2, 600, seed=0)
    with pytest.raises(ValueError, match="too few"):
        synthetic.fit_fragments(tl)


def test_model_validation() -> None:
    with pytest.raises(ValueError, match="sum to 1"):
        synthetic.FragmentModel(0.0, (0.5, 0.6), (1.0, 2.0), (1.0, 1.0), 0.1, 1.0)
    with pytest.raises(ValueError, match="idle_fraction"):
        synthetic.FragmentModel(0.0, (1.0,), (1.0,), (1.0,), 1.5, 1.0)


@pytest.mark.parametrize("name", ["synth.csv", "synth.csv.gz"])
def test_nodes_csv_round_trip(tmp_path: Path, name: str) -> None:
    tl = synthetic.generate(40, 3 * 86400, seed=5, start=1.6e9)
    back = traces.read(write_nodes_csv(tl, tmp_path / name))
    assert back.format == "nodes-csv"
    assert (back.nodes, back.start, back.end, back.initial_idle) == (tl.nodes, tl.start, tl.end, tl.initial_idle)
    assert back.times.tolist() == tl.times.tolist()
    assert back.node_ids.tolist() == tl.node_ids.tolist()
    assert back.idle.tolist() == tl.idle.tolist()


def test_resolution_puts_every_change_on_the_grid_and_keeps_alternation():
    from traces.synthetic import generate

    tl = generate(50, 86400, seed=3, start=1000.0, resolution_s=30)
    offsets = tl.times - 1000.0
    assert tl.n_events > 0
    assert np.all(np.mod(offsets, 30) == 0)
    state = {n: (n in tl.initial_idle) for n in tl.nodes}
    for ev in tl.events():
        assert state[ev.node] != ev.idle, f"{ev.node} changed to the state it was in at {ev.time}"
        state[ev.node] = ev.idle
    with pytest.raises(ValueError, match="resolution_s"):
        generate(5, 100, resolution_s=0.5)
