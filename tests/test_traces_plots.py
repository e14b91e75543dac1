"""Figures: long logs aggregated, units on axes, SYNTHETIC in every title of a generated trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from traces import IdleTimeline, synthetic
from traces.plots import bin_idle, draw_idle, label, plot_trace


def _timeline(span: float, reports: list[tuple[float, int, bool]], n: int = 2) -> IdleTimeline:
    return IdleTimeline.from_arrays(
        source="/x/log.swf", format="swf", nodes=[f"n{k}" for k in range(n)], start=0.0, end=span,
        initial_idle=np.zeros(n, bool), times=np.array([r[0] for r in reports], float),
        node_ids=np.array([r[1] for r in reports], np.int64), idle=np.array([r[2] for r in reports], bool),
    )


def test_bin_idle_mean_and_max() -> None:
    tl = _timeline(7200.0, [(1800, 0, True), (2700, 1, True), (3000, 1, False), (5400, 0, False)])
    b = bin_idle(tl, 3600.0)
    assert b.starts_s.tolist() == [0.0, 3600.0]
    assert b.mean.tolist() == pytest.approx([(1800 * 1 + 300 * 1) / 3600, 1800 / 3600])
    assert b.peak.tolist() == [2, 1]


def test_long_logs_are_aggregated_and_axes_have_units() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for days, how in ((7, "every change"), (30, "hourly mean and max"), (333, "daily mean and max")):
        tl = synthetic.generate(10, days * 86400.0, seed=1)
        fig, ax = plt.subplots()
        assert draw_idle(ax, tl) == how
        assert "days" in ax.get_xlabel() and "count" in ax.get_ylabel()
        plt.close(fig)


def test_synthetic_says_so_in_titles(tmp_path: Path) -> None:
    tl = synthetic.summit_like(64, 86400, 1)
    assert label(tl).startswith("SYNTHETIC")
    assert label(_timeline(10.0, [])) == "log.swf"
    paths = plot_trace(tl, tmp_path)
    assert [p.name for p in paths] == ["idle_nodes.png", "fragment_cdf.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
