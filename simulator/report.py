"""Outputs of a replay: summary.json, events.csv, PNG plots, text tables."""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import astuple, fields
from pathlib import Path
from typing import Sequence

from simulator.engine import DecisionRow, SimResult

EVENT_COLUMNS = tuple(f.name for f in fields(DecisionRow))
MAX_PLOTTED_JOBS = 300


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
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("malletrain simulate: warning: matplotlib not installed; no plots", file=sys.stderr)
        return []
    return [_plot_nodes(result, out / "idle-vs-used.png", plt), _plot_progress(result, out / "job-progress.png", plt)]


def _plot_nodes(result: SimResult, path: Path, plt) -> Path:  # type: ignore[no-untyped-def]
    hours = [(r.time - result.start) / 3600.0 for r in result.rows]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.step(hours, [r.idle_nodes for r in result.rows], where="post", label="idle (held) nodes", lw=0.7)
    ax.step(hours, [r.used_nodes for r in result.rows], where="post", label="used by training", lw=0.7)
    ax.set_xlabel("hours since start")
    ax.set_ylabel("nodes")
    ax.set_title(f"{result.summary['policy']}: idle vs used nodes")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_progress(result: SimResult, path: Path, plt) -> Path:  # type: ignore[no-untyped-def]
    fig, ax = plt.subplots(figsize=(10, 4))
    for job in result.jobs[:MAX_PLOTTED_JOBS]:
        if not job.history:
            continue
        xs = [(h[0] - result.start) / 3600.0 for h in job.history]
        ys = [100.0 * h[1] / job.spec.samples for h in job.history]
        ax.plot(xs, ys, lw=0.6)
    shown = min(len(result.jobs), MAX_PLOTTED_JOBS)
    ax.set_xlabel("hours since start")
    ax.set_ylabel("% of samples trained")
    ax.set_title(f"{result.summary['policy']}: per-job progress (first {shown} of {len(result.jobs)} jobs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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
