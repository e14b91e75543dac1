"""Workloads: the real scaling file, seeded streams, user job files and their errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.workload import (
    DEFAULT_SAMPLES,
    HPO_MODEL,
    WorkloadError,
    find_scaling,
    load_jobs_file,
    load_scaling,
    make_workload,
    synthetic_scaling,
)


def test_summit_scaling_has_seven_imagenet_models_and_hpo(summit_scaling: Path):
    sc = load_scaling(summit_scaling)
    assert sc.nas_models == ("AlexNet", "vgg16", "resnet18", "DenseNet", "mnasnet1", "shufflenet", "mobilenet")
    assert sc.curves["vgg16"][64] == pytest.approx(70151.7)
    assert sorted(sc.curves[HPO_MODEL]) == [1, 2, 4, 8, 16, 32, 64]
    assert not sc.synthetic


def test_find_scaling_uses_the_data_dir_then_synthetic(monkeypatch, summit_scaling: Path):
    monkeypatch.setenv("MALLETRAIN_DATA", str(summit_scaling.parent))
    assert find_scaling().source == str(summit_scaling)
    import traces.data

    monkeypatch.setattr(traces.data, "find_data", lambda name: None)
    sc = find_scaling()
    assert sc.synthetic and "synthetic" in sc.source
    assert HPO_MODEL in sc.curves and len(sc.nas_models) >= 3


def test_imagenet7_stream_is_seeded_and_endless(summit_scaling: Path):
    sc = load_scaling(summit_scaling)

    def names(seed: int, k: int = 50) -> list[str]:
        wl = make_workload("imagenet7", sc, seed=seed)
        return [wl.draw().model for _ in range(k)]  # type: ignore[union-attr]

    assert names(1) == names(1)
    assert names(1) != names(2)
    assert set(names(3, 400)) == set(sc.nas_models)
    wl = make_workload("imagenet7", sc, seed=0)
    assert not wl.finite
    spec = wl.draw()
    assert spec is not None
    assert (spec.samples, spec.min_nodes, spec.max_nodes, spec.up_cost_s, spec.down_cost_s) == (
        DEFAULT_SAMPLES, 1, 64, 18.0, 12.0)


def test_jobs_makes_a_stream_finite(summit_scaling: Path):
    sc = load_scaling(summit_scaling)
    wl = make_workload("imagenet7", sc, n_jobs=3)
    drawn = [wl.draw() for _ in range(4)]
    assert all(d.model in sc.nas_models for d in drawn[:3]) and drawn[3] is None  # type: ignore[union-attr]
    assert wl.finite


def test_json_toml_csv_job_files(tmp_path: Path):
    sc = synthetic_scaling()
    (tmp_path / "w.json").write_text(json.dumps({"jobs": [
        {"name": "a", "model": "synthetic-fast", "samples": 1e6, "arrival": 30},
        {"scaling": {"1": 5, "2": 9}, "max_nodes": 2, "count": 2, "believed_scaling": [[1, 4], [2, 8]]},
    ]}))
    (tmp_path / "w.toml").write_text('[[jobs]]\nmodel = "synthetic-linear"\nmin_nodes = 2\nup_cost_s = 1.5\n')
    (tmp_path / "w.csv").write_text("# comment\nname,model,samples,scaling,arrival_s\n"
                                    "x,,500,1:10;4:30,5\ny,synthetic-small,700,,\n")
    js = load_jobs_file(tmp_path / "w.json", sc)
    assert [j.name for j in js] == ["a", "job#1", "job#2"]
    assert js[0].arrival_s == 30 and js[0].samples == 1e6
    assert js[1].scaling == {1: 5.0, 2: 9.0} and js[1].believed == {1: 4.0, 2: 8.0}
    (t,) = load_jobs_file(tmp_path / "w.toml", sc)
    assert (t.min_nodes, t.up_cost_s, t.down_cost_s) == (2, 1.5, 12.0)
    x, y = load_jobs_file(tmp_path / "w.csv", sc)
    assert x.scaling == {1: 10.0, 4: 30.0} and x.arrival_s == 5.0
    assert y.scaling == sc.curves["synthetic-small"] and y.samples == 700
    wl = make_workload(str(tmp_path / "w.json"), sc)
    assert wl.finite and len(wl.timed) == 3 and wl.draw() is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[{"model": "nope"}]', r"w\.json: job #1: unknown model 'nope'"),
        ('[{"model": "synthetic-fast"}, {"model": "synthetic-fast", "min_nodes": 0}]', r"job #2.*min_nodes"),
        ('[{"model": "synthetic-fast", "samples": "lots"}]', r"job #1: field 'samples' is not a number"),
        ('[{"model": "synthetic-fast", "colour": 1}]', r"job #1: unknown field\(s\) colour"),
        ('[{"samples": 5}]', r"job #1: needs a 'model'"),
        ('[{"scaling": {"x": 1}}]', r"job #1: field 'scaling': cannot read"),
        ('{"jobs": []}', r"non-empty list"),
        ('[{"model": ', r"w\.json:1: invalid JSON"),
    ],
)
def test_bad_json_entries_name_file_and_entry(tmp_path: Path, text: str, message: str):
    path = tmp_path / "w.json"
    path.write_text(text)
    with pytest.raises(WorkloadError, match=message):
        load_jobs_file(path, synthetic_scaling())


def test_bad_csv_row_is_named_by_row(tmp_path: Path):
    path = tmp_path / "w.csv"
    path.write_text("model,max_nodes\nsynthetic-fast,4\nsynthetic-fast,0\n")
    with pytest.raises(WorkloadError, match=r"w\.csv: row 3.*max_nodes"):
        load_jobs_file(path, synthetic_scaling())


def test_bad_scaling_file_names_the_line(tmp_path: Path):
    path = tmp_path / "s.csv"
    path.write_text("# c\nmodel,nodes,samples_per_second\nm,1,10\nm,two,20\n")
    with pytest.raises(WorkloadError, match=r"s\.csv:4: bad nodes or rate"):
        load_scaling(path)


def test_unknown_workload_name():
    with pytest.raises(WorkloadError, match="neither nas, hpo nor an existing file"):
        make_workload("imagenet", synthetic_scaling())


def test_a_jobs_file_carries_budgets_and_deadlines_and_names_a_bad_one(tmp_path: Path):
    path = tmp_path / "w.toml"
    path.write_text('[[jobs]]\nmodel = "synthetic-fast"\nbudget_node_hours = 2.5\ndeadline = 3600\n'
                    '[[jobs]]\nmodel = "synthetic-fast"\n')
    a, b = load_jobs_file(path, synthetic_scaling())
    assert (a.budget_node_hours, a.deadline) == (2.5, 3600.0)
    assert (b.budget_node_hours, b.deadline) == (None, None)
    path.write_text('[[jobs]]\nmodel = "synthetic-fast"\nbudget_node_hours = 0\n')
    with pytest.raises(WorkloadError, match=r"w\.toml: job #1.*budget_node_hours must be a finite number > 0"):
        load_jobs_file(path, synthetic_scaling())
