"""``malletrain evaluate`` end to end on a tiny trace (2 seeds), and its statistics, targets and runner."""

from __future__ import annotations

import math

import io
import json
from pathlib import Path

import pytest

from malletrain.cli import main
from malletrain.cli.simulate import parse_seeds
from policy import PolicyConfig
from evaluation.evaluate import run_specs
from evaluation.regimes import check_targets
from evaluation.results import (
    POLICIES,
    CEILING_PRIOR,
    PRIORS,
    SWEEP_MAX_NODES,
    SWEEP_MAX_RUNNING,
    TFWD_CANDIDATES,
    EvalSettings,
    Evaluation,
    mean_sd,
    policy_rows,
    tfwd_choice,
)
from evaluation.sweep import Progress, Replays, RunSpec, duplicates, run_replays


def tiny_trace(tmp_path: Path) -> Path:
    rows = ["time,node,idle"] + [f"1000,h{i},{1 if i < 40 else 0}" for i in range(80)]
    rows += [f"{1000 + 300 * k},h{40 + k},1" for k in range(1, 20)]
    rows += [f"{1200 + 400 * k},h{k},0" for k in range(1, 10)]
    path = tmp_path / "tiny.nodes.csv"
    path.write_text("# hand-made: 40 idle nodes, more arrive, some recalled\n" + "\n".join(rows) + "\n")
    return path


def evaluate_tiny(tmp_path: Path, *extra: str) -> tuple[int, Path]:
    out = tmp_path / "eval"
    code = main(["evaluate", "--trace", str(tiny_trace(tmp_path)), "--end", "+1h", "--workers", "0",
                 "--seeds", "2", "--workloads", "nas", "--out", str(out), "--quiet", *extra])
    return code, out


def test_evaluate_writes_work_tables_over_seeds_chart_and_targets(tmp_path: Path, capsys):
    code, out = evaluate_tiny(tmp_path)
    printed = capsys.readouterr()
    data = json.loads((out / "evaluation.json").read_text())
    (cell,) = data["cells"]
    assert cell["workload"] == "nas"
    rows = {r["policy"]: r for r in cell["rows"]}
    assert set(rows) == {f"freetrain:{p}" for p in PRIORS + (CEILING_PRIOR,)} | (set(POLICIES) - {"freetrain"})
    assert all(r["seeds"] == [0, 1] for r in rows.values())
    best = [r for r in rows.values() if r["best_prior"]]
    assert len(best) == 1 and best[0]["vs_best_freetrain_whole_pct"] == [0.0, 0.0]
    assert sum(r["worst_prior"] for r in rows.values()) == 1
    assert rows["milp-true"]["regret_whole_pct"] == [0.0, 0.0]  # the ceiling's own regret
    # each policy's ceiling is the same admission given the true curves
    ceiling = f"freetrain:{CEILING_PRIOR}"
    assert not rows[ceiling]["best_prior"] and not rows[ceiling]["worst_prior"]  # not a user's prior
    for r in rows.values():
        assert r["regret_against"] in ("milp-true", ceiling)
        assert rows[r["regret_against"]]["regret_whole_pct"] == [0.0, 0.0]
    admission = {r["summary"]["label"]: r["summary"]["policy_config"]["admission"] for r in data["runs"]}
    same = admission["freetrain:linear"] == admission["milp-true"]
    assert rows["freetrain:linear"]["regret_against"] == ("milp-true" if same else ceiling)
    for r in rows.values():  # the whole is the two periods
        whole = r["work_whole"][0]
        parts = (r["work_constrained"][0] or 0.0) + (r["work_unconstrained"][0] or 0.0)
        assert parts == pytest.approx(whole, rel=1e-6)
    runs = data["runs"]
    assert len(runs) == 2 * (len(PRIORS) + len(POLICIES))  # + the ceiling prior
    assert {r["spec"]["seed"] for r in runs} == {0, 1}
    md = (out / "evaluation.md").read_text()
    assert "| malletrain |" in md and " ± " in md and "regret vs milp-true" in md and "constrained" in md
    assert "JCT mean h" in md  # completion times and who waits
    assert md.count("PASS") + md.count("FAIL") == len(data["targets"])
    assert "malletrain evaluate --trace" in md and "--seeds 2" in md
    assert data["settings"]["policy_config"] == PolicyConfig().as_dict()
    assert (out / "fig3_10.png").stat().st_size > 0
    assert not (out / "fig3_7.png").exists()  # paper figures only for the default trace or when asked
    # the exit code follows the targets; --no-check only reports
    failed = [t for t in data["targets"] if not t["passed"]]
    assert failed and code == 1 and "targets FAIL" in printed.err
    assert ("PASS:" in printed.out or "FAIL:" in printed.out) and "vs freetrain best" in printed.out
    code, _ = evaluate_tiny(tmp_path, "--no-check")
    assert code == 0


