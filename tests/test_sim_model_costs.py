"""The costs of real models: a job's rescale pause, restart and rollback grow with its model's checkpoint
size and the commit interval it declares (simulator.modelsizes, the per-MB rates of the calibration)."""

from __future__ import annotations

import json

import pytest

from simulator import SimConfig, Simulator
from simulator.calibration import Calibration, CalibrationError, free, parse
from simulator.jobs import JobSpec, WorkloadError
from simulator.modelsizes import CHECKPOINT_MB
from simulator.philly import MODELS
from simulator.workload import load_jobs_file
from tests.test_simulator import LINEAR, named, timeline, workload

KILLED = (["n1"], ["n1"], [(130.0, "n1", False), (140.0, "n1", True)])  # recalled at 130, back at 140, to 300


def spec(model: str, **kw) -> JobSpec:
    kw.setdefault("max_nodes", 4)
    return JobSpec(name=model, model=model, samples=1e12, scaling=LINEAR, up_cost_s=5.0, down_cost_s=3.0, **kw)


def run(tl, s: JobSpec, cal: Calibration):
    return Simulator(tl, workload(s), named("greedy", [s]), SimConfig(calibration=cal)).run()


def test_every_pollux_model_has_a_checkpoint_size():
    assert set(CHECKPOINT_MB) == set(MODELS)
    assert CHECKPOINT_MB["bert"] == pytest.approx(437.9, abs=0.1)  # BERT-base, float32
    assert CHECKPOINT_MB["imagenet"] == pytest.approx(102.2, abs=0.1)  # ResNet-50
    assert CHECKPOINT_MB["ncf"] < 2.0 < CHECKPOINT_MB["cifar10"]


def test_a_bigger_model_pays_a_longer_rescale_pause():
    tl = timeline(["n1", "n2"], ["n1"], [(50.0, "n2", True)], end=100.0)
    cal = Calibration("t", rescale_pause_s=4.0, state_broadcast_s_per_mb=0.01)
    done = {m: run(tl, spec(m, max_nodes=2), cal).summary["samples_processed"] for m in ("bert", "ncf")}
    for m in ("bert", "ncf"):  # 1 node 0-50, 2 nodes from 50 after the pause plus the broadcast of its state
        assert done[m] == pytest.approx(10.0 * 50.0 + 20.0 * (46.0 - 0.01 * CHECKPOINT_MB[m]))
    assert done["bert"] < done["ncf"]


def test_a_bigger_model_pays_a_longer_restart():
    cal = Calibration("t", cold_start_s=10.0, restart_s=20.0, commit_interval_s=50.0, checkpoint_load_s_per_mb=0.01)
    done = {m: run(timeline(*KILLED, end=300.0), spec(m, max_nodes=1), cal).summary["samples_processed"]
            for m in ("bert", "ncf")}
    for m in ("bert", "ncf"):  # commits at 60, 110, killed at 130; the restart from 140 adds the load
        assert done[m] == pytest.approx(10.0 * (100.0 + 140.0 - 0.01 * CHECKPOINT_MB[m]))
    assert done["bert"] < done["ncf"]


def test_a_longer_declared_commit_interval_loses_more_at_a_preemption():
    cal = Calibration("t", cold_start_s=10.0, restart_s=20.0, commit_interval_s=50.0)
    lost = {c: run(timeline(*KILLED, end=300.0), spec("m", max_nodes=1, commit_interval_s=c), cal).jobs[0].lost_samples
            for c in (35.0, 80.0)}
    # run from t=10, killed at 130: the last commit at 115 (every 35 s) or at 90 (every 80 s)
    assert lost == {35.0: pytest.approx(10.0 * 15.0), 80.0: pytest.approx(10.0 * 40.0)}


def test_a_torchrun_job_rolls_back_to_its_last_commit_at_a_change_of_size():
    tl = timeline(["n1", "n2"], ["n1"], [(50.0, "n2", True)], end=100.0)
    cal = Calibration("t", restart_s=6.0, rescale_pause_s=1.0, commit_interval_s=20.0, checkpoint_load_s_per_mb=0.01)
    res = run(tl, spec("bert", max_nodes=2, launcher="torchrun"), cal)
    # commits at 20, 40; grows at 50: 10 s lost, restarts for 6 s + the load of 438 MB, then 2 nodes
    assert res.jobs[0].lost_samples == pytest.approx(10.0 * 10.0)
    assert res.summary["samples_processed"] == pytest.approx(10.0 * 40.0 + 20.0 * (44.0 - 0.01 * CHECKPOINT_MB["bert"]))


def test_the_free_calibration_charges_no_size_and_no_declared_commit_interval():
    done = {m: run(timeline(*KILLED, end=300.0), spec(m, max_nodes=1, commit_interval_s=80.0), free())
            for m in ("bert", "ncf")}
    for res in done.values():
        assert res.jobs[0].lost_samples == 0.0
        assert res.summary["samples_processed"] == pytest.approx(10.0 * (130.0 + 160.0))


def test_a_bad_commit_interval_is_refused_naming_the_field(tmp_path):
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(WorkloadError, match="commit_interval_s"):
            spec("m", commit_interval_s=bad)
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps([{"name": "x", "scaling": {"1": 10}, "commit_interval_s": "soon"}]))
    with pytest.raises(WorkloadError, match="commit_interval_s"):
        load_jobs_file(path, None)  # type: ignore[arg-type]
    path.write_text(json.dumps([{"name": "x", "scaling": {"1": 10}, "commit_interval_s": 60}]))
    assert load_jobs_file(path, None)[0].commit_interval_s == 60.0  # type: ignore[arg-type]


def test_a_bad_per_mb_rate_in_a_calibration_is_refused_naming_it():
    entry = {"value": 1.0, "unit": "s", "how": "h", "when": "2026-11-29", "command": "c"}
    values = {k: entry for k in ("pilot_start_s", "cold_start_s", "restart_s", "rescale_pause_s", "commit_interval_s")}
    ok = parse({"schema": 1, "values": {**values, "checkpoint_load_s_per_mb": {**entry, "unit": "s/MB"}}}, "c.json")
    assert ok.checkpoint_load_s_per_mb == 1.0
    with pytest.raises(CalibrationError, match="checkpoint_load_s_per_mb"):
        parse({"schema": 1, "values": {**values, "checkpoint_load_s_per_mb": entry}}, "c.json")  # unit s
    with pytest.raises(CalibrationError, match="state_broadcast_s_per_mb"):
        parse({"schema": 1, "values": {**values, "state_broadcast_s_per_mb": {**entry, "unit": "s/MB", "value": -1}}},
              "c.json")



def test_a_jobs_file_declares_a_commit_interval_and_a_bad_one_is_named(tmp_path, philly_data):
    from simulator.philly import jobs_file_workload

    data = philly_data
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("name,time,application,commit_interval_s\na,0,bert,600\nb,10,ncf,\n")
    a, b = jobs_file_workload(jobs, data).timed
    assert (a.commit_interval_s, b.commit_interval_s) == (600.0, None)
    jobs.write_text("name,time,application,commit_interval_s\na,0,bert,-5\n")
    with pytest.raises(WorkloadError, match=r"row 2 \(a\).*commit_interval_s"):
        jobs_file_workload(jobs, data)
