"""Outputs of a replay: summary.json, events.csv, PNG plots, text tables."""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Sequence

import numpy as np

from simulator.engine import DecisionRow, SimResult
from traces.plots import pyplot_or_none

EVENT_COLUMNS = tuple(f.name for f in fields(DecisionRow))


def write_outputs(result: SimResult, out: Path, plots: bool = True) -> list[Path]:
    """Write summary.json, events.csv and (if matplotlib is there) the plots into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = [write_summary(result, out / "summary.json"), write_events(result.rows, out / "events.csv")]
    if plots:
        written.extend(write_plots(result, out))
    return written


def write_summary(result: SimResult, path: Path) -> Path:
    path.write_text(json.dumps(result.summary, indent=2, sort_keys=False) + "\n")
    return path


def write_events(rows: Sequence[DecisionRow], path: Path) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(EVENT_COLUMNS)
        for row in rows:
            t, idle, used, running, queued, rescales, ms, constrained = astuple(row)
            writer.writerow((f"{t:.3f}", idle, used, running, queued, rescales, f"{ms:.3f}", int(constrained)))
    return path


def write_plots(result: SimResult, out: Path) -> list[Path]:
    """idle-vs-used.png and job-progress.png; skipped with a warning without matplotlib."""
    plt = pyplot_or_none("malletrain simulate: warning: matplotlib not installed; no plots")
    if plt is None:
        return []
    return [_plot_nodes(result, out / "idle-vs-used.png", plt), _plot_progress(result, out / "job-progress.png", plt)]


def run_title(summary: dict) -> str:
    """The policy's name, prefixed SYNTHETIC when the trace or the jobs' curves were generated."""
    synthetic = bool(summary.get("synthetic_scaling")) or str(summary.get("trace", "")).startswith("SYNTHETIC")
    return f"{'SYNTHETIC ' if synthetic else ''}{summary.get('policy', '?')}"


def _plot_nodes(result: SimResult, path: Path, plt) -> Path:  # type: ignore[no-untyped-def]
    from traces.plots import legend_outside

    hours = [(r.time - result.start) / 3600.0 for r in result.rows]
    fig, ax = plt.subplots(figsize=(10, 4))
    # idle as an area, used as a line on it: where training uses every idle node the line runs
    # along the area's top edge and both still show
    ax.fill_between(hours, [r.idle_nodes for r in result.rows], step="post", color="#9fb8e0", linewidth=0,
                    label="idle (held) nodes")
    ax.step(hours, [r.used_nodes for r in result.rows], where="post", color="#b2182b", lw=0.8,
            label="used by training")
    ax.set_xlabel("hours since start")
    ax.set_ylabel("nodes")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{run_title(result.summary)}: idle vs used nodes")
    legend_outside(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


@dataclass(frozen=True)
class ProgressByAge:
    """Every job's % of samples trained against hours since its submission, on ``hours`` (geometric
    from one minute: most jobs take minutes, some days); NaN once the replay ended before that age."""

    hours: np.ndarray
    percent: np.ndarray  # jobs x len(hours)
    names: tuple[str, ...]
    done_after_h: tuple[float | None, ...]  # hours from submission to completion, None if unfinished


MIN_AGE_H = 1 / 60  # the progress plot's first age: one minute


def progress_by_age(result: SimResult, points: int = 200) -> ProgressByAge:
    """Each job's progress as a function of its age (time since submission), on one grid of ages."""
    jobs = [j for j in result.jobs if j.submitted_at <= result.end]
    max_age = max((result.end - j.submitted_at for j in jobs), default=0.0)
    longest_h = max(max_age, 1.0) / 3600.0
    hours = np.geomspace(MIN_AGE_H, longest_h, points) if longest_h > 10 * MIN_AGE_H else np.linspace(0, longest_h, points)
    percent = np.full((len(jobs), points), np.nan)
    for row, job in enumerate(jobs):
        ts = [job.submitted_at] + [h[0] for h in job.history]
        ps = [0.0] + [h[1] for h in job.history]
        ts.append(job.finished_at if job.finished_at is not None else result.end)
        ps.append(job.spec.samples if job.finished_at is not None else job.progress)
        ages_h = (np.asarray(ts) - job.submitted_at) / 3600.0
        valid = hours <= (result.end - job.submitted_at) / 3600.0
        percent[row, valid] = 100.0 * np.interp(hours[valid], ages_h, ps) / job.spec.samples
    done = tuple(None if j.finished_at is None else (j.finished_at - j.submitted_at) / 3600.0 for j in jobs)
    return ProgressByAge(hours, percent, tuple(j.spec.name for j in jobs), done)


