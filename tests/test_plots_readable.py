"""Plots a person can read: no legend over data, SYNTHETIC in every title of a synthetic
run, and a job-progress plot that shows a band of jobs with a few named ones on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from evaluation.replay_report import highlighted_jobs, progress_by_age, run_title, write_plots  # noqa: E402
from test_simulator import job, run, timeline  # noqa: E402


@pytest.fixture
def saved(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Every figure saved while the test runs: its titles and whether a legend overlaps an axes."""
    seen: list[dict] = []
    real_savefig = Figure.savefig

    def savefig(fig: Figure, *args, **kwargs):  # type: ignore[no-untyped-def]
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        boxes = [ax.get_window_extent(renderer) for ax in fig.axes]
        covering = [ax.get_title() for ax in fig.axes if ax.get_legend() is not None
                    and any(ax.get_legend().get_window_extent(renderer).overlaps(b) for b in boxes)]
        seen.append({"titles": [ax.get_title() for ax in fig.axes] + [fig._suptitle.get_text() if fig._suptitle
                                                                       else ""], "covering": covering})
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return seen


def _replay():  # type: ignore[no-untyped-def]
    tl = timeline(["n0", "n1"], ["n0", "n1"], [(100.0, "n1", False), (200.0, "n1", True)], end=2000.0)
    specs = [job("short", samples=2000.0), job("mid", samples=8000.0, arrival=10.0),
             job("long", samples=1e9, arrival=20.0), job("late", samples=500.0, arrival=1500.0)]
    return run(tl, specs, "greedy", max_running=1)


def test_simulator_plots_keep_legends_off_the_data_and_say_synthetic(tmp_path: Path, saved: list[dict]) -> None:
    res = _replay()
    res.summary["trace"] = "SYNTHETIC bursty(n_nodes=2)"
    assert [p.name for p in write_plots(res, tmp_path)] == ["idle-vs-used.png", "job-progress.png"]
    assert len(saved) == 2 and all(s["covering"] == [] for s in saved)
    assert all(s["titles"][0].startswith("SYNTHETIC ") for s in saved)


def test_run_title_says_synthetic_for_a_generated_trace_or_generated_curves() -> None:
    assert run_title({"policy": "jpa", "trace": "summit.csv.gz", "synthetic_scaling": False}) == "jpa"
    assert run_title({"policy": "jpa", "trace": "SYNTHETIC bursty(...)"}) == "SYNTHETIC jpa"
    assert run_title({"policy": "jpa", "trace": "summit.csv.gz", "synthetic_scaling": True}) == "SYNTHETIC jpa"


def test_progress_by_age_follows_each_job_from_its_submission() -> None:
    res = _replay()
    p = progress_by_age(res, points=50)
    assert p.names == ("short", "mid", "long", "late")
    done = dict(zip(p.names, p.done_after_h))
    assert done["short"] is not None and done["long"] is None
    short = p.percent[0][~np.isnan(p.percent[0])]
    assert short[0] >= 0 and short[-1] == pytest.approx(100.0) and np.all(np.diff(short) >= -1e-9)
    # "late" came 1,500 s in: the replay ended 500 s after, so its later ages are unknown, not 0
    late = p.percent[3]
    assert np.isnan(late[p.hours > 600 / 3600]).all() and not np.isnan(late[p.hours < 400 / 3600]).any()
    picks = highlighted_jobs(p)
    assert [p.names[i] for i, _ in picks][-1] == "long" and len({i for i, _ in picks}) == len(picks)
    assert picks[0][1].startswith("fastest: done in")


def test_trace_plots_keep_legends_off_the_data(tmp_path: Path, saved: list[dict]) -> None:
    from traces.plots import plot_comparison, plot_trace
    from traces.synthetic import generate

    real = timeline(["a", "b", "c"], ["a"], [(50.0, "b", True), (400.0, "a", False), (900.0, "c", True)], end=3000.0)
    synth = generate(3, 3000.0, seed=1)
    plot_trace(synth, tmp_path)
    plot_comparison(real, synth, tmp_path, {"fragments": 0.1, "pool": 0.2})
    assert all(s["covering"] == [] for s in saved)
    assert all("SYNTHETIC" in s["titles"][0] for s in saved[:2])  # idle nodes and fragment CDF of synth


def test_demo_plot_keeps_its_legend_off_the_data_and_says_synthetic(tmp_path: Path, saved: list[dict]) -> None:
    from malletrain.cli.demo import write_report

    series = [{"t": float(t), "idle": 4, "held": 4, "used": 3, "jobs": {"j1": 2, "j2": 1}} for t in range(0, 60, 5)]
    report = {"runtime": "toy", "duration_s": 60.0, "nodes": series, "recalls_of_held_nodes": [20.0],
              "leftover_processes": 0, "max_planned_pause_s": 0.1, "max_recall_recovery_s": 0.2,
              "jobs": [{"id": "j1", "name": "cnn", "state": "running", "samples": 10, "min_nodes": 1, "max_nodes": 4,
                        "profile": True, "scaling_measured": {}, "states": [], "rescales": []},
                       {"id": "j2", "name": "mlp", "state": "running", "samples": 10, "min_nodes": 1, "max_nodes": 3,
                        "profile": False, "scaling_measured": {}, "states": [], "rescales": []}]}
    write_report(tmp_path, report)
    assert (tmp_path / "nodes.png").exists()
    assert len(saved) == 1 and saved[0]["covering"] == [] and "SYNTHETIC" in saved[0]["titles"][0]
