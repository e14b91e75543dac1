"""The costs the simulator charges, from one calibration file."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from simulator import SimConfig, Simulator
from simulator.calibration import REQUIRED, Calibration, CalibrationError, default, free, load
from tests.test_simulator import LINEAR, job, named, timeline, workload

CAL = Calibration("test", pilot_start_s=2.0, cold_start_s=10.0, restart_s=20.0, rescale_pause_s=4.0,
                  commit_interval_s=50.0)


def run(tl, specs, cal, policy="greedy"):
    return Simulator(tl, workload(*specs), named(policy, specs), SimConfig(calibration=cal)).run()


def test_the_shipped_calibration_has_every_value_with_how_and_when():
    """Whatever benchmarks/calibrate.py last measured: every value, each saying how, when and by what."""
    import re

    from simulator.calibration import default_path

    cal = default()
    assert cal.name == "simulator/calibration.json"
    values = json.loads(default_path().read_text())["values"]
    for name in REQUIRED:
        entry = values[name]
        assert entry["value"] > 0 and entry["unit"] == "s", name
        assert entry["how"] and entry["command"] and re.fullmatch(r"\d{4}-\d{2}-\d{2}", entry["when"]), name
    assert cal.pilot_start_s > 0 and cal.cold_start_s > 0
    # a restart is a cold start plus the checkpoint's load: milliseconds for the example's model, so the two
    # are equal within their spread (on the idle machine: restart 4.31 s, n = 3; cold start 4.39 s, n = 2)
    assert cal.restart_s >= 0.9 * cal.cold_start_s
    assert free().is_free and not cal.is_free


def test_a_cold_start_and_the_pilot_start_are_charged():
    tl = timeline(["n1", "n2"], ["n1", "n2"], end=100.0)
    free_run = run(tl, [job(max_nodes=2)], free())
    charged = run(tl, [job(max_nodes=2)], Calibration("t", pilot_start_s=2.0, cold_start_s=10.0))
    # free: 2 nodes x 10 samples/s x 100 s; charged: usable from t=2, then 10 s of cold start
    assert free_run.summary["samples_processed"] == pytest.approx(20.0 * 100.0)
    assert charged.summary["samples_processed"] == pytest.approx(20.0 * (100.0 - 2.0 - 10.0))
    assert charged.summary["held_node_seconds"] == pytest.approx(2 * 98.0)
    assert charged.summary["calibration"] == "t" and charged.summary["cold_starts"] == 1


def test_a_kill_loses_the_work_since_the_last_commit_and_pays_the_restart():
    # one node, idle 0-130, recalled at 130, idle again at 140 until 300
    tl = timeline(["n1"], ["n1"], [(130.0, "n1", False), (140.0, "n1", True)], end=300.0)
    res = run(tl, [job(max_nodes=1)], Calibration("t", cold_start_s=10.0, restart_s=20.0, commit_interval_s=50.0))
    # run 1 from t=10 (after cold start): commits at 60, 110; killed at 130 -> 20 s lost, 100 s kept
    # run 2 from t=160 (after restart): 140 s to 300
    assert res.jobs[0].lost_samples == pytest.approx(10.0 * 20.0)
    assert res.summary["samples_processed"] == pytest.approx(10.0 * (100.0 + 140.0))
    assert res.summary["restarts"] == 1 and res.summary["lost_work_node_seconds"] == pytest.approx(20.0)


def test_the_free_ablation_charges_no_start_and_loses_nothing():
    tl = timeline(["n1"], ["n1"], [(130.0, "n1", False), (140.0, "n1", True)], end=300.0)
    res = run(tl, [job(max_nodes=1)], free())
    assert res.summary["samples_processed"] == pytest.approx(10.0 * (130.0 + 160.0))
    assert res.summary["lost_work_node_seconds"] == 0.0


def test_a_calibrated_rescale_pause_replaces_the_jobs_own():
    tl = timeline(["n1", "n2"], ["n1"], [(50.0, "n2", True)], end=100.0)
    res = run(tl, [job(max_nodes=2, up_cost_s=30.0)], Calibration("t", rescale_pause_s=4.0))
    # 1 node 0-50, 2 nodes from 50 after a 4 s pause
    assert res.summary["samples_processed"] == pytest.approx(10.0 * 50.0 + 20.0 * 46.0)


def test_a_grown_node_adds_its_work_only_after_the_join_delay():
    """The daemon publishes a new member once its worker is ready: the old nodes train on for join_s,
    then the job pays its up pause and trains on all (the grow's cost the engine missed)."""
    tl = timeline(["n1", "n2"], ["n1"], [(50.0, "n2", True)], end=100.0)
    cal = Calibration("t", rescale_pause_s=4.0, join_s=10.0)
    res = run(tl, [job(max_nodes=2)], cal)
    # 1 node 0-60 (n2 held from 50, its worker starting), 4 s pause, 2 nodes 64-100
    assert res.summary["samples_processed"] == pytest.approx(10.0 * 60.0 + 20.0 * 36.0)
    assert res.summary["held_node_seconds"] == pytest.approx(100.0 + 50.0)
    # trained (held and not paused): n2's 10 s of join and both nodes' 4 s pause are not
    assert res.summary["trained_node_seconds"] == pytest.approx(150.0 - 10.0 - 2 * 4.0)
    history = [(t, n) for t, _, n, _ in res.jobs[0].history]
    assert (50.0, 1) in history and (60.0, 2) in history
    assert res.summary["calibration_values"]["join_s"] == 10.0


def test_a_second_grow_before_the_join_moves_it_and_a_recall_drops_the_joining_node():
    # n2 back at 50, n3 at 55: both join at 65 (the daemon waits until every joining worker is ready)
    tl = timeline(["n1", "n2", "n3"], ["n1"], [(50.0, "n2", True), (55.0, "n3", True)], end=100.0)
    res = run(tl, [job(max_nodes=3, scaling={1: 10.0, 2: 20.0, 3: 30.0})], Calibration("t", rescale_pause_s=0.0,
                                                                                       join_s=10.0))
    assert res.summary["samples_processed"] == pytest.approx(10.0 * 65.0 + 30.0 * 35.0)
    # n2 recalled at 55, before its worker joined: the job never trained on it, and no member left (no pause)
    tl = timeline(["n1", "n2"], ["n1"], [(50.0, "n2", True), (55.0, "n2", False)], end=100.0)
    res = run(tl, [job(max_nodes=2)], Calibration("t", rescale_pause_s=4.0, join_s=10.0))
    assert res.summary["samples_processed"] == pytest.approx(10.0 * 100.0)
    assert res.jobs[0].history[-1][2] == 1


def test_a_node_whose_warm_worker_is_ready_joins_at_once_and_a_handed_over_one_waits():
    """The agent warms a worker from its pilot's start, and again after a worker leaves: a grow onto a
    node whose warm worker has had join_s costs only the pause; onto a node a job just left, join_s."""
    cal = Calibration("t", rescale_pause_s=0.0, join_s=10.0)
    # b (max 1 node) ends at 20 s; a grows onto its node then, whose new warm worker is ready at 30
    specs = [job("b", samples=200.0, max_nodes=1), job("a", max_nodes=2)]
    res = run(timeline(["n1", "n2"], ["n1", "n2"], end=100.0), specs, cal)
    a = next(j for j in res.jobs if j.spec.name == "a")
    assert a.progress == pytest.approx(10.0 * 30.0 + 20.0 * 70.0)
    # n2 ours from 5 s; decisions at most every 30 s: a grows onto it at 30, its worker warm since 15
    tl = timeline(["n1", "n2"], ["n1"], [(5.0, "n2", True)], end=100.0)
    specs = [job(max_nodes=2)]
    config = SimConfig(calibration=cal, min_interval_s=30.0)
    warm = Simulator(tl, workload(*specs), named("greedy", specs), config).run()
    assert warm.summary["samples_processed"] == pytest.approx(10.0 * 30.0 + 20.0 * 70.0)


def test_the_free_calibration_and_files_without_join_s_charge_no_join():
    tl = timeline(["n1", "n2"], ["n1"], [(50.0, "n2", True)], end=100.0)
    res = run(tl, [job(max_nodes=2, up_cost_s=5.0)], free())
    assert free().join_s == 0.0 and res.summary["samples_processed"] == pytest.approx(10.0 * 50.0 + 20.0 * 45.0)
    assert default().join_s > 0  # the shipped file charges it


WARM = Calibration("t", pilot_start_s=2.0, cold_start_s=10.0, restart_s=20.0, commit_interval_s=50.0,
                   warm_start_s=1.0)


def test_a_start_on_nodes_whose_warm_workers_are_ready_costs_the_warm_figure():
    """The agent's warm worker imports from the pilot's start (2 s): a job arriving at 50 s starts at once
    (1 s), one arriving at 5 s waits for the import (ready at 2 + 10 s), not the full 10 s from its start."""
    tl = timeline(["n1", "n2"], ["n1", "n2"], end=100.0)
    assert run(tl, [job(max_nodes=2, arrival=50.0)], WARM).summary["samples_processed"] == pytest.approx(20.0 * 49.0)
    assert run(tl, [job(max_nodes=2, arrival=5.0)], WARM).summary["samples_processed"] == pytest.approx(20.0 * 88.0)
    cold = replace(WARM, warm_start_s=None)  # a file without warm_start_s: the full figure from the start
    assert run(tl, [job(max_nodes=2, arrival=50.0)], cold).summary["samples_processed"] == pytest.approx(20.0 * 40.0)


def test_a_restart_on_a_warm_node_pays_the_warm_figure_plus_the_load_and_on_a_fresh_one_all_of_it():
    cal = replace(WARM, pilot_start_s=0.0)
    # n1 recalled at 130: the job restarts on n2, ours (and warm) since 0: 1 s + the load (20 - 10 s)
    res = run(timeline(["n1", "n2"], ["n1", "n2"], [(130.0, "n1", False)], end=300.0), [job(max_nodes=1)], cal)
    assert res.summary["restarts"] == 1 and res.jobs[0].history[-1][:3] == (130.0, 1000.0, 1)
    assert res.summary["samples_processed"] == pytest.approx(10.0 * (100.0 + 300.0 - 141.0))
    # both recalled, n1 back at 140: its warm worker begins then, so the restart pays all 20 s
    tl = timeline(["n1", "n2"], ["n1", "n2"], [(130.0, "n1", False), (130.0, "n2", False), (140.0, "n1", True)],
                  end=300.0)
    res = run(tl, [job(max_nodes=1)], cal)
    assert res.summary["samples_processed"] == pytest.approx(10.0 * (100.0 + 300.0 - 160.0))


def test_a_start_on_a_node_a_worker_just_left_waits_for_the_new_warm_worker():
    # b ends at 30 (10 s start + 200 samples); a takes n1 then, whose agent warms a new worker from 30
    cal = replace(WARM, pilot_start_s=0.0)
    res = run(timeline(["n1"], ["n1"], end=100.0), [job("b", samples=200.0, max_nodes=1), job("a", max_nodes=1)], cal)
    a = next(j for j in res.jobs if j.spec.name == "a")
    assert a.progress == pytest.approx(10.0 * (100.0 - 40.0))


def test_warm_start_s_is_optional_in_a_file_and_the_shipped_one_has_it(tmp_path):
    good = {k: _entry(1.0) for k in REQUIRED}
    assert load(_write(tmp_path, good)).warm_start_s is None
    assert load(_write(tmp_path, {**good, "warm_start_s": _entry(0.25)})).warm_start_s == 0.25
    with pytest.raises(CalibrationError, match="values.warm_start_s.*>= 0"):
        load(_write(tmp_path, {**good, "warm_start_s": _entry(-1.0)}))
    shipped = default()
    assert shipped.warm_start_s is not None and 0 < shipped.warm_start_s < shipped.cold_start_s
    assert free().warm_start_s is None


def test_a_recall_before_the_pilot_runs_leaves_the_node_unused():
    tl = timeline(["n1"], [], [(10.0, "n1", True), (11.0, "n1", False)], end=100.0)
    res = run(tl, [job(max_nodes=1)], Calibration("t", pilot_start_s=2.0))
    assert res.summary["samples_processed"] == 0.0 and res.summary["held_node_seconds"] == 0.0


def _write(tmp_path, values):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"schema": 1, "values": values}))
    return path


