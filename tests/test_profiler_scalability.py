"""Scalability model: fit, fallbacks, error on the real Summit measurements, refinement."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.model import Job
from curves import throughput_at
from profiler.scalability import (
    Scalability,
    ScalabilityError,
    ScalingModel,
    Source,
    curve_error_pct,
    fit_model,
    leave_one_out_errors,
    model_error,
    parse_scaling_table,
)

POW2 = (1, 2, 4, 8, 16, 32, 64)


def _summit(path: Path) -> dict[str, dict[int, float]]:
    table = parse_scaling_table(path.read_text(), origin=str(path))
    # the HPO setup repeats shufflenet's measurements: count each curve once
    return {m: pts for m, pts in table.items() if m != "shufflenet-hpo"}


def test_summit_table_parses(summit_scaling: Path) -> None:
    table = parse_scaling_table(summit_scaling.read_text(), origin=str(summit_scaling))
    assert len(table) == 8
    assert all(sorted(pts) == list(POW2) for pts in table.values())
    assert table["vgg16"][1] == pytest.approx(1193.3)


def test_model_error_on_summit_leave_one_out(summit_scaling: Path) -> None:
    """Hold back each interior count (2..32) of each of the 7 models and predict it.

    Threshold: mean error <= 3% and every point <= 12%. 3% is well inside the 5%
    relative CI the profiler accepts for a measured point, so the model adds less
    error than measuring does; the measured figure is 1.7% (benchmarks/bench_profiler.py).
    It must also beat the baseline the allocator would otherwise use,
    piecewise-linear interpolation between the neighbouring points (2.3%).
    """
    model_errs: list[float] = []
    interp_errs: list[float] = []
    for pts in _summit(summit_scaling).values():
        model_errs += leave_one_out_errors(pts).values()
        for h in POW2[1:-1]:
            rest = {n: v for n, v in pts.items() if n != h}
            interp_errs.append(abs(throughput_at(rest, h) - pts[h]) / pts[h] * 100)
    assert len(model_errs) == 7 * 5
    mean = sum(model_errs) / len(model_errs)
    assert mean <= 3.0
    assert max(model_errs) <= 12.0
    assert mean < sum(interp_errs) / len(interp_errs)


def test_model_extrapolates_from_a_partial_profile(summit_scaling: Path) -> None:
    """Profiled only up to 16 nodes, predicting 32 and 64: mean error <= 5% (measured about 3%)."""
    errs = [model_error({n: v for n, v in pts.items() if n <= 16}, {32: pts[32], 64: pts[64]})
            for pts in _summit(summit_scaling).values()]
    assert sum(errs) / len(errs) <= 5.0


def test_fit_recovers_an_exact_model() -> None:
    truth = ScalingModel(a=2e-6, b=1e-3, c=3e-5)
    model = fit_model({n: truth.predict(n) for n in POW2})
    for n in (1, 3, 12, 48, 64, 100):
        assert model.predict(n) == pytest.approx(truth.predict(n), rel=1e-6)


def test_one_point_is_linear_through_the_origin() -> None:
    model = fit_model({4: 100.0})
    assert (model.a, model.c) == (0.0, 0.0)
    assert model.predict(8) == pytest.approx(200.0)
    assert model.predict(1) == pytest.approx(25.0)
    assert model.predict(0) == 0.0


def test_two_points_fit_exactly_and_sublinearly() -> None:
    model = fit_model({1: 100.0, 2: 190.0})
    assert model.predict(1) == pytest.approx(100.0) and model.predict(2) == pytest.approx(190.0)
    assert 190.0 < model.predict(4) < 400.0


def test_superlinear_points_fall_back_to_a_nonnegative_fit() -> None:
    model = fit_model({1: 100.0, 2: 210.0})
    assert min(model.a, model.b, model.c) >= 0.0
    assert model.predict(2) == pytest.approx(205.0, rel=0.03)


def test_bad_points_are_named() -> None:
    with pytest.raises(ScalabilityError, match="no measured points"):
        fit_model({})
    with pytest.raises(ScalabilityError, match="rate at 4 nodes"):
        fit_model({1: 10.0, 4: 0.0})
    with pytest.raises(ScalabilityError, match="node count 0"):
        Scalability.from_user({0: 10.0})
    with pytest.raises(ScalabilityError, match="no points"):
        Scalability(prior={}, measured={}, source=Source.USER)


def test_scaling_for_gives_the_allocator_a_full_curve() -> None:
    scal = Scalability.profiled({1: 100.0, 4: 350.0, 16: 1100.0})
    curve = scal.scaling_for(1, 24)
    assert sorted(curve) == list(range(1, 25))
    assert curve[4] == 350.0 and curve[16] == 1100.0  # measured points exact
    assert all(v > 0 and math.isfinite(v) for v in curve.values())
    assert curve[8] == pytest.approx(scal.predict(8))
    assert 350.0 < curve[8] < 1100.0
    job = Job("j1", 1, 24, curve)
    assert job.throughput(16) == 1100.0
    assert scal.scaling_for(2, 64, counts=[2, 64, 64]) == {2: scal.predict(2), 64: scal.predict(64)}
    with pytest.raises(ScalabilityError, match="bad range"):
        scal.scaling_for(4, 2)


def test_refine_replaces_and_calibrates_the_user_curve() -> None:
    # the user measured elsewhere: linear and 2x too optimistic
    user = Scalability.from_user({1: 200.0, 2: 400.0, 4: 800.0, 8: 1600.0})
    assert user.source is Source.USER and user.calibration == 1.0
    refined = user.refine(2, 200.0)
    assert refined.source is Source.REFINED
    assert refined.measured == {2: 200.0}
    assert refined.calibration == pytest.approx(0.5)
    assert refined.points == {1: 100.0, 2: 200.0, 4: 400.0, 8: 800.0}
    assert user.points[2] == 400.0  # immutable: the old curve is untouched
    again = refined.refine(2, 190.0)
    assert again.measured == {2: 190.0}


def test_curve_error_pct() -> None:
    true = {1: 100.0, 4: 400.0}
    assert curve_error_pct(true, true, [1, 2, 4]) == 0.0
    assert curve_error_pct({1: 110.0, 4: 440.0}, true, [1, 4]) == pytest.approx(10.0)
    with pytest.raises(ScalabilityError):
        curve_error_pct(true, true, [])


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("nodes,model\n", r"x\.csv:1: expected header"),
        ("# c\nmodel,nodes,samples_per_second\nA,1\n", r"x\.csv:3: expected 3 fields"),
        ("model,nodes,samples_per_second\nA,one,5\n", r"x\.csv:2: bad nodes"),
        ("model,nodes,samples_per_second\nA,1,-5\n", r"x\.csv:2: nodes must be"),
        ("model,nodes,samples_per_second\nA,1,5\nA,1,6\n", r"x\.csv:3: A at 1 nodes given twice"),
        ("# only comments\n", "no header"),
    ],
)
def test_parse_errors_name_file_and_line(text: str, match: str) -> None:
    with pytest.raises(ScalabilityError, match=match):
        parse_scaling_table(text, origin="x.csv")


coef = st.floats(0.0, 1e-2, allow_subnormal=False)


@settings(max_examples=80, deadline=None)
@given(coef, st.floats(1e-5, 1e-2), coef)
def test_property_exact_models_are_recovered(a: float, b: float, c: float) -> None:
    truth = ScalingModel(a, b, c)
    model = fit_model({n: truth.predict(n) for n in POW2})
    for n in POW2 + (5, 40):
        assert model.predict(n) == pytest.approx(truth.predict(n), rel=1e-4)


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.integers(1, 128), st.floats(1e-3, 1e7), min_size=1, max_size=9))
def test_property_any_points_give_a_finite_positive_curve(points: dict[int, float]) -> None:
    scal = Scalability.profiled(points)
    model = scal.model
    assert min(model.a, model.b, model.c) >= 0.0
    for n, v in scal.scaling_for(1, 128).items():
        assert v > 0 and math.isfinite(v), (n, v)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.floats(1e-3, 1e4), min_size=3, max_size=3), min_size=1, max_size=9),
       st.integers(1, 3))
def test_property_the_small_least_squares_agrees_with_numpys(rows: list[list[float]], k: int) -> None:
    import numpy as np

    from profiler.scalability import _least_squares

    x = [r[:k] for r in rows]
    normal = [[sum(r[i] * r[j] for r in x) for j in range(k)] + [sum(r[i] for r in x)] for i in range(k)]
    ours = _least_squares(normal, lambda: x)
    assert ours is not None
    ref, *_ = np.linalg.lstsq(np.array(x), np.ones(len(x)), rcond=None)
    resid = sum((sum(a * c for a, c in zip(r, ours)) - 1.0) ** 2 for r in x)
    ref_resid = float(np.sum((np.array(x) @ ref - 1.0) ** 2))
    assert resid == pytest.approx(ref_resid, rel=1e-6, abs=1e-9)  # as good a fit (the solution may differ if rank-deficient)