def highlighted_jobs(p: ProgressByAge) -> list[tuple[int, str]]:
    """Up to three jobs worth a line of their own: the fastest and the median to finish, and the
    slowest (an unfinished one, the oldest, when there is one)."""
    finished = sorted((h, i) for i, h in enumerate(p.done_after_h) if h is not None)
    unfinished = [i for i, h in enumerate(p.done_after_h) if h is None]
    picks: list[tuple[int, str]] = []
    if finished:
        picks.append((finished[0][1], f"fastest: done in {_age(finished[0][0])}"))
        mid = finished[len(finished) // 2]
        picks.append((mid[1], f"median: done in {_age(mid[0])}"))
    if unfinished:
        oldest = max(unfinished, key=lambda i: int(np.sum(~np.isnan(p.percent[i]))))
        last = p.percent[oldest][~np.isnan(p.percent[oldest])]
        picks.append((oldest, f"slowest: {last[-1] if last.size else 0:.0f}% at the end"))
    elif finished:
        picks.append((finished[-1][1], f"slowest: done in {_age(finished[-1][0])}"))
    unique: list[tuple[int, str]] = []
    for i, why in picks:  # one job may be both the fastest and the median
        if all(i != j for j, _ in unique):
            unique.append((i, why))
    return unique


def _age(hours: float) -> str:
    return f"{hours * 60:.0f} min" if hours < 1 else f"{hours:.1f} h"


def _plot_progress(result: SimResult, path: Path, plt) -> Path:  # type: ignore[no-untyped-def]
    """The jobs as a band (10th-90th percentile of % trained at each age, and the median), a few
    named jobs drawn on it: a person can read how long jobs take and how they stall."""
    import warnings

    from traces.plots import legend_outside

    p = progress_by_age(result)
    fig, ax = plt.subplots(figsize=(10, 4))
    counted = np.sum(~np.isnan(p.percent), axis=0) if p.percent.size else np.zeros(p.hours.size)
    enough = counted >= 5
    if p.percent.size and enough.any():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns past the oldest jobs
            lo, mid, hi = np.nanpercentile(p.percent[:, enough], (10, 50, 90), axis=0)
        x = p.hours[enough]
        ax.fill_between(x, lo, hi, color="#c6dbef", linewidth=0, label=f"10th-90th percentile of {len(p.names)} jobs")
        ax.plot(x, mid, color="#08519c", lw=1.6, label="median job")
    for (i, why), colour in zip(highlighted_jobs(p), ("#1b9e77", "#d95f02", "#7570b3")):
        ok = ~np.isnan(p.percent[i])
        ax.plot(p.hours[ok], p.percent[i][ok], color=colour, lw=1.1, ls="--", label=f"{p.names[i]} ({why})")
    ax.set_ylabel("% of its samples trained")
    ax.set_ylim(0, 102)
    if p.hours[0] > 0:
        ax.set_xscale("log")
        ax.set_xlabel("hours since the job was submitted (log scale)")
    else:
        ax.set_xlabel("hours since the job was submitted")
        ax.set_xlim(left=0)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_title(f"{run_title(result.summary)}: job progress by age ({len(p.names)} jobs)")
    legend_outside(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if abs(value) >= 1e6:
            return f"{value:.4g}"
        return f"{value:,.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


SUMMARY_ROWS = (
    "policy", "workload", "span_seconds", "idle_node_seconds", "used_node_seconds", "used_fraction",
    "work_node_seconds", "work_node_seconds_constrained", "work_node_seconds_unconstrained",
    "productive_fraction", "samples_processed", "jobs_submitted", "jobs_completed", "makespan_seconds",
    "jct_mean_seconds", "jct_p95_seconds", "wait_slowest_quarter_seconds", "longest_waiting_model", "rescales",
    "preemptions", "decisions", "decision_ms_p50", "decision_ms_p99", "wall_seconds",
)


def summary_table(summary: dict) -> str:
    width = max(len(k) for k in SUMMARY_ROWS)
    return "\n".join(f"{k:<{width}}  {_fmt(summary.get(k))}" for k in SUMMARY_ROWS)


COMPARE_COLUMNS = (
    "policy", "used_fraction", "work_node_seconds", "vs_oracle", "samples_processed", "jobs_completed",
    "makespan_seconds", "jct_mean_seconds", "rescales", "preemptions", "decision_ms_p50", "wall_seconds",
)


def comparison_rows(summaries: Sequence[dict]) -> list[dict]:
    """Each summary with ``vs_oracle`` = work (or makespan, if finite) relative to oracle's."""
    oracle = next((s for s in summaries if s["policy"] == "oracle"), None)
    rows = []
    for s in summaries:
        row = dict(s)
        row["vs_oracle"] = _ratio_to_oracle(s, oracle)
        rows.append(row)
    return rows


def _ratio_to_oracle(s: dict, oracle: dict | None) -> float | None:
    if oracle is None:
        return None
    if s.get("makespan_seconds") and oracle.get("makespan_seconds"):
        return oracle["makespan_seconds"] / s["makespan_seconds"]
    if oracle.get("work_node_seconds", 0) > 0:
        return s["work_node_seconds"] / oracle["work_node_seconds"]
    return None


def comparison_table(summaries: Sequence[dict]) -> str:
    rows = comparison_rows(summaries)
    cells = [list(COMPARE_COLUMNS)] + [[_fmt(r.get(c)) for c in COMPARE_COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COMPARE_COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in cells)


class ProgressBar:
    """A plain-text bar on stderr, drawn only on a TTY and at most once per percent."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.label = label
        self.enabled = enabled and sys.stderr.isatty()
        self._last = -1

    def __call__(self, fraction: float) -> None:
        if not self.enabled:
            return
        pct = int(max(0.0, min(1.0, fraction)) * 100)
        if pct == self._last:
            return
        self._last = pct
        filled = pct * 30 // 100
        sys.stderr.write(f"\r{self.label:<12} [{'#' * filled}{'.' * (30 - filled)}] {pct:3d}%")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self._last >= 0:
            sys.stderr.write("\n")
            sys.stderr.flush()
