"""``malletrain simulate``: outputs, options, errors; one slow replay of real Summit data."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from malletrain.cli import main
from malletrain.cli.simulate import parse_policies, parse_time
from policy import PolicyConfig
from simulator import POLICIES

SUMMARY_KEYS = {
    "policy", "nodes_total", "span_seconds", "idle_node_seconds", "used_node_seconds", "samples_processed",
    "jobs_submitted", "jobs_completed", "makespan_seconds", "rescales", "preemptions", "decisions",
    "decision_ms_p50", "decision_ms_p99", "wall_seconds", "used_fraction", "workload", "seed",
}


def tiny_trace(tmp_path: Path) -> Path:
    rows = ["time,node,idle"] + [f"1000,h{i},{1 if i < 6 else 0}" for i in range(8)]
    rows += ["1600,h6,1", "2200,h0,0", "2800,h7,1", "3400,h1,0", "4600,h0,1"]
    path = tmp_path / "tiny.nodes.csv"
    path.write_text("# hand-made\n" + "\n".join(rows) + "\n")
    return path


def test_parse_time_accepts_unix_seconds_and_offsets():
    assert parse_time("+2h", 100.0, "start") == 100.0 + 7200
    assert parse_time("+1d", 0.0, "end") == 86400.0
    assert parse_time("+90", 10.0, "end") == 100.0
    assert parse_time("1612915732", 0.0, "start") == 1612915732.0
    assert parse_time(None, 5.0, "start") is None
    with pytest.raises(ValueError, match="--end 'soon'"):
        parse_time("soon", 0.0, "end")


def test_parse_policies():
    assert parse_policies("all") == list(POLICIES)
    assert set(POLICIES) >= {"malletrain", "jpa", "freetrain", "milp-true", "greedy", "equal", "oracle"}
    assert parse_policies("greedy, oracle") == ["greedy", "oracle"]
    with pytest.raises(ValueError, match="unknown best"):
        parse_policies("greedy,best")


def test_simulate_writes_summary_events_and_plots(tmp_path: Path, capsys):
    out = tmp_path / "run"
    code = main(["simulate", "--trace", str(tiny_trace(tmp_path)), "--workload", "hpo", "--policy", "malletrain",
                 "--seed", "3", "--end", "+1h", "--out", str(out), "--quiet"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["policy"] == "malletrain" and summary["seed"] == 3 and summary["span_seconds"] == 3600
    assert 0 < summary["used_node_seconds"] <= summary["idle_node_seconds"]
    with (out / "events.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["time", "idle_nodes", "used_nodes", "running_jobs", "queued_jobs", "rescales",
                             "decision_ms", "constrained"]
    assert len(rows) == summary["decisions"]
    idle = [r["idle_nodes"] for r in rows]  # malletrain also decides at its profiling steps' ends
    assert idle[0] == "6" and idle.index("7") > 0 and set(idle) <= {"5", "6", "7"}
    assert (out / "idle-vs-used.png").stat().st_size > 0 and (out / "job-progress.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "samples_processed" in printed and "used_fraction" in printed


def test_simulate_all_policies_compares_to_oracle(tmp_path: Path, capsys):
    wl = tmp_path / "jobs.toml"
    wl.write_text('[[jobs]]\nscaling = "1:100;2:190;4:360"\nsamples = 200000\nmax_nodes = 4\ncount = 3\n')
    out = tmp_path / "cmp"
    code = main(["simulate", "--trace", str(tiny_trace(tmp_path)), "--workload", str(wl), "--policy", "all",
                 "--max-running", "2", "--out", str(out), "--quiet", "--no-plots"])
    assert code == 0
    rows = json.loads((out / "comparison.json").read_text())
    assert [r["policy"] for r in rows] == list(POLICIES)
    assert {r["policy"]: r for r in rows}["oracle"]["vs_oracle"] == pytest.approx(1.0)
    for r in rows:
        summary = json.loads((out / r["policy"] / "summary.json").read_text())
        assert r["jobs_submitted"] == 3
        assert summary["max_running"] == 2 and summary["policy_config"]["max_running"] == 2
    assert "vs_oracle" in capsys.readouterr().out


def test_policy_options_default_to_the_daemons_config(tmp_path: Path, capsys):
    trace = str(tiny_trace(tmp_path))
    conf = tmp_path / "policy.toml"
    conf.write_text("[policy]\ntfwd_s = 30.0\nmax_running = 4\nprofile_time_cap_s = 45.0\n")
    out = tmp_path / "conf"
    assert main(["simulate", "--trace", trace, "--workload", "hpo", "--policy", "jpa", "--end", "+30m",
                 "--policy-config", str(conf), "--max-running", "3", "--out", str(out), "--quiet",
                 "--no-plots"]) == 0
    cfg = json.loads((out / "summary.json").read_text())["policy_config"]
    # the file's table, then --max-running, then the preset's own fields
    assert (cfg["tfwd_s"], cfg["max_running"], cfg["profile_time_cap_s"], cfg["profiling"]) == (30.0, 3, 45.0, "always")
    out = tmp_path / "defaults"
    assert main(["simulate", "--trace", trace, "--workload", "hpo", "--policy", "greedy", "--end", "+30m",
                 "--out", str(out), "--quiet", "--no-plots"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["max_running"], summary["horizon_s"]) == (PolicyConfig().max_running, PolicyConfig().tfwd_s)
    capsys.readouterr()
    conf.write_text("[policy]\ntfwd = 30.0\n")
    assert main(["simulate", "--trace", trace, "--policy-config", str(conf), "--out", str(tmp_path / "x")]) == 2
    assert "policy.toml: policy: unknown key(s) tfwd" in capsys.readouterr().err
    conf.write_text("[policy]\nmax_running = -1\n")
    assert main(["evaluate", "--trace", trace, "--policy-config", str(conf), "--out", str(tmp_path / "x")]) == 2
    assert "policy.toml: policy.max_running must be" in capsys.readouterr().err
    assert main(["simulate", "--trace", trace, "--max-running", "0", "--out", str(tmp_path / "x")]) == 2
    assert "--max-running 0: adaptive admission needs a Pjmax floor >= 1" in capsys.readouterr().err
    conf.write_text("[policy]\nmax_running = 99999999999999999999\n")  # the daemon's loader says the same
    assert main(["simulate", "--trace", trace, "--policy-config", str(conf), "--out", str(tmp_path / "x")]) == 2
    assert "policy.toml: policy.max_running must be a finite number of at most 1e+15" in capsys.readouterr().err


def test_simulate_reports_bad_inputs(tmp_path: Path, capsys):
    trace = str(tiny_trace(tmp_path))
    assert main(["simulate", "--trace", trace, "--policy", "fastest", "--out", str(tmp_path / "x")]) == 2
    assert "unknown fastest" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "x")]) == 2
    assert "missing.csv" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('[{"model": "nope"}]')
    assert main(["simulate", "--trace", trace, "--workload", str(bad), "--out", str(tmp_path / "x")]) == 2
    assert "bad.json: job #1: unknown model 'nope'" in capsys.readouterr().err


@pytest.mark.slow
def test_summit_day_replay_conserves_node_seconds(summit_nodes: Path, summit_scaling: Path):
    import traces
    from simulator import SimConfig, simulate
    from simulator.workload import load_scaling

    tl = traces.read(summit_nodes)
    config = SimConfig(start=tl.start, end=tl.start + 86400.0)
    res = simulate(tl, "malletrain", "nas", scaling=load_scaling(summit_scaling), config=config)
    s = res.summary
    assert s["idle_node_seconds"] == pytest.approx(tl.idle_node_seconds(tl.start, tl.start + 86400.0))
    assert 0 < s["used_node_seconds"] <= s["idle_node_seconds"]
    assert s["jobs_completed"] > 0 and s["samples_processed"] > 0
    cfg = s["policy_config"]
    limit = cfg["max_running"] if cfg.get("admission", "fixed") == "fixed" else cfg["admission_cap"] or math.inf
    assert all(r.running_jobs <= limit and r.running_jobs <= r.used_nodes for r in res.rows)  # a job runs on >= 1 node


def test_simulate_without_trace_uses_the_embedded_week(tmp_path: Path):
    out = tmp_path / "default"
    assert main(["simulate", "--end", "+2h", "--out", str(out), "--quiet", "--no-plots"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["nodes_total"] == 4608 and summary["span_seconds"] == 7200
    assert summary["decisions"] <= 7200 / 60 + 1  # the embedded trace decides at most once a minute
    assert 0 < summary["used_node_seconds"] <= summary["idle_node_seconds"]


# ------------------------------------------------------------------ real replay interface, overrides


def test_simulate_replays_a_jobs_file_on_n_nodes_of_a_window_with_a_calibration(tmp_path: Path, philly_data: Path):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("name,time,application,num_replicas,batch_size,samples\n"
                    "a,0,cifar10,4,,\nb,100,imagenet,8,40,1e6\n")
    out = tmp_path / "rr"
    code = main(["simulate", "--trace", str(tiny_trace(tmp_path)), "--start", "+0", "--duration", "30m",
                 "--nodes", "3", "--jobs-file", str(jobs), "--calibration", "free", "--out", str(out),
                 "--quiet", "--no-plots"])
    assert code == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["nodes_total"] == 3 and s["span_seconds"] == 1800 and s["jobs_submitted"] == 2
    assert s["calibration"] == "free" and s["trained_node_seconds"] <= s["held_node_seconds"] <= s["idle_node_seconds"]
    # the three nodes idle longest in [1000, 2800]: h1..h5 idle all along (h0 leaves at 2200) -> h1, h2, h3
    assert s["idle_node_seconds"] == 3 * 1800


def test_simulate_charges_the_shipped_calibration_by_default(tmp_path: Path):
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(tiny_trace(tmp_path)), "--workload", "hpo", "--end", "+1h",
                 "--out", str(out), "--quiet", "--no-plots"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["calibration"] == "simulator/calibration.json" and s["cold_starts"] >= 1
    assert s["held_node_seconds"] < s["idle_node_seconds"]  # pilots take their start latency


@pytest.mark.parametrize("argv, message", [
    (["--admission", "fixed", "--admission-cap", "5"], "--admission-cap 5 and --admission fixed"),
    (["--policy", "freetrain", "--admission-cap", "5"], "--admission-cap 5 and policy freetrain's admission"),
    (["--end", "+1h", "--duration", "1h"], "--end .* and --duration"),
    (["--jobs-file", "nope.csv"], "--jobs-file nope.csv"),
    (["--calibration", "nope.json"], "nope.json"),
])
def test_simulate_bad_combinations_name_both(tmp_path: Path, capsys, argv, message):
    code = main(["simulate", "--trace", str(tiny_trace(tmp_path)), "--out", str(tmp_path / "o"), "--quiet",
                 "--no-plots"] + argv)
    assert code != 0
    import re
    assert re.search(message, capsys.readouterr().err)


def test_simulate_overrides_win_over_the_preset(tmp_path: Path):
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(tiny_trace(tmp_path)), "--workload", "hpo", "--policy", "freetrain",
                 "--admission", "adaptive", "--admission-cap", "7", "--objective", "work", "--end", "+1h",
                 "--out", str(out), "--quiet", "--no-plots"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert (s["admission"], s["admission_cap"], s["objective"]) == ("adaptive", 7, "work")


def test_simulate_takes_the_completion_objective_as_a_flag(tmp_path: Path):
    out = tmp_path / "completion"
    assert main(["simulate", "--trace", str(tiny_trace(tmp_path)), "--workload", "hpo", "--objective", "completion",
                 "--end", "+1h", "--out", str(out), "--quiet", "--no-plots"]) == 0
    assert json.loads((out / "summary.json").read_text())["objective"] == "completion"


def test_simulate_nodes_by_name_and_unknown_names_are_named(tmp_path: Path, capsys):
    out = tmp_path / "named"
    assert main(["simulate", "--trace", str(tiny_trace(tmp_path)), "--workload", "hpo", "--nodes", "h0,h7",
                 "--duration", "1h", "--calibration", "free", "--out", str(out), "--quiet", "--no-plots"]) == 0
    s = json.loads((out / "summary.json").read_text())
    # the first hour is [1000, 4600]: h0 idle 1000-2200, h7 idle 2800-4600
    assert s["nodes_total"] == 2 and s["idle_node_seconds"] == pytest.approx(1200.0 + 1800.0)
    assert main(["simulate", "--trace", str(tiny_trace(tmp_path)), "--nodes", "h0,zz", "--out", str(out),
                 "--quiet", "--no-plots"]) != 0
    assert "--nodes: zz not in" in capsys.readouterr().err
