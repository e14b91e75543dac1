"""The real-stream chart: its title is drawn whole, whatever the number of panels (a one-panel chart of the
whole machine cut its title at both edges)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.results import EvalSettings, Evaluation
from evaluation.report import write_real_chart
from tests.test_sim_targets import spec_of, summary

pytest.importorskip("matplotlib")

TRACE = "data/summit-2021-02-10_17.nodes.csv.gz"
WORKS = {"malletrain": 100.0, "freetrain:mean": 98.0, "freetrain:linear": 90.0, "milp-true": 101.0}


def chart(tmp_path: Path, loads: tuple[str, ...]) -> Path:
    runs = [(spec_of(label, load, k), summary(w * (1 + 0.001 * k)))
            for load in loads for k in range(5) for label, w in WORKS.items()]
    ev = Evaluation(EvalSettings(seeds=tuple(range(5)), workloads=loads), TRACE, "s", runs)
    path = write_real_chart(ev, tmp_path / "fig_real.png")
    assert path is not None
    return path


@pytest.mark.parametrize("loads", [("philly-done@0.2",), ("philly@1", "philly@2"), ("scarce", "philly-done@0.3", "philly@2")])
def test_the_title_is_inside_the_figure_however_many_panels(tmp_path: Path, loads: tuple[str, ...]):
    from matplotlib.image import imread

    img = imread(str(chart(tmp_path, loads)))
    band = img[: int(img.shape[0] * 0.12), :, :3]  # the title's band, above every panel
    assert (band < 0.9).any(), "no title drawn"
    for edge in (band[:, :3], band[:, -3:]):  # a title cut by the figure's edge leaves ink at that edge
        assert (edge > 0.95).all(), "the title runs off the figure"
