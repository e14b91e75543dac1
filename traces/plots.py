"""Figures of a timeline: idle nodes over time (MalleTrain Fig. 3.8), fragment-length CDF (Fig. 3.7),
and a synthetic trace against the real one it was fitted to (Fig. 3.9).

Readable by construction: past ``AGGREGATE_AFTER_S`` hourly (past ``DAILY_AFTER_S`` daily) mean
and max, not a solid block of steps; two timelines in panels on one scale; units on every axis;
SYNTHETIC in a synthetic timeline's title; legends outside the axes (:func:`legend_outside`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traces.model import IdleTimeline
from traces.stats import fragment_lengths

AGGREGATE_AFTER_S = 14 * 86400
DAILY_AFTER_S = 120 * 86400
IDLE_COLOUR = "#1f4e9c"
MAX_COLOUR = "#9fb8e0"
REAL_COLOUR = "#222222"
SYNTH_COLOUR = "#d95f02"


def label(tl: IdleTimeline) -> str:
    """A short name for titles: the file name, prefixed SYNTHETIC when generated."""
    name = Path(tl.source).name if not tl.source.startswith("SYNTHETIC") else tl.source
    return name if not tl.is_synthetic or name.startswith("SYNTHETIC") else f"SYNTHETIC {name}"


@dataclass(frozen=True)
class Binned:
    """Idle nodes per bin: time-weighted mean and max; ``width_s`` the bin width."""

    starts_s: np.ndarray  # bin start, seconds after the timeline's start
    mean: np.ndarray
    peak: np.ndarray
    width_s: float


def bin_idle(tl: IdleTimeline, width_s: float) -> Binned:
    """Time-weighted mean and the max of the idle-node count in bins of ``width_s`` seconds."""
    t, c = tl.idle_counts()
    n_bins = max(1, int(np.ceil(tl.span / width_s)))
    edges = tl.start + width_s * np.arange(n_bins + 1)
    edges[-1] = max(edges[-1], tl.end)
    # integral of the step function at each edge, by interpolation of its cumulative integral
    seg_end = np.append(t[1:], tl.end)
    cum = np.concatenate(([0.0], np.cumsum(c * (seg_end - t))))
    knots = np.append(t, tl.end)
    at_edges = np.interp(np.minimum(edges, tl.end), knots, cum)
    lengths = np.diff(np.minimum(edges, tl.end))
    mean = np.divide(np.diff(at_edges), lengths, out=np.zeros(n_bins), where=lengths > 0)
    # max: the value in force at each bin start, and every value set inside the bin
    which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, n_bins - 1)
    peak = np.zeros(n_bins)
    np.maximum.at(peak, which, c)
    first = np.searchsorted(t, edges[:-1], side="right") - 1
    peak = np.maximum(peak, c[np.clip(first, 0, c.size - 1)])
    return Binned(edges[:-1] - tl.start, mean, peak, width_s)


def legend_outside(ax, below: bool = False, fontsize: int = 8) -> None:  # type: ignore[no-untyped-def]
    """The legend of ``ax`` outside its data area: to the right (default) or below, so it covers nothing.
    Save the figure with ``bbox_inches="tight"`` so it is not cut off."""
    if below:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=fontsize, frameon=False)
    else:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=fontsize, frameon=False)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pyplot_or_none(warning: str):
    """:func:`pyplot`, or None after printing ``warning`` on stderr where matplotlib is not installed."""
    try:
        return pyplot()
    except ImportError:
        print(warning, file=sys.stderr)
        return None


def draw_idle(ax, tl: IdleTimeline, colour: str = IDLE_COLOUR) -> str:  # type: ignore[no-untyped-def]
    """Idle nodes over time on ``ax``; returns how it was drawn (for the title)."""
    days = tl.span > 3 * 86400
    unit, scale = ("days", 86400.0) if days else ("hours", 3600.0)
    if tl.span > AGGREGATE_AFTER_S:
        width = 86400.0 if tl.span > DAILY_AFTER_S else 3600.0
        b = bin_idle(tl, width)
        x = np.append(b.starts_s, b.starts_s[-1] + width) / scale
        ax.fill_between(x, np.append(b.peak, b.peak[-1]), step="post", color=MAX_COLOUR, linewidth=0,
                        label=f"{'daily' if width == 86400 else 'hourly'} max", zorder=1)
        ax.step(x, np.append(b.mean, b.mean[-1]), where="post", color=colour, linewidth=0.9,
                label=f"{'daily' if width == 86400 else 'hourly'} mean", zorder=3)
        legend_outside(ax)
        how = f"{'daily' if width == 86400 else 'hourly'} mean and max"
    else:
        t, c = tl.idle_counts()
        x = (np.append(t, tl.end) - tl.start) / scale
        ax.step(x, np.append(c, c[-1]), where="post", linewidth=0.6, color=colour, zorder=3)
        how = "every change"
    ax.set_xlabel(f"time since start ({unit}; start {_utc(tl.start)})")
    ax.set_ylabel("idle nodes (count)")
    ax.set_xlim(0, max(tl.span / scale, 1e-9))
    ax.set_ylim(0, max(1, tl.n_nodes) * 1.02)
    ax.grid(True, alpha=0.3)
    return how


def _utc(t: float) -> str:
    from datetime import datetime, timezone

    if not 1e8 <= t < 4e9:  # relative times (synthetic traces start at 0; SWF without UnixStartTime)
        return f"t={t:g} s"
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def plot_trace(tl: IdleTimeline, out_dir: str | Path) -> list[Path]:
    """Write ``idle_nodes.png`` and ``fragment_cdf.png`` into ``out_dir``; return their paths."""
    plt = pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = label(tl)
    paths = [out / "idle_nodes.png", out / "fragment_cdf.png"]

    fig, ax = plt.subplots(figsize=(10, 3.8))
    how = draw_idle(ax, tl)
    ax.set_title(f"Idle nodes over time: {name} ({tl.n_nodes} nodes, {how})", fontsize=10)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=120, bbox_inches="tight")
    plt.close(fig)

    lengths = fragment_lengths(tl)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    draw_cdf(ax, {name: (lengths, IDLE_COLOUR)})
    ax.set_title(f"Idle fragment lengths, CDF\n{name}: {lengths.size} fragments", fontsize=10)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths


def draw_cdf(ax, series: dict[str, tuple[np.ndarray, str]]) -> None:  # type: ignore[no-untyped-def]
    drawn = False
    for k, (name, (lengths, colour)) in enumerate(series.items()):
        x = np.sort(lengths)
        if x.size:
            ax.step(x / 60, np.arange(1, x.size + 1) / x.size, where="post", color=colour, label=name,
                    linewidth=1.6 if k == 0 else 1.1, linestyle="-" if k == 0 else "--")
            drawn = True
    if drawn:
        ax.set_xscale("log")
        if len(series) > 1:
            legend_outside(ax, below=True)
    else:
        ax.text(0.5, 0.5, "no complete idle fragment", ha="center", transform=ax.transAxes)
    ax.set_xlabel("idle fragment length (minutes, log scale)")
    ax.set_ylabel("fraction of fragments (CDF)")
    ax.set_ylim(0, 1)
    ax.grid(True, which="both", alpha=0.3)


def plot_comparison(real: IdleTimeline, synth: IdleTimeline, out_dir: str | Path, ks: dict[str, float]) -> Path:
    """``synthetic_vs_real.png``: both idle-node series (own panels, one scale), fragment and pool CDFs."""
    plt = pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "synthetic_vs_real.png"
    fig = plt.figure(figsize=(11, 8.5))
    grid = fig.add_gridspec(3, 2, height_ratios=(1, 1, 1.3))
    top = fig.add_subplot(grid[0, :])
    mid = fig.add_subplot(grid[1, :], sharey=top)
    draw_idle(top, real, REAL_COLOUR)
    top.set_title(f"REAL: {label(real)} ({real.n_nodes} nodes)", fontsize=10)
    draw_idle(mid, synth, SYNTH_COLOUR)
    mid.set_title(f"SYNTHETIC: {synth.n_nodes} nodes, fitted to {label(real)}", fontsize=10)
    top.set_ylim(0, max(real.n_nodes, synth.n_nodes) * 1.02)
    left = fig.add_subplot(grid[2, 0])
    draw_cdf(left, {f"real {label(real)}": (fragment_lengths(real), REAL_COLOUR),
                     "SYNTHETIC": (fragment_lengths(synth), SYNTH_COLOUR)})
    left.set_title(f"Idle fragment lengths (KS {ks.get('fragments', float('nan')):.3f})", fontsize=10)
    right = fig.add_subplot(grid[2, 1])
    for k, (name, tl, colour) in enumerate((("real", real, REAL_COLOUR), ("SYNTHETIC", synth, SYNTH_COLOUR))):
        v, w = _pool(tl)
        order = np.argsort(v, kind="stable")
        right.step(100 * v[order], np.cumsum(w[order]) / w.sum(), where="post", color=colour, label=name,
                   linewidth=1.6 if k == 0 else 1.1, linestyle="-" if k == 0 else "--")
    right.set_xlabel("idle nodes (% of the machine)")
    right.set_ylabel("fraction of time (CDF)")
    right.set_ylim(0, 1)
    right.grid(True, alpha=0.3)
    legend_outside(right, below=True)
    right.set_title(f"Idle-pool size over time (KS {ks.get('pool', float('nan')):.3f})", fontsize=10)
    fig.suptitle("SYNTHETIC trace against the real log it was fitted to", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _pool(tl: IdleTimeline) -> tuple[np.ndarray, np.ndarray]:
    t, c = tl.idle_counts()
    return c / max(1, tl.n_nodes), np.diff(np.append(t, tl.end))
