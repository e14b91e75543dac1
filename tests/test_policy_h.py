"""Issue H's policy rules: passive learning with a pooled prior, gated profiling, adaptive admission,
node valuation, budgets and deadlines. Each test drives :class:`policy.Policy` with plain views."""

from __future__ import annotations

import math

from dataclasses import replace

import pytest

from policy import (
    PRESETS,
    Admission,
    EventKind,
    Horizon,
    JobView,
    Policy,
    PolicyConfig,
    PolicyConfigError,
    PolicyState,
    Profiling,
    Stop,
    StopReason,
    View,
    beliefs,
    preset,
)
from policy.valuation import MIN_FRAGMENTS, FragmentModel, learned_horizon
from test_policy import Cluster, evidence, est, jv, kinds, names


def linear(per_node: float, top: int) -> dict[int, float]:
    return {n: per_node * n for n in (1, 2, 4, 8, 16, 32, 64) if n <= top}


# ------------------------------------------------------------------ config


def test_the_default_policy_is_malletrain_and_jpa_is_the_papers():
    assert PRESETS["malletrain"] == {} and preset("malletrain") == PolicyConfig()
    cfg = PolicyConfig()
    assert cfg.profiling is Profiling.GATED and cfg.admission is Admission.ADAPTIVE
    jpa = preset("jpa")
    assert jpa.profiling is Profiling.ALWAYS and jpa.admission is Admission.FIXED and jpa.horizon is Horizon.TFWD
    assert preset("freetrain").admission is Admission.FIXED  # the published baseline keeps Pjmax fixed


def test_admission_and_horizon_knobs_round_trip_through_the_policy_table():
    cfg = PolicyConfig.from_mapping({"admission": "fixed", "admission_cap": 12, "horizon": "learned"})
    assert cfg.admission is Admission.FIXED and cfg.admission_cap == 12 and cfg.horizon is Horizon.LEARNED
    assert PolicyConfig.from_mapping(cfg.as_dict()) == cfg
    with pytest.raises(PolicyConfigError, match="daemon.policy.admission 'sometimes': choose one of fixed, adaptive"):
        PolicyConfig.from_mapping({"admission": "sometimes"}, "daemon.policy")
    with pytest.raises(PolicyConfigError, match="policy.admission_cap must be an integer"):
        PolicyConfig(admission_cap=-1)
    with pytest.raises(PolicyConfigError, match="horizon_min_s .* exceeds policy.horizon_max_s"):
        PolicyConfig(horizon_min_s=100.0, horizon_max_s=50.0)


# ------------------------------------------------------------------ passive learning


def test_a_finished_jobs_curve_shape_joins_the_pooled_prior():
    assert beliefs.shape_of({2: 20.0}) is None
    assert beliefs.shape_of({2: 20.0, 4: 30.0}) == {2: 1.0, 4: 0.75}
    pol = Policy(PolicyConfig(profiling="never"))
    c = Cluster(pol, names("n", 4))
    for k in range(beliefs.MIN_SHAPES):  # jobs that scale to 75% efficiency at 4 nodes, then leave
        job = f"done{k}"
        c.submit(jv(job, 2, 4, order=k))
        c.step(10.0 * k, {job: evidence(est(2, 20.0), est(4, 30.0))})
        c.finish(job)
    c.submit(jv("new", 2, 4, order=99))
    c.step(100.0)
    assert len(pol.state.shapes) == beliefs.MIN_SHAPES
    curve = pol.believed_curve(c.jobs["new"])
    # the pooled shape: 75% efficient at 4 nodes, at the population's per-node level
    assert curve[4] / curve[2] == pytest.approx(1.5)
    # a job's own first stable rate sets its level; the population keeps the shape
    assert c.count("new") == 4
    c.step(110.0, {"new": evidence(est(4, 150.0))})
    curve = pol.believed_curve(c.jobs["new"])
    assert curve[2] == pytest.approx(100.0) and curve[4] == pytest.approx(150.0)