def test_sweep_tfwd_prints_its_choice(tmp_path: Path, capsys):
    out = tmp_path / "tfwd"
    code = main(["evaluate", "--trace", str(tiny_trace(tmp_path)), "--end", "+30m", "--workers", "0",
                 "--seeds", "1", "--workloads", "hpo", "--sweep-tfwd", "--out", str(out), "--quiet"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "chosen Tfwd:" in printed
    data = json.loads((out / "evaluation.json").read_text())
    assert sorted({r["tfwd_s"] for r in data["tfwd"]}) == list(TFWD_CANDIDATES)
    assert "Chosen Tfwd" in (out / "evaluation.md").read_text()


def test_evaluate_rejects_bad_options(tmp_path: Path, capsys):
    trace = str(tiny_trace(tmp_path))
    assert main(["evaluate", "--trace", trace, "--workloads", "nas,cv", "--out", str(tmp_path / "x")]) == 2
    assert "--workloads 'nas,cv'" in capsys.readouterr().err
    assert main(["evaluate", "--trace", trace, "--workers", "-1", "--out", str(tmp_path / "x")]) == 2
    assert "--workers" in capsys.readouterr().err
    assert main(["evaluate", "--trace", trace, "--policies", "best", "--out", str(tmp_path / "x")]) == 2
    assert "--policies 'best'" in capsys.readouterr().err
    assert main(["evaluate", "--trace", trace, "--priors", "median", "--out", str(tmp_path / "x")]) == 2
    assert "freetrain model 'median'" in capsys.readouterr().err
    assert main(["evaluate", "--trace", trace, "--seeds", "0", "--out", str(tmp_path / "x")]) == 2
    assert "--seeds '0'" in capsys.readouterr().err
    assert main(["simulate", "--trace", trace, "--policy", "freetrain", "--freetrain-model", "noise:x",
                 "--out", str(tmp_path / "x")]) == 2
    assert "freetrain model 'noise:x'" in capsys.readouterr().err


def test_parse_seeds():
    assert parse_seeds("5") == (0, 1, 2, 3, 4)
    assert parse_seeds("3,") == (3,) and parse_seeds("0,7") == (0, 7)
    for bad in ("0", "x", "1,1", ","):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)


def summary(work: float, seed: int = 0, constrained: float | None = None, **kw) -> dict:
    c = work if constrained is None else constrained
    base = {"work_node_seconds": work, "work_node_seconds_constrained": c, "work_node_seconds_unconstrained": work - c,
            "constrained_seconds": 50.0, "span_seconds": 100.0, "samples_processed": 10 * work,
            "productive_fraction": 0.5, "used_fraction": 0.6, "profiling_fraction": 0.0, "profiled_jobs": 0,
            "scalability_error_pct": None, "jobs_completed": 1, "wall_seconds": 1.0, "cpu_seconds": 1.0}
    return {**base, **kw}


def hand_evaluation(mt_work: tuple[float, float]) -> Evaluation:
    runs = []
    for seed in (0, 1):
        for label, w in (("freetrain:mean", 100.0), ("freetrain:linear", 80.0), ("milp-true", 110.0),
                         ("malletrain", mt_work[seed])):
            policy, _, prior = label.partition(":")
            runs.append((RunSpec("nas", policy, seed, prior=prior or "mean"), summary(w, seed)))
    return Evaluation(EvalSettings(seeds=(0, 1), workloads=("nas",)), "t", "s", runs,
                      trace_claims={"capacity_nodes": 640, "time_above_pct": 19.0,
                                    "node_seconds_while_above_pct": 71.0, "node_seconds_beyond_pct": 36.0})


def test_rows_compare_in_work_against_the_best_prior_and_count_regret():
    ev = hand_evaluation((121.0, 119.0))
    rows = {r["policy"]: r for r in policy_rows(ev, ev.cells()[0])}
    assert rows["freetrain:mean"]["best_prior"] and rows["freetrain:linear"]["worst_prior"]
    assert rows["malletrain"]["vs_best_freetrain_whole_pct"] == pytest.approx(mean_sd([21.0, 19.0]))
    assert rows["malletrain"]["regret_whole_pct"][0] == pytest.approx(100 * (110 - 120) / 110)
    assert rows["freetrain:linear"]["regret_whole_pct"][0] == pytest.approx(100 * 30 / 110)
    targets = {t.name.split(":")[0] + ":" + t.name.split(":")[1][:12]: t.passed for t in check_targets(ev)}
    assert list(targets.values()) == [False, True, True]  # +20.0% mean is not >= 20: 21 and 19 average 20
    ev = hand_evaluation((122.0, 121.0))
    passed = [t.passed for t in check_targets(ev)]
    assert passed == [True, True, True]
    ev = hand_evaluation((100.0, 100.0))  # regret 9.1% > 3%: fails, and the gain fails
    assert [t.passed for t in check_targets(ev)] == [False, False, True]
    ev.trace_claims["node_seconds_while_above_pct"] = 40.0
    assert check_targets(ev)[-1].passed is False


def test_a_policy_with_other_periods_gets_no_period_comparison():
    runs = []
    for seed in (0, 1):
        runs.append((RunSpec("nas", "freetrain", seed), summary(100.0, seed, constrained=40.0)))
        runs.append((RunSpec("nas", "greedy", seed), summary(90.0, seed, constrained=30.0)))
        # adaptive admission: its admitted jobs absorb the pool, so nearly every second is constrained
        runs.append((RunSpec("nas", "malletrain", seed), summary(180.0, seed, constrained=179.0,
                                                                 constrained_seconds=99.9)))
    ev = Evaluation(EvalSettings(seeds=(0, 1), workloads=("nas",)), "t", "s", runs)
    rows = {r["policy"]: r for r in policy_rows(ev, ev.cells()[0])}
    assert rows["greedy"]["same_periods"] and rows["greedy"]["vs_best_freetrain_constrained_pct"][0] == pytest.approx(-25.0)
    mt = rows["malletrain"]
    assert not mt["same_periods"] and mt["vs_best_freetrain_whole_pct"][0] == pytest.approx(80.0)
    assert all(math.isnan(mt[f"vs_best_freetrain_{p}_pct"][0]) for p in ("constrained", "unconstrained"))
    assert mt["work_constrained"][0] == 179.0  # its own periods' work is still shown
    gain = next(t for t in check_targets(ev) if t.name.startswith("NAS: malletrain >="))
    assert "no period comparison" in gain.value and gain.passed


def test_fair_share_cost_is_the_default_over_itself_without_shares_from_each_belief():
    """``malletrain-no-share`` beside the default: the cost of the shares, per starting belief and seed,
    in the report's headline lines; nothing where it did not run."""
    from evaluation.report import fair_share_lines
    from evaluation.results import NO_SHARE, fair_share_costs
    from policy import preset
    from policy.config import Fairness

    assert preset(NO_SHARE) == PolicyConfig(fairness=Fairness.NONE)  # the default, shares off
    runs = []
    for seed, works in enumerate(({"malletrain": 99.0, NO_SHARE: 100.0, "malletrain:linear": 90.0,
                                   f"{NO_SHARE}:linear": 90.0},
                                  {"malletrain": 101.0, NO_SHARE: 100.0, "malletrain:linear": 88.0,
                                   f"{NO_SHARE}:linear": 80.0})):
        for label, w in works.items():
            policy, _, prior = label.partition(":")
            runs.append((RunSpec("scarce", policy, seed, prior=prior or "mean"), summary(w, seed)))
    ev = Evaluation(EvalSettings(seeds=(0, 1), workloads=("scarce",)), "t", "s", runs)
    cell = ev.cells()[0]
    costs = fair_share_costs(ev, cell)
    assert set(costs) == {"malletrain", "malletrain:linear"}
    assert costs["malletrain"] == pytest.approx(mean_sd([-1.0, 1.0]))
    assert costs["malletrain:linear"] == pytest.approx(mean_sd([0.0, 10.0]))
    lines = fair_share_lines(ev, cell)
    assert lines[1] == (f"fair share's cost in work (malletrain:linear over {NO_SHARE}:linear, per seed, 2 seed(s)): "
                        "+5.00 ± 7.07%")
    alone = Evaluation(ev.settings, "t", "s", [(spec, s) for spec, s in runs if spec.policy != NO_SHARE])
    assert fair_share_costs(alone, cell) == {} and fair_share_lines(alone, cell) == []


def test_fair_share_cost_is_reported_in_an_endless_streams_cell_too():
    """Before: only a real stream's cell (philly, scarce) said the shares' cost; a generated stream's
    (nas, hpo: with ``--users job`` each job is a user) ran ``malletrain-no-share`` and said nothing."""
    import io

    from evaluation.report import markdown, print_report
    from evaluation.results import NO_SHARE

    runs = [(RunSpec("nas", policy, seed), summary(w, seed))
            for seed in (0, 1) for policy, w in (("malletrain", 99.0), (NO_SHARE, 100.0))]
    ev = Evaluation(EvalSettings(seeds=(0, 1), workloads=("nas",)), "t", "s", runs)
    line = f"fair share's cost in work (malletrain over {NO_SHARE}, per seed, 2 seed(s)): -1.00 ± 0.00%"
    out = io.StringIO()
    print_report(ev, out)
    assert line in out.getvalue() and line in markdown(ev, "malletrain evaluate ...")


def test_the_page_names_each_option_that_changed_what_ran():
    from malletrain.cli import build_parser
    from malletrain.cli.simulate import _argv_of

    args = build_parser().parse_args(["evaluate", "--out", "o", "--users", "job", "--seeds", "1"])
    assert _argv_of(args) == ["--seeds", "1", "--users", "job", "--out", "o"]  # whose each job is: what ran


def test_mean_sd():
    assert mean_sd([1.0, 3.0]) == (2.0, pytest.approx(2 ** 0.5))
    assert mean_sd([5.0]) == (5.0, 0.0)
    m, sd = mean_sd([None])  # type: ignore[list-item]
    assert m != m and sd != sd  # NaN


def test_run_specs_cover_policies_priors_seeds_and_the_sweep_grid():
    st = EvalSettings(seeds=(0, 1, 2, 3, 4))
    per_cell = len(PRIORS) + len(POLICIES)  # freetrain's panel, the ceiling prior, the other policies
    assert len(run_specs(st)) == 2 * 5 * per_cell
    sweep = run_specs(EvalSettings(seeds=(0, 1), sweep=True))
    assert len(sweep) == 2 * 2 * len(SWEEP_MAX_RUNNING) * len(SWEEP_MAX_NODES) * per_cell
    assert {(s.max_running, s.max_nodes) for s in sweep} == {(p, n) for p in SWEEP_MAX_RUNNING for n in SWEEP_MAX_NODES}
    assert {s.label for s in sweep} >= {"jpa", "milp-true", "freetrain:other", "freetrain:noise:20"}
    tf = run_specs(EvalSettings(seeds=(0,), workloads=("nas",), tfwd_sweep=True))
    assert sorted({s.tfwd_s for s in tf}) == list(TFWD_CANDIDATES)


def test_tfwd_choice_takes_the_best_mean_share():
    rows = [{"tfwd_s": 60.0, "of_best_pct": 100.0}, {"tfwd_s": 120.0, "of_best_pct": 99.0},
            {"tfwd_s": 60.0, "of_best_pct": 99.5}, {"tfwd_s": 120.0, "of_best_pct": 100.0}]
    assert tfwd_choice(rows) == 60.0
    assert tfwd_choice([]) is None


def tiny_replays(tmp_path: Path) -> Replays:
    import traces
    from simulator import SimConfig, find_scaling

    tl = traces.read(str(tiny_trace(tmp_path)))
    return Replays(tl, find_scaling(), PolicyConfig(), SimConfig(end=tl.start + 1800.0))


def test_dask_local_cluster_gives_the_in_process_results(tmp_path: Path):
    replays = tiny_replays(tmp_path)
    specs = [RunSpec("hpo", "milp-true", 0), RunSpec("hpo", "freetrain", 1, prior="linear")]
    here = run_replays(replays, specs, workers=0)
    on_dask = run_replays(replays, specs, workers=1)
    assert [s for s, _ in on_dask] == specs
    for (_, a), (_, b) in zip(here, on_dask):
        assert a["work_node_seconds"] == b["work_node_seconds"] and a["samples_processed"] == b["samples_processed"]


def test_one_preset_under_two_names_is_replayed_once(tmp_path: Path):
    replays = tiny_replays(tmp_path)
    # the base Tfwd named again: the same preset and config under another spec
    a, b = RunSpec("hpo", "malletrain", 0), RunSpec("hpo", "malletrain", 0, tfwd_s=PolicyConfig().tfwd_s)
    linear = RunSpec("hpo", "malletrain", 0, prior="linear")  # another starting belief: its own replay
    assert duplicates([a, b, linear, RunSpec("hpo", "freetrain", 0)], replays) == {b: a}
    assert linear.label == "malletrain:linear"
    seen: list[str] = []
    done = run_replays(replays, [a, b], workers=0, on_done=lambda spec, s: seen.append(spec.label))
    assert len(seen) == 2 and done[1][1]["replayed_as"] == "malletrain"
    assert done[0][1]["work_node_seconds"] == done[1][1]["work_node_seconds"]


def test_progress_logs_plain_lines_when_not_a_terminal():
    stream = io.StringIO()
    progress = Progress(2, stream=stream)
    progress(RunSpec("nas", "jpa", 3, max_running=40), {"work_node_seconds": 1.5e6, "cpu_seconds": 2.0})
    progress.close()
    line = stream.getvalue()
    assert line.startswith("[1/2] nas/jpa (seed 3, Pjmax 40): work 1.5e+06 node-s")
    quiet = io.StringIO()
    Progress(1, quiet=True, stream=quiet)(RunSpec("nas", "jpa"), {"work_node_seconds": 1.0})
    assert quiet.getvalue() == ""


def test_regimes_preset_reports_the_three_regimes_apart_from_one_command(tmp_path: Path, capsys, monkeypatch,
                                                                         summit_nodes: Path, philly_data: Path):
    # a small version of the headline command: half an hour, 16 nodes, one seed, four policies
    monkeypatch.setenv("MALLETRAIN_DATA", str(philly_data))
    code = main(["evaluate", "--regimes", "--trace", str(summit_nodes), "--end", "+78.5h", "--nodes", "16",
                 "--seeds", "1", "--policies", "malletrain,freetrain,milp-true", "--priors", "mean,linear",
                 "--workers", "0", "--quiet", "--no-paper-figures", "--out", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert code == 1  # one seed: no target can pass (>= 5 seeds)
    for title in ("SCARCE", "PHILLY-DONE@0.3", "PHILLY@2"):
        assert title in out
    assert "(real stream, scarce)" in out and "(real stream, saturated)" in out
    assert "FAIL: scarce: malletrain reaches >= 0.95x milp-true's work" in out
    assert "philly@2 (saturated): malletrain's work >= 0.99x" in out
    ev = json.loads((tmp_path / "r" / "evaluation.json").read_text())
    labels = {r["spec"]["workload"] + "/" + r["summary"]["label"] for r in ev["runs"]}
    assert {"scarce/malletrain:linear", "scarce/milp-true", "philly@2/freetrain:linear"} <= labels
    assert not any("fixed" in label for label in labels)  # the preset drops the fixed-Pjmax rows


def test_simulate_starts_the_learning_policies_from_the_prior_it_is_given(tmp_path: Path, monkeypatch):
    import simulator

    seen: list[object] = []
    real = simulator.simulate

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs.get("learning_prior"))
        return real(*args, **kwargs)

    monkeypatch.setattr(simulator, "simulate", spy)
    trace = str(tiny_trace(tmp_path))
    assert main(["simulate", "--trace", trace, "--end", "+10m", "--policy", "malletrain", "--prior", "linear",
                 "--out", str(tmp_path / "lin"), "--no-plots", "--quiet"]) == 0
    assert main(["simulate", "--trace", trace, "--end", "+10m", "--policy", "malletrain",
                 "--out", str(tmp_path / "mean"), "--no-plots", "--quiet"]) == 0
    assert seen == ["linear", "mean"]  # one cell of evaluate's malletrain:linear, replayed alone
