"""The philly stream and name,time,application jobs files, on the Pollux curves."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.jobs import WorkloadError
from simulator.philly import (FINISHING_WORK_CAP_SHARE, MAX_NODES, MODELS, curves, jobs_file_workload, one_node_rate,
                              philly_workload, pollux_model, pollux_workload)


@pytest.fixture
def data(philly_data: Path) -> Path:
    return philly_data


def test_the_six_models_have_whole_node_curves_from_1_to_16_nodes(data):
    cs = curves(data)
    assert set(cs) == set(MODELS)
    for m, c in cs.items():
        assert {1, 2, 4, 8, 16} <= set(c), m
        assert all(v > 0 for v in c.values())


def test_philly_offers_the_asked_load_with_real_sizes_and_arrivals_in_the_window(data):
    wl = philly_workload(seed=3, duration_s=3600.0, idle_node_seconds=2e5, offered_load=1.5, data_dir=data)
    work = sum(s.samples / one_node_rate(s.scaling) for s in wl.timed)
    biggest = max(s.samples / one_node_rate(s.scaling) for s in wl.timed)
    assert 1.5 * 2e5 <= work <= 1.5 * 2e5 + biggest  # consecutive jobs until the target is reached
    assert all(0.0 <= s.arrival_s <= 3600.0 for s in wl.timed)
    assert [s.arrival_s for s in wl.timed] == sorted(s.arrival_s for s in wl.timed)
    assert all(1 <= s.requested_nodes <= MAX_NODES and s.max_nodes == MAX_NODES for s in wl.timed)
    assert biggest <= 3600.0 * MAX_NODES  # capped at what the window allows
    again = philly_workload(seed=3, duration_s=3600.0, idle_node_seconds=2e5, offered_load=1.5, data_dir=data)
    assert again.timed == wl.timed  # seeded
    other = philly_workload(seed=4, duration_s=3600.0, idle_node_seconds=2e5, offered_load=1.5, data_dir=data)
    assert other.timed != wl.timed
    more = philly_workload(seed=3, duration_s=3600.0, idle_node_seconds=2e5, offered_load=3.0, data_dir=data)
    assert len(more.timed) > len(wl.timed)


def test_pollux_done_is_a_second_job_list_sampled_as_pollux_samples_its_workloads(data):
    day, idle = 86400.0, 2e6
    wl = pollux_workload(seed=0, duration_s=day, idle_node_seconds=idle, offered_load=0.2, data_dir=data)
    works = [s.samples / one_node_rate(s.scaling) for s in wl.timed]
    assert 0.2 * idle <= sum(works) <= 0.2 * idle + max(works)  # drawn until the offered work is reached
    assert max(works) <= day * MAX_NODES * FINISHING_WORK_CAP_SHARE  # every job can finish, as in philly-done
    assert all(0.0 <= s.arrival_s <= day / 2 for s in wl.timed)  # a day's times of day in the first half
    assert [s.arrival_s for s in wl.timed] == sorted(s.arrival_s for s in wl.timed)
    # its model by its GPU time: under 1 GPU-hour cifar10 or ncf (a node-hour of work is 4 GPU-hours)
    short = [s.model for s, w in zip(wl.timed, works) if w < 0.25 * 3600]
    assert short and set(short) == {"cifar10", "ncf"}
    assert {s.model for s, w in zip(wl.timed, works) if w >= 25 * 3600} <= {"imagenet"}
    assert [pollux_model(h * 3600.0, 0.7) for h in (0.5, 5, 50, 500)] == ["ncf", "bert", "yolov3", "imagenet"]
    # independent of the philly-done list of the same seed and load: other jobs, other sizes
    done = philly_workload(seed=0, duration_s=day, idle_node_seconds=idle, offered_load=0.2, data_dir=data,
                           finishing=True)
    assert [s.samples for s in wl.timed] != [s.samples for s in done.timed]
    assert pollux_workload(seed=0, duration_s=day, idle_node_seconds=idle, offered_load=0.2, data_dir=data).timed == wl.timed
    assert pollux_workload(seed=1, duration_s=day, idle_node_seconds=idle, offered_load=0.2, data_dir=data).timed != wl.timed
    with pytest.raises(WorkloadError, match="offered-load"):
        pollux_workload(seed=0, duration_s=day, idle_node_seconds=idle, offered_load=0.0, data_dir=data)


def test_pollux_done_is_a_named_real_stream_of_simulate_and_evaluate(data, monkeypatch):
    from evaluation.results import is_real
    from simulator.jobs import StreamWindow
    from simulator.workload import OFFERED_STREAMS, REAL_STREAMS, make_workload, synthetic_scaling

    monkeypatch.setenv("MALLETRAIN_DATA", str(data))
    assert "pollux-done" in REAL_STREAMS and "pollux-done" in OFFERED_STREAMS and is_real("pollux-done@0.2")
    wl = make_workload("pollux-done", synthetic_scaling(), seed=2, window=StreamWindow(86400.0, 2e6, 0.2))
    assert wl.finite and wl.timed and all(s.name.startswith("pollux-") for s in wl.timed)
    with pytest.raises(WorkloadError, match="needs the replay window"):
        make_workload("pollux-done", synthetic_scaling(), seed=2)


def test_a_jobs_file_is_read_and_its_errors_name_file_row_and_field(data, tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text("# two jobs\nname,time,application,num_replicas,batch_size,samples\n"
                    "a,0,cifar10,6,,\nb,30.5,bert,,8,1000\n")
    wl = jobs_file_workload(path, data)
    a, b = wl.timed
    assert (a.name, a.arrival_s, a.model, a.requested_nodes) == ("a", 0.0, "cifar10", 2)
    assert (b.arrival_s, b.samples, b.requested_nodes) == (30.5, 1000.0, None)
    for text, message in [
        ("name,time\na,0\n", "missing application"),
        ("name,time,application,gpus\na,0,bert,1\n", "unknown gpus"),
        ("name,time,application\na,0,resnet\n", r"row 2 \(a\): application 'resnet'"),
        ("name,time,application\na,soon,bert\n", r"row 2 \(a\): field 'time' is not a number"),
        ("name,time,application\na,-5,bert\n", r"row 2 \(a\).*arrival"),
        ("name,time,application\na,0,bert\na,1,bert\n", "given twice: a"),
    ]:
        path.write_text(text)
        with pytest.raises(WorkloadError, match=message):
            jobs_file_workload(path, data)


def test_a_jobs_file_carries_budgets_and_deadlines(data, tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text("name,time,application,budget_node_hours,deadline\na,0,cifar10,0.5,7200\nb,10,bert,,\n")
    a, b = jobs_file_workload(path, data).timed
    assert (a.budget_node_hours, a.deadline) == (0.5, 7200.0)
    assert (b.budget_node_hours, b.deadline) == (None, None)
    path.write_text("name,time,application,budget_node_hours\na,0,cifar10,-1\n")
    with pytest.raises(WorkloadError, match=r"row 2 \(a\).*budget_node_hours must be a finite number > 0"):
        jobs_file_workload(path, data)
