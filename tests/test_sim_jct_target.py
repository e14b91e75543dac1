"""The completion-time target (the unsaturated regime: every job finishes) fails on a default that does
not finish jobs sooner than the best fixed-prior baseline, and every real cell reports the default's
completion time against that baseline on the seeds where both finished every job."""

from __future__ import annotations

from evaluation.results import MIN_SEEDS, EvalSettings, Evaluation
from evaluation.report import headline_lines
from evaluation.regimes import SATURATED, UNSATURATED, jct_target, regime
from tests.test_sim_targets import spec_of, summary

LOAD = "philly-done@0.2"


def done(jct_h: float, p95_h: float, finished: int = 100) -> dict:
    return summary(100.0, jobs_submitted=100, jobs_completed=finished, jct_mean_seconds=jct_h * 3600.0,
                   jct_p95_seconds=p95_h * 3600.0)


def evaluation(jcts: dict[str, tuple[float, float]], seeds: int = MIN_SEEDS, unfinished_seed: int | None = None,
               ) -> Evaluation:
    runs = [(spec_of(label, LOAD, k), done(m, p, 99 if k == unfinished_seed else 100))
            for k in range(seeds) for label, (m, p) in jcts.items()]
    return Evaluation(EvalSettings(seeds=tuple(range(seeds)), workloads=(LOAD,)), "t", "s", runs)


BASE = {"freetrain:mean": (1.0, 3.0), "freetrain:linear": (2.0, 5.0)}


def test_the_jct_target_needs_085_of_the_best_fixed_prior_baselines_mean_and_no_worse_p95():
    cases = [((0.80, 2.9), True), ((0.90, 2.9), False), ((0.80, 3.3), False)]
    for mine, passed in cases:
        ev = evaluation({"malletrain": mine, **BASE})
        cell = ev.cells()[0]
        assert regime(ev, cell) == UNSATURATED
        t = jct_target(ev, cell)
        assert t.passed is passed, (mine, t.value)
        assert "freetrain:mean" in t.name  # the baseline with the lowest mean JCT, not the linear prior
    few = evaluation({"malletrain": (0.5, 1.0), **BASE}, seeds=MIN_SEEDS - 1)
    assert not jct_target(few, few.cells()[0]).passed


def test_a_cell_where_the_default_leaves_a_job_is_saturated_and_still_reports_its_completion_time():
    ev = evaluation({"malletrain": (0.9, 2.7), "milp-true": (0.8, 2.4), **BASE}, unfinished_seed=2)
    cell = ev.cells()[0]
    assert regime(ev, cell) == SATURATED
    line = [h for h in headline_lines(ev, cell) if h.startswith("mean JCT")]
    assert line == ["mean JCT vs freetrain:mean, seeds on which both finished every job: malletrain 0.900x, "
                    f"p95 0.900x ({MIN_SEEDS - 1} seeds); milp-true 0.800x, p95 0.800x ({MIN_SEEDS - 1} seeds)"]
    # the share of the gap closed, on the same seeds: (1.0 - 0.9) / (1.0 - 0.8)
    assert any(h.startswith("completion time, share of the gap closed") and "**50% of the gap**" in h
               and f"{MIN_SEEDS - 1} seeds" in h for h in headline_lines(ev, cell))


def test_completion_time_is_reported_as_the_share_of_the_gap_closed_and_wait_dominated_cells_are_named():
    from evaluation.regimes import gap_share

    # B = freetrain:mean (1.0 h, the lowest of the baselines a user could configure), M = 0.8 h, D = 0.85 h:
    # the default closes (1.0 - 0.85) / (1.0 - 0.8) = 75% of the gap; its p95 2.2 h over M's 2.0 h
    ev = evaluation({"malletrain": (0.85, 2.2), "milp-true": (0.8, 2.0), "freetrain:noise:20": (0.7, 1.5), **BASE})
    cell = ev.cells()[0]
    g = gap_share(ev.by_label(cell))
    assert g is not None and g.baseline == "freetrain:mean"  # never the reference handed each job's curve
    assert g.share is not None and abs(g.share - 0.75) < 1e-9
    assert abs(g.tail - 1.1) < 1e-9 and not g.wait_dominated and g.reference == "freetrain:noise:20"
    (line,) = [h for h in headline_lines(ev, cell) if "share of the gap" in h]
    assert "**75% of the gap**" in line and "p95 1.100x" in line
    # a fixed-Pjmax freetrain is a baseline a user could configure too: the lowest mean JCT is B
    fixed = evaluation({"malletrain": (0.85, 2.2), "milp-true": (0.8, 2.0), "freetrain-fixed:40": (0.9, 2.5), **BASE})
    g = gap_share(fixed.by_label(fixed.cells()[0]))
    assert g is not None and g.baseline == "freetrain-fixed:40" and abs(g.share - 0.5) < 1e-9
    # milp-true at 0.97x B: the jobs wait for the main queue's nodes; the cell is named, not scored
    waits = evaluation({"malletrain": (0.99, 3.0), "milp-true": (0.97, 3.0), **BASE})
    g = gap_share(waits.by_label(waits.cells()[0]))
    assert g is not None and g.wait_dominated
    (line,) = [h for h in headline_lines(waits, waits.cells()[0]) if "share of the gap" in h]
    assert "wait-dominated, not scored" in line


def test_the_share_of_the_gap_closed_is_written_in_the_evaluation_json(tmp_path):
    import json

    from evaluation.report import write_evaluation

    ev = evaluation({"malletrain": (0.85, 2.2), "milp-true": (0.8, 2.0), **BASE})
    write_evaluation(ev, tmp_path, "test")
    (cell,) = json.loads((tmp_path / "evaluation.json").read_text())["cells"]
    gap = cell["completion_gap"]
    assert gap["baseline"] == "freetrain:mean" and abs(gap["share"] - 0.75) < 1e-9 and gap["wait_dominated"] is False
    assert "share of the gap closed" in (tmp_path / "evaluation.md").read_text()