def _entry(v):
    return {"value": v, "unit": "s", "how": "test", "when": "2026-11-26", "command": "none"}


def test_a_calibration_file_is_read_and_bad_ones_are_named(tmp_path):
    good = {k: _entry(1.0) for k in REQUIRED}
    assert load(_write(tmp_path, good)).restart_s == 1.0
    with pytest.raises(CalibrationError, match="missing value.*restart_s"):
        load(_write(tmp_path, {k: v for k, v in good.items() if k != "restart_s"}))
    with pytest.raises(CalibrationError, match="values.cold_start_s.*>= 0"):
        load(_write(tmp_path, {**good, "cold_start_s": _entry(-1.0)}))
    with pytest.raises(CalibrationError, match="when"):
        load(_write(tmp_path, {**good, "pilot_start_s": {**_entry(1.0), "when": "yesterday"}}))
    assert load("free").is_free


def test_join_s_is_optional_in_a_file_and_checked_when_there(tmp_path):
    good = {k: _entry(1.0) for k in REQUIRED}
    assert load(_write(tmp_path, good)).join_s == 0.0  # a file written before it: no join delay
    assert load(_write(tmp_path, {**good, "join_s": _entry(7.0)})).join_s == 7.0
    with pytest.raises(CalibrationError, match="values.join_s.*>= 0"):
        load(_write(tmp_path, {**good, "join_s": _entry(-1.0)}))


