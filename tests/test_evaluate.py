"""``malletrain evaluate`` end to end on a tiny trace, and its table and target logic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from malletrain.cli import main
from policy import PolicyConfig
from simulator.evaluate import (
    NOISE_SWEEP,
    POLICIES,
    EvalSettings,
    Evaluation,
    check_targets,
    policy_rows,
    run_specs,
    sweep_rows,
)


def tiny_trace(tmp_path: Path) -> Path:
    rows = ["time,node,idle"] + [f"1000,h{i},{1 if i < 40 else 0}" for i in range(80)]
    rows += [f"{1000 + 300 * k},h{40 + k},1" for k in range(1, 20)]
    rows += [f"{1200 + 400 * k},h{k},0" for k in range(1, 10)]
    path = tmp_path / "tiny.nodes.csv"
    path.write_text("# hand-made: 40 idle nodes, more arrive, some recalled\n" + "\n".join(rows) + "\n")
    return path


def test_evaluate_writes_tables_chart_and_targets(tmp_path: Path, capsys):
    out = tmp_path / "eval"
    code = main(["evaluate", "--trace", str(tiny_trace(tmp_path)), "--end", "+2h", "--workers", "1",
                 "--out", str(out), "--quiet"])
    assert code == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "evaluation.json").read_text())
    assert set(data["policies"]) == {"nas", "hpo"}
    for workload, rows in data["policies"].items():
        assert [r["policy"] for r in rows] == list(POLICIES)
        by = {r["policy"]: r for r in rows}
        assert by["freetrain"]["over_freetrain_pct"] == pytest.approx(0.0)
        assert by["oracle"]["of_oracle_pct"] == pytest.approx(100.0)
        assert by["malletrain"]["profiled_jobs"] > 0
        assert by["malletrain"]["scale_ups_per_profiled_job"] == pytest.approx(1.0)
        assert by["greedy"]["profiling_overhead_pct"] == 0.0
        s = data["summaries"][workload]["malletrain"]
        assert by["malletrain"]["profiling_overhead_pct"] == pytest.approx(
            100.0 * s["profiling_node_seconds"] / s["used_node_seconds"])
    assert [r["noise_pct"] for r in data["freetrain_noise_sweep"]] == list(NOISE_SWEEP)
    names = [t["name"] for t in data["targets"]]
    assert any("NAS: malletrain >= freetrain + 20%" in n for n in names)
    assert sum("one scale-up per profiled job" in n for n in names) == 2
    md = (out / "evaluation.md").read_text()
    assert "| NAS | malletrain |" in md and "| HPO | oracle |" in md and "noise X" in md
    assert md.count("PASS") + md.count("FAIL") == len(data["targets"])
    assert "malletrain evaluate --trace" in md  # the command that made it
    assert "Pjmax 10; Tfwd 120 s" in md  # the daemon's defaults
    assert data["settings"]["policy_config"] == PolicyConfig().as_dict()
    assert (out / "fig3_10.png").stat().st_size > 0
    assert ("PASS:" in printed or "FAIL:" in printed) and "vs freetrain" in printed


def test_evaluate_rejects_bad_options(tmp_path: Path, capsys):
    trace = str(tiny_trace(tmp_path))
    assert main(["evaluate", "--trace", trace, "--workloads", "nas,cv", "--out", str(tmp_path / "x")]) == 2
    assert "--workloads 'nas,cv'" in capsys.readouterr().err
    assert main(["evaluate", "--trace", trace, "--workers", "0", "--out", str(tmp_path / "x")]) == 2
    assert "--workers" in capsys.readouterr().err
    assert main(["simulate", "--trace", trace, "--policy", "freetrain", "--freetrain-model", "noise:x",
                 "--out", str(tmp_path / "x")]) == 2
    assert "freetrain model 'noise:x'" in capsys.readouterr().err


def summary(samples: float, used: float = 100.0, prof: float = 0.0, profiled: int = 0, ups: int = 0) -> dict:
    return {"samples_processed": samples, "used_node_seconds": used, "profiling_node_seconds": prof,
            "profiling_paused_node_seconds": 0.0, "profiled_jobs": profiled, "profiling_scale_ups": ups,
            "profiling_scale_ups_min_per_job": 1 if profiled else 0,
            "profiling_scale_ups_max_per_job": 1 if profiled else 0, "scalability_error_pct": None,
            "used_fraction": 0.5, "paused_node_seconds": 0.0, "rescales": 0, "jobs_completed": 0,
            "wall_seconds": 0.0}


def test_targets_pass_and_fail_on_the_numbers():
    runs = {"freetrain": summary(100.0), "greedy": summary(90.0), "oracle": summary(130.0),
            "malletrain": summary(121.0, prof=2.0, profiled=5, ups=5)}
    ev = Evaluation(EvalSettings(sweep=False), "t", "s", {"nas": runs})
    targets = {t.name.split(":")[1].strip(): t.passed for t in check_targets(ev)}
    assert targets == {"malletrain >= freetrain + 20%": True, "profiling node-seconds <= 3% of used": True,
                       "one scale-up per profiled job (inverse order)": True}
    rows = {r["policy"]: r for r in policy_rows(ev, "nas")}
    assert rows["malletrain"]["over_freetrain_pct"] == pytest.approx(21.0)
    assert rows["malletrain"]["of_oracle_pct"] == pytest.approx(100 * 121 / 130)
    runs["malletrain"] = summary(119.0, prof=4.0, profiled=5, ups=7)
    runs["malletrain"]["profiling_scale_ups_max_per_job"] = 3
    assert not any(t.passed for t in check_targets(ev))
    assert sweep_rows(ev) == []


def test_run_specs_cover_every_policy_workload_and_noise_level():
    specs = run_specs(EvalSettings())
    assert len(specs) == 2 * len(POLICIES) + len(NOISE_SWEEP)
    assert {(s.workload, s.label) for s in specs} >= {("nas", "malletrain"), ("hpo", "oracle"),
                                                      ("nas", "freetrain noise:40")}
    assert len(run_specs(EvalSettings(sweep=False, workloads=("hpo",)))) == len(POLICIES)
