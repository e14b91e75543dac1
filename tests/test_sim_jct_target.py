"""The completion-time target (the unsaturated regime: every job finishes) fails on a default that does
not finish jobs sooner than the best fixed-prior baseline, and every real cell reports the default's
completion time against that baseline on the seeds where both finished every job."""

from __future__ import annotations

from simulator.evaluate import MIN_SEEDS, EvalSettings, Evaluation
from simulator.evaluation_report import headline_lines
from simulator.regimes import SATURATED, UNSATURATED, jct_target, regime
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
    line = [h for h in headline_lines(ev, cell) if "mean JCT" in h]
    assert line == ["mean JCT vs freetrain:mean, seeds on which both finished every job: malletrain 0.900x, "
                    f"p95 0.900x ({MIN_SEEDS - 1} seeds); milp-true 0.800x, p95 0.800x ({MIN_SEEDS - 1} seeds)"]