def test_a_calibration_may_name_the_torchrun_restart_and_a_bad_one_is_refused():
    import json as _json

    from simulator.calibration import CalibrationError, parse

    entry = {"unit": "s", "how": "measured", "when": "2026-11-29", "command": "python benchmarks/calibrate.py"}
    values = {k: {**entry, "value": 1.0} for k in ("pilot_start_s", "cold_start_s", "restart_s", "rescale_pause_s",
                                                    "commit_interval_s")}
    assert parse({"schema": 1, "values": values}, "c.json").torchrun_restart_s is None  # not measured yet
    named = parse({"schema": 1, "values": {**values, "torchrun_restart_s": {**entry, "value": 9.5}}}, "c.json")
    assert named.torchrun_restart_s == 9.5 and _json.dumps(named.as_dict())
    with pytest.raises(CalibrationError, match="torchrun_restart_s"):
        parse({"schema": 1, "values": {**values, "torchrun_restart_s": {**entry, "value": -1.0}}}, "c.json")


def test_a_torchrun_job_pays_a_restart_at_every_change_of_size_an_elastic_job_a_pause():
    from policy import Policy, PolicyConfig
    from simulator import SimPolicy

    tl = timeline("abc", "ab", [(100.0, "c", True), (200.0, "a", False)], end=300.0)  # grows at 100, shrinks at 200
    measured = Calibration("t", 0.0, 0.0, 20.0, 1.0, 0.0)  # restart 20 s, rescale pause 1 s
    named_restart = replace(measured, torchrun_restart_s=9.0)
    pauses = {}
    for label, launcher, cal in (("elastic", "elastic", measured), ("torchrun", "torchrun", measured),
                                 ("torchrun, measured", "torchrun", named_restart)):
        pol = SimPolicy("defaults", Policy(PolicyConfig(profiling="never")), lambda spec: None)
        res = Simulator(tl, workload(job(scaling=LINEAR, launcher=launcher)), pol, SimConfig(calibration=cal)).run()
        (j,) = res.jobs
        assert [h[2] for h in j.history] == [2, 3, 2]
        ev = j.monitor.evidence(res.end)  # what the policy weighs: the pauses the job's monitor measured
        pauses[label] = (ev.costs.up_s, ev.costs.down_s)
    assert max(pauses["elastic"]) < 2.0  # the 1 s pause, as the monitor estimates it (its step granularity on top)
    for k in (0, 1):  # up, down: the same estimate of a 20 s restart, and of the 9 s one named in the calibration
        assert pauses["torchrun"][k] - pauses["elastic"][k] == pytest.approx(19.0, abs=0.05)
        assert pauses["torchrun, measured"][k] - pauses["elastic"][k] == pytest.approx(8.0, abs=0.05)
    with pytest.raises(Exception, match="launcher 'mpirun'"):
        job(launcher="mpirun")