def test_every_count_a_job_runs_at_is_learned_including_one_a_recall_gave_it():
    c = Cluster(Policy(PolicyConfig(profiling="never")), names("n", 4))
    c.submit(jv("a", 1, 4))
    c.step(0.0)
    assert c.count("a") == 4
    c.recall("n3", 5.0)  # the recall gives it 3 nodes, for free
    d = c.step(6.0, {"a": evidence(est(3, 27.0))})
    assert kinds(d, "a") == ["refined"] and c.policy.state.measured["a"] == {3: 27.0}


def test_a_saved_state_keeps_shapes_fragments_and_budgets_and_an_older_state_still_reads():
    st = PolicyState(shapes=[{1: 1.0, 4: 0.8}], fragments=[30.0, 600.0], over_budget={"x"})
    back = PolicyState.from_json(st.to_json())
    assert back.shapes == st.shapes and back.fragments == st.fragments and back.over_budget == {"x"}
    import json

    old = json.loads(PolicyState().to_json())
    for key in ("shapes", "fragments", "over_budget"):
        del old[key]
    assert PolicyState.from_json(json.dumps(old)) == PolicyState()


# ------------------------------------------------------------------ gated profiling

SUBLINEAR = {1: 10.0, 2: 18.0, 4: 30.0, 8: 40.0}


def _gated(**kw) -> Policy:
    return Policy(PolicyConfig(prior=tuple(SUBLINEAR.items()), max_running=10, admission="fixed", **kw))


