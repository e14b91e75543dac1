"""Baselines on equal terms (overrides win over presets) and the rigid-preemptible baseline."""

from __future__ import annotations

import pytest

from policy.config import Admission, Objective
from simulator import PolicyContext, SimConfig, Simulator
from simulator.calibration import Calibration, free
from simulator.policies import POLICIES, RIGID, Overrides, make_policy, resolve_config
from tests.test_simulator import job, timeline, workload


@pytest.mark.parametrize("name", [p for p in POLICIES])
def test_every_override_wins_over_every_preset(name):
    ov = Overrides(admission="adaptive", max_running=7, admission_cap=33, objective="work")
    cfg = resolve_config(name, None, ov)
    assert (cfg.admission, cfg.max_running, cfg.admission_cap, cfg.objective) == \
        (Admission.ADAPTIVE, 7, 33, Objective.WORK)
    fixed = resolve_config(name, None, Overrides(admission="fixed", max_running=3, objective="samples"))
    assert (fixed.admission, fixed.max_running, fixed.objective) == (Admission.FIXED, 3, Objective.SAMPLES)


def test_an_impossible_combination_names_both():
    with pytest.raises(ValueError, match="--admission-cap 20 and --admission fixed"):
        resolve_config("malletrain", None, Overrides(admission="fixed", admission_cap=20))
    with pytest.raises(ValueError, match="--admission-cap 20 and policy freetrain's admission fixed"):
        resolve_config("freetrain", None, Overrides(admission_cap=20))
    with pytest.raises(ValueError, match="--admission adaptive and --max-running 0"):
        resolve_config("greedy", None, Overrides(admission="adaptive", max_running=0))


def run(tl, specs, policy, cal=None, **ov):
    pol = make_policy(policy, PolicyContext({s.model: s.scaling for s in specs}), None, Overrides(**ov))
    return Simulator(tl, workload(*specs), pol, SimConfig(calibration=cal or free())).run()


def test_the_summary_records_what_ran():
    tl = timeline(["n1"], ["n1"], end=50.0)
    s = run(tl, [job()], "freetrain", admission="adaptive", admission_cap=5, max_running=2).summary
    assert (s["admission"], s["max_running"], s["admission_cap"], s["objective"], s["calibration"]) == \
        ("adaptive", 2, 5, "samples", "free")


def test_rigid_waits_for_its_count_never_rescales_and_is_killed_by_one_recall():
    # 4 nodes: 2 idle at 0, 2 more at 10; n1 recalled at 50, back at 60
    tl = timeline(["n1", "n2", "n3", "n4"], ["n1", "n2"],
                  [(10.0, "n3", True), (10.0, "n4", True), (50.0, "n1", False), (60.0, "n1", True)], end=100.0)
    spec = job(max_nodes=4, requested_nodes=4)
    res = run(tl, [spec], RIGID, Calibration("t", restart_s=5.0, commit_interval_s=30.0))
    counts = [n for _, _, n, _ in res.jobs[0].history]
    assert set(counts) <= {0, 4}  # never at another count
    assert res.summary["rescales"] == 0 and res.summary["restarts"] == 1
    # runs 10-50 (commit at 40: 10 s lost), again from 60 + 5 s restart to 100
    assert res.summary["samples_processed"] == pytest.approx(40.0 * 30.0 + 40.0 * 35.0)
    # the elastic greedy baseline on the same trace starts at once and rescales
    elastic = run(tl, [spec], "greedy", Calibration("t", restart_s=5.0, commit_interval_s=30.0))
    assert elastic.summary["rescales"] > 0


def test_evaluate_honours_the_users_admission_flags_for_jpa_or_refuses_them_before_any_replay():
    from policy import PolicyConfig
    from evaluation.evaluate import refuse_impossible
    from evaluation.sweep import Replays, RunSpec

    tl = timeline(["n0", "n1"], ["n0", "n1"], end=100.0)
    base = Overrides(admission="adaptive", objective="work")
    jpa = RunSpec("philly@1", "jpa")
    plain = Replays(tl, None, PolicyConfig(), SimConfig(), None, base)  # type: ignore[arg-type]
    assert resolve_config("jpa", PolicyConfig(), plain.overrides_for(jpa)).admission is Admission.FIXED  # its own
    given = Overrides(admission="fixed", max_running=5)
    told = Replays(tl, None, PolicyConfig(), SimConfig(), None, Overrides(admission="fixed", max_running=5,
                                                                          objective="work"), given)  # type: ignore[arg-type]
    cfg = resolve_config("jpa", PolicyConfig(), told.overrides_for(jpa))
    assert (cfg.admission, cfg.max_running, cfg.objective) == (Admission.FIXED, 5, Objective.WORK)
    adaptive = Replays(tl, None, PolicyConfig(), SimConfig(), None, base,
                       Overrides(admission="adaptive"))  # type: ignore[arg-type]
    assert resolve_config("jpa", PolicyConfig(), adaptive.overrides_for(jpa)).admission is Admission.ADAPTIVE
    capped = Replays(tl, None, PolicyConfig(), SimConfig(), None, Overrides(admission="adaptive", admission_cap=7),
                     Overrides(admission_cap=7))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="jpa: --admission-cap 7 and policy jpa's admission fixed"):
        refuse_impossible(capped, [RunSpec("philly@1", "malletrain"), jpa])