def test_a_torchrun_job_with_warm_ranks_pays_the_warm_restart_one_started_cold_the_cold_one():
    """The calibration's restart per launcher: a torchrun job's ranks start as forks of warm rank servers
    unless its environment says WARM_RANKS=0; the simulator charges each its own figure, and the policy
    weighs what the job's monitor measured (so its value of a short window follows the figure)."""
    from policy import Policy, PolicyConfig
    from simulator import SimPolicy

    tl = timeline("abc", "ab", [(100.0, "c", True), (200.0, "a", False)], end=300.0)  # grows at 100, shrinks at 200
    cal = Calibration("t", 0.0, 0.0, 20.0, 1.0, 0.0, torchrun_restart_s=3.0, torchrun_cold_restart_s=9.0)
    pauses = {}
    for label, launcher, warm in (("elastic", "elastic", True), ("warm", "torchrun", True),
                                  ("cold", "torchrun", False)):
        pol = SimPolicy("defaults", Policy(PolicyConfig(profiling="never")), lambda spec: None)
        spec = job(scaling=LINEAR, launcher=launcher, warm_ranks=warm)
        res = Simulator(tl, workload(spec), pol, SimConfig(calibration=cal)).run()
        (j,) = res.jobs
        assert [h[2] for h in j.history] == [2, 3, 2]
        ev = j.monitor.evidence(res.end)
        pauses[label] = (ev.costs.up_s, ev.costs.down_s)
    for k in (0, 1):  # up, down: the 3 s warm restart and the 9 s cold one, over the elastic job's 1 s pause
        assert pauses["warm"][k] - pauses["elastic"][k] == pytest.approx(2.0, abs=0.05)
        assert pauses["cold"][k] - pauses["elastic"][k] == pytest.approx(8.0, abs=0.05)
    # a file without the cold figure charges a cold job the warm one; without either, restart_s
    assert replace(cal, torchrun_cold_restart_s=None).torchrun_change_s(warm_ranks=False) == 3.0
    assert replace(cal, torchrun_restart_s=None, torchrun_cold_restart_s=None).torchrun_change_s(False) == 20.0