def test_gated_profiling_profiles_a_long_job_when_nodes_are_scarce_from_free_nodes_down_to_its_share():
    c = Cluster(_gated(), names("n", 8))
    c.submit(jv("a", 1, 8, order=0))
    c.step(0.0)  # one job, nodes plentiful: no profile
    assert c.count("a") == 8 and not c.policy.state.profiles
    c.give(*names("f", 8))  # 16 held; a and b could absorb 16: not scarce, b needs no profile
    c.submit(JobView("b", 1, 8, order=1, work_left=1e7), JobView("c", 1, 8, order=2, work_left=1e7))
    d = c.step(1.0)  # with c, three jobs could absorb 24 > 16: c is profiled
    assert "b" not in d.profiling and d.profiling == {"c": 8}
    (start,) = [e for e in d.events if e.kind is EventKind.PROFILE_START]
    assert start.detail["lender"] is None  # never a lender: free nodes only
    assert start.detail["counts"] == [8, 16 // 3]  # ends at the count it is expected to get, not at its min
    assert not d.waiting  # and nobody waits for a profile


def test_gated_profiling_skips_short_jobs_and_never_blocks_the_queue():
    c = Cluster(_gated(), names("n", 10))
    c.submit(jv("a", 1, 8, order=0))
    c.step(0.0)
    c.submit(JobView("short", 1, 8, order=1, work_left=10.0), JobView("after", 1, 8, order=2, work_left=10.0))
    d = c.step(1.0)
    assert not d.profiling and d.admitted == ("a", "short", "after")
    # a long job the free pool cannot profile is admitted anyway and learns passively
    c3 = Cluster(_gated(), names("n", 8))
    c3.submit(jv("a", 1, 8, order=0), JobView("long", 1, 8, order=1, work_left=1e9))
    d = c3.step(0.0)
    assert d.admitted == ("a", "long") and not d.waiting


def test_profiling_always_keeps_the_papers_jpa():
    c = Cluster(Policy(preset("jpa", max_running=2)), names("n", 4))
    c.submit(jv("a", 1, 4))
    d = c.step(0.0)
    assert d.profiling == {"a": 4} and "profile_start" in kinds(d, "a")


# ------------------------------------------------------------------ adaptive admission


def test_adaptive_admission_admits_beyond_pjmax_while_nodes_would_stay_idle():
    fixed = Cluster(Policy(PolicyConfig(max_running=1, admission="fixed", profiling="never")), names("n", 8))
    adaptive = Cluster(Policy(PolicyConfig(max_running=1, profiling="never")), names("n", 8))
    for c in (fixed, adaptive):
        c.submit(*(jv(f"j{k}", 1, 2, order=k) for k in range(6)))
    assert fixed.step(0.0).admitted == ("j0",) and len(fixed.free) == 6
    d = adaptive.step(0.0)
    assert d.admitted == ("j0", "j1", "j2", "j3") and not adaptive.free  # 4 x 2 nodes absorb all 8
    assert d.waiting == {"j4": "all 1 slots are taken (max_running)", "j5": "all 1 slots are taken (max_running)"}
    capped = Cluster(Policy(PolicyConfig(max_running=1, profiling="never", admission_cap=2)), names("n", 8))
    capped.submit(*(jv(f"j{k}", 1, 2, order=k) for k in range(6)))
    assert capped.step(0.0).admitted == ("j0", "j1")


def test_when_nodes_go_the_newest_extra_job_is_suspended_and_resumed_first_when_they_return():
    c = Cluster(Policy(PolicyConfig(max_running=1, profiling="never")), names("n", 6))
    c.submit(*(jv(f"j{k}", 1, 2, order=k) for k in range(4)))
    assert c.step(0.0).admitted == ("j0", "j1", "j2")
    for node in c.on["j1"][:1] + c.on["j0"][:1]:  # two nodes go: j0 and j1 alone can absorb the rest
        c.recall(node, 5.0)
    d = c.step(5.0)
    assert kinds(d, "j2") == ["suspended"]  # the newest beyond Pjmax gives way
    assert c.count("j0") == c.count("j1") == 2
    assert "j2" not in d.admitted and c.count("j2") == 0
    assert c.policy.state.queue_front[0] == "j2"  # progress kept, at the front of the queue
    c.give("m0", "m1")
    d = c.step(10.0)
    assert d.admitted[-1] == "j2" and c.count("j2") == 2  # resumed before j3
    assert "j3" in d.waiting


# ------------------------------------------------------------------ node valuation


def test_the_fragment_model_conditions_on_how_long_a_node_has_been_idle():
    m = FragmentModel([10.0, 20.0, 1000.0])
    assert m.expected_remaining(0.0) == pytest.approx((10 + 20 + 1000) / 3)
    assert m.expected_remaining(50.0) == pytest.approx(950.0)  # only the long fragment outlived 50 s
    assert m.expected_remaining(2000.0) is None
    many = FragmentModel([60.0] * MIN_FRAGMENTS)
    h = learned_horizon(["a"], 100.0, {"a": 100.0}, {}, many, 30.0, 1800.0, 120.0)
    assert 48.0 <= h <= 75.0  # ~60 s, on the rounding grid
    assert learned_horizon(["a"], 100.0, {}, {"a": 105.0}, many, 1.0, 1800.0, 120.0) < 10.0  # known recall
    assert learned_horizon(["a"], 100.0, {}, {}, FragmentModel([]), 30.0, 1800.0, 120.0) == 120.0  # too few


def test_a_node_recalled_soon_is_not_worth_a_rescale_pause():
    def run(horizon: str, recall_at: dict[str, float]) -> int:
        pol = Policy(PolicyConfig(profiling="never", horizon=horizon, horizon_min_s=1.0,
                                  default_up_cost_s=10.0))
        job = jv("a", 1, 4, ["n0", "n1"], scaling=linear(10.0, 4))
        pol.decide(View(0.0, (), (job,)), {})
        d = pol.decide(View(1.0, ("f0", "f1"), (job,), recall_at=recall_at), {})
        return len(d.nodes_of("a"))

    soon = {"f0": 6.0, "f1": 6.0}
    assert run("tfwd", soon) == 4  # the fixed horizon grows it
    assert run("learned", soon) == 2  # the nodes leave in 5 s: the 10 s pause does not pay
    assert run("learned", {}) == 4  # nothing known: the learned horizon falls back to tfwd


def test_the_policy_learns_fragment_lengths_from_the_view():
    pol = Policy(PolicyConfig(horizon="learned"))
    pol.decide(View(0.0, ("f0",), (), ended_fragments=(30.0, 40.0)), {})
    assert pol.state.fragments == [30.0, 40.0] and len(pol.fragment_model()) == 2


# ------------------------------------------------------------------ budgets and deadlines


def test_a_job_over_its_budget_is_stopped_and_never_admitted_again():
    pol = Policy(PolicyConfig(profiling="never"))
    job = JobView("a", 1, 4, ("n0", "n1"), budget_node_hours=1.0, used_node_hours=1.0)
    d = pol.decide(View(0.0, ("n2",), (job,)), {})
    assert d.stop == {"a": Stop(StopReason.OVER_BUDGET, 1.0, 1.0)} and "a" not in d.admitted
    assert "over_budget" in kinds(d, "a") and d.waiting["a"] == "over its budget_node_hours"
    d = pol.decide(View(1.0, ("n0", "n1", "n2"), (replace(job, nodes=()),)), {})
    assert d.admitted == () and d.stop == {"a": Stop(StopReason.OVER_BUDGET, 1.0, 1.0)}
    assert d.stop["a"].describe() == "over budget: used 1 of 1 node-hours"


def test_a_job_still_training_at_its_deadline_is_stopped_with_a_typed_reason():
    pol = Policy(PolicyConfig(profiling="never"))
    late = JobView("a", 1, 4, order=0, scaling=linear(10.0, 4), work_left=1e6, deadline=100.0)
    queued = JobView("q", 1, 4, order=1, scaling=linear(10.0, 4), work_left=1e6, deadline=150.0)
    other = JobView("b", 1, 4, order=2, scaling=linear(10.0, 4))
    d = pol.decide(View(40.0, names("n", 4), (late, queued, other)), {})
    assert d.stop == {} and d.wake_at == 100.0  # decide again when the first deadline comes
    assert "a" in d.admitted and d.nodes_of("a")
    running = replace(late, nodes=d.nodes_of("a"))
    free = tuple(n for n in names("n", 4) if n not in running.nodes)
    d = pol.decide(View(100.0, free, (running, queued, other)), {})
    assert d.stop == {"a": Stop(StopReason.PAST_DEADLINE, 100.0, 100.0)}
    assert "a" not in d.admitted and not d.nodes_of("a") and "past_deadline" in kinds(d, "a")
    assert d.waiting["a"] == "past its deadline"
    assert set(running.nodes) <= {n for nodes in d.assignment.values() for n in nodes}  # its nodes go on
    assert d.wake_at == 150.0
    done = replace(queued, work_left=0.0)  # trained all it had to: finishing, not stopped
    d = pol.decide(View(160.0, names("n", 4), (done, other)), {})
    assert d.stop == {}
    assert Stop(StopReason.PAST_DEADLINE, 112.5, 100.0).describe() == \
        "past its deadline: not done by it (stopped 12.5 s after it)"


def test_a_budget_caps_the_count_and_asks_to_decide_again_before_it_runs_out():
    pol = Policy(PolicyConfig(profiling="never", tfwd_s=120.0))
    # 0.1 node-hours left = 360 node-seconds: over a 120 s horizon at most 3 nodes
    job = JobView("a", 1, 8, (), budget_node_hours=1.0, used_node_hours=0.9, scaling=linear(10.0, 8))
    d = pol.decide(View(0.0, names("n", 8), (job,)), {})
    n = len(d.nodes_of("a"))
    assert 1 <= n <= 3
    assert d.wake_at == pytest.approx(360.0 / n)


def test_a_job_whose_deadline_can_still_be_met_is_favoured():
    def counts(deadline: float | None) -> dict[str, int]:
        pol = Policy(PolicyConfig(profiling="never"))
        a = JobView("a", 1, 4, order=0, scaling={1: 10.0, 2: 20.0, 4: 40.0})
        b = JobView("b", 1, 4, order=1, scaling={1: 11.0, 2: 22.0, 4: 44.0}, work_left=4000.0, deadline=deadline)
        d = pol.decide(View(0.0, names("n", 4), (a, b)), {})
        return {k: len(v) for k, v in d.assignment.items()}

    assert counts(None) == {"a": 4, "b": 0}  # alike in work per node: the older job wins the tie
    # b needs 4000 samples by t = 150: at 44/s (4 nodes) it makes it, at 22/s (2 nodes) not
    assert counts(150.0)["b"] == 4
    # a deadline that cannot be met even at the max is not favoured over the other job
    slow = Policy(PolicyConfig(profiling="never"))
    a = JobView("a", 1, 4, order=0, scaling={1: 20.0, 2: 40.0, 4: 80.0})
    b = JobView("b", 1, 4, order=1, scaling={1: 10.0, 2: 20.0, 4: 40.0}, work_left=1e9, deadline=10.0)
    assert slow._deadline_weights([a, b], 0.0) == {}  # 1e9 samples by t = 10 is out of reach
    d = slow.decide(View(0.0, names("n", 4), (a, b)), {})
    assert len(d.nodes_of("a")) == 4


# ------------------------------------------------------------------ objective


def test_the_work_objective_counts_jobs_in_one_node_equivalents():
    def counts(objective: str) -> dict[str, int]:
        # the rates measured (a declared curve's level counts for nothing under samples: test_claims.py)
        measured = {"a": {1: 100.0, 2: 150.0, 4: 200.0},  # many cheap samples, scales badly
                    "b": {1: 10.0, 2: 20.0, 4: 40.0}}  # few costly samples, scales well
        pol = Policy(PolicyConfig(profiling="never", objective=objective), PolicyState(measured=measured))
        a, b = JobView("a", 1, 4, order=0), JobView("b", 1, 4, order=1)
        d = pol.decide(View(0.0, names("n", 4), (a, b)), {})
        return {k: len(v) for k, v in d.assignment.items()}

    assert counts("samples")["a"] == 4  # raw samples/s: the cheap job takes every node
    assert counts("work")["b"] >= 3  # work: the job that scales gets the nodes
    assert Policy(PolicyConfig()).believed_curve(JobView("b", 1, 4, scaling={1: 10.0, 4: 40.0}))[4] == 40.0


def test_a_job_past_its_knee_absorbs_only_the_nodes_it_puts_to_use():
    flat = {1: 10.0, 2: 20.0, 4: 22.0, 8: 23.0}  # gains little past 2 nodes
    def admitted(scaling: dict[int, float]) -> tuple[str, ...]:
        c = Cluster(Policy(PolicyConfig(max_running=1, profiling="never")), names("n", 8))
        c.submit(*(jv(f"j{k}", 1, 8, order=k, scaling=scaling) for k in range(6)))
        return c.step(0.0).admitted

    assert Policy().absorbs(jv("x", 1, 8, scaling=flat)) == 2
    assert admitted(linear(10.0, 8)) == ("j0",)  # one linear job absorbs all 8 nodes
    assert admitted(flat) == ("j0", "j1", "j2", "j3")  # four jobs at their knee use them better


def test_admission_knee_sets_how_far_a_job_is_counted_to_absorb_nodes():
    bends = {1: 10.0, 2: 20.0, 4: 34.0, 8: 50.0}  # per further node: 10, then 7, then 4
    x = jv("x", 1, 8, scaling=bends)
    assert Policy(PolicyConfig(admission_knee=0.0)).absorbs(x) == 8  # no knee: its max
    assert Policy(PolicyConfig(admission_knee=0.3)).absorbs(x) == 8  # 4/node >= 3: still worth it
    assert Policy(PolicyConfig(admission_knee=0.5)).absorbs(x) == 4  # 4/node < 5: past the knee at 4
    assert Policy(PolicyConfig(admission_knee=0.75)).absorbs(x) == 2  # 7/node < 7.5: past it at 2
    assert PolicyConfig().admission_knee == 0.75
    for bad in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(PolicyConfigError, match="policy.admission_knee"):
            PolicyConfig(admission_knee=bad)


def test_past_its_largest_measured_count_a_job_gains_no_more_than_its_measured_trend():
    pol = Policy(PolicyConfig(profiling="never"))
    job = jv("x", 1, 8, scaling={1: 10.0, 8: 80.0})  # the user says linear
    pol.state.measured["x"] = {2: 20.0, 4: 24.0}  # it measured 2 samples/s per node from 2 to 4
    curve = pol.believed_curve(job)
    assert curve[2] == 20.0 and curve[4] == 24.0
    assert curve[8] <= 24.0 + 2.0 * 4 * math.log(8 / 4) + 1e-9  # not the prior's 80: the slope decays past 4
    pol.state.measured["x"] = {2: 20.0, 4: 16.0}  # past its peak: fewer samples/s at 4 than at 2
    assert pol.believed_curve(job)[8] <= 16.0  # growing it further is not believed to help
    one = Policy(PolicyConfig(profiling="never"))
    one.state.measured["x"] = {4: 24.0}  # one count: no trend, the calibrated prior stands
    assert one.believed_curve(job)[8] > 24.0