def test_the_shipped_calibration_charges_a_torchrun_job_its_warm_restart():
    """bench_launchers' figures on the idle machine, both from the same run: warm ranks (the default)
    cost less a change than cold ones, and both more than nothing."""
    cal = default()
    assert cal.torchrun_restart_s is not None and cal.torchrun_cold_restart_s is not None
    assert 0 < cal.torchrun_change_s(warm_ranks=True) < cal.torchrun_change_s(warm_ranks=False)
    assert cal.torchrun_change_s(warm_ranks=True) == cal.torchrun_restart_s


def test_a_jobs_file_names_warm_ranks_and_a_bad_value_is_refused(tmp_path):
    from simulator.jobs import WorkloadError
    from simulator.workload import load_jobs_file

    scaling = {"m": LINEAR}
    good = tmp_path / "jobs.json"
    good.write_text(json.dumps([
        {"name": "w", "scaling": {"1": 1, "2": 2}, "launcher": "torchrun"},
        {"name": "c", "scaling": {"1": 1, "2": 2}, "launcher": "torchrun", "warm_ranks": False}]))
    specs = load_jobs_file(good, scaling)  # type: ignore[arg-type]
    assert [s.warm_ranks for s in specs] == [True, False]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"name": "b", "scaling": {"1": 1}, "launcher": "torchrun", "warm_ranks": "sometimes"}]))
    with pytest.raises(WorkloadError, match="warm_ranks"):
        load_jobs_file(bad, scaling)  # type: ignore[arg-type]
