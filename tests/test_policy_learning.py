"""Learning that corrects any prior: a measured rate corrects the belief around it (efficiency does not
rise with nodes; the shape two measured counts give), and the profiling advisor probes a running
job whose shape nothing verified, in inverse order, where the expected gain pays for it."""

from __future__ import annotations

import pytest

from curves import throughput_at
from policy import Policy, PolicyConfig
from policy.beliefs import corrected_prior
from policy.model import EventKind, JobView
from tests.test_policy import Cluster, est, evidence, jv, names

LINEAR = {1: 10.0, 16: 160.0}  # what a user without data gives: 10 samples/s per node, all the way


def test_a_rate_below_a_linear_belief_caps_the_counts_above_it():
    # measured at 8 nodes at half the line: above 8 no more per node than there (not the line's 16/node x n)
    curve = corrected_prior(LINEAR, {8: 40.0})
    assert curve[8] == 40.0
    assert curve[16] <= 40.0 / 8 * 16 + 1e-9
    # a job measured at 1 and 8 nodes has the shape those give: at 4 between them, not the line
    two = corrected_prior(LINEAR, {1: 10.0, 8: 40.0})
    assert two[1] == 10.0 and two[8] == 40.0
    assert 40.0 * 4 / 8 <= two[4] < 10.0 * 4  # efficiency between the two measured, below the line
    assert two[16] <= 40.0 * 2 + 1e-9


def test_the_believed_curve_of_a_job_follows_the_correction():
    pol = Policy(PolicyConfig(prior=tuple(LINEAR.items()), profiling="never"))
    job = jv("x", 1, 16)
    pol.state.measured["x"] = {1: 10.0, 8: 40.0}
    curve = pol.believed_curve(job)
    assert curve[16] <= 80.0 + 1e-9 and curve[4] < 40.0
    # the drop from one node to two (the first inter-node allreduce, 20-70% of a node's rate on the Pollux
    # models) is not a trend: past 2 nodes the belief is the prior corrected at 2, not a rate falling to zero
    pol.state.measured["x"] = {1: 10.0, 2: 6.0}
    curve = pol.believed_curve(job)
    assert curve[16] == pytest.approx(6.0 / 2 * 16)
    assert pol.beliefs.curves(job)[1][16] == pytest.approx(4.8)  # work: 4.8 one-node equivalents on 16 nodes


def _probing(nodes: int) -> Cluster:
    return Cluster(Policy(PolicyConfig(prior=tuple(LINEAR.items()), max_running=10)), names("n", nodes))


def test_a_running_job_measured_only_above_its_min_is_probed_down_to_it_when_it_pays():
    c = _probing(6)
    c.submit(JobView("a", 1, 16, order=0, work_left=1e9), JobView("b", 1, 16, order=1, work_left=1e9))
    c.step(0.0)
    a, b = c.count("a"), c.count("b")
    assert a + b == 6 and a > 1
    # both measured at the counts they run at, half the line: the shape is unverified
    ev = {"a": evidence(est(a, 5.0 * a)), "b": evidence(est(b, 5.0 * b))}
    d = c.step(60.0, ev)
    starts = [e for e in d.events if e.kind is EventKind.PROFILE_START]
    assert starts and all(e.detail["counts"][-1] == 1 and e.detail["lender"] is None for e in starts)
    job = starts[0].job
    assert d.profiling[job] == c.jobs[job].min_nodes or d.profiling[job] == (a if job == "a" else b)
    # inverse order: it steps down (never up) to its min, then its 1-node rate enters its curve
    ev[job] = evidence(est(c.count(job), 5.0 * c.count(job)), est(1, 10.0))
    for t in (120.0, 180.0, 700.0):
        c.step(t, ev)
    assert 1 in c.policy.state.measured[job]
    assert job in c.policy.state.profiled and not c.policy.state.profiles


def test_a_probe_a_recall_cuts_short_before_it_measured_its_min_is_tried_once_more():
    """A probe on the job's own and free nodes that a recall ends before it measured the count it went for
    leaves the job unverified: the first is not marked profiled, and the job is probed once more where it
    pays (else a job believed linear keeps that belief, and the nodes it wins as the oldest, for good)."""
    c = _probing(6)
    c.submit(JobView("a", 1, 16, order=0, work_left=1e9), JobView("b", 1, 16, order=1, work_left=1e9))
    c.step(0.0)
    ev = {j: evidence(est(c.count(j), 5.0 * c.count(j))) for j in ("a", "b")}
    d = c.step(60.0, ev)
    (first, *_) = [e.job for e in d.events if e.kind is EventKind.PROFILE_START]
    c.recall(sorted(c.on[first])[0], 62.0)  # a recall takes one of its nodes before its 1-node step
    d = c.step(62.0, ev)
    assert [e.detail["reason"] for e in d.events if e.kind is EventKind.PROFILE_ABORTED and e.job == first] == [
        "lost nodes during the profile"]
    assert first not in c.policy.state.profiled and 1 not in c.policy.state.measured.get(first, {})
    ev = {j: evidence(est(c.count(j), 5.0 * c.count(j))) for j in ("a", "b")}
    d = c.step(120.0, ev)
    assert first in [e.job for e in d.events if e.kind is EventKind.PROFILE_START]  # probed again
    c.recall(sorted(c.on[first])[0], 122.0)  # ... and cut short again: that one counts (once more only)
    c.step(122.0, ev)
    assert first in c.policy.state.profiled and first not in c.policy.state.profiles
    from policy.state import PolicyState
    assert PolicyState.from_json(c.policy.state.to_json()).cut_short == {first}  # kept across a restart


def test_a_probe_only_where_it_pays():
    # a short job: the gain over its remaining time is below the cost of the pauses and the step
    c = _probing(6)
    c.submit(JobView("a", 1, 16, order=0, work_left=30.0), JobView("b", 1, 16, order=1, work_left=30.0))
    c.step(0.0)
    ev = {j: evidence(est(c.count(j), 5.0 * c.count(j))) for j in ("a", "b")}
    assert not c.step(60.0, ev).profiling
    # nodes not scarce (every job gets its max, or its believed peak): no probe to the min; only below the
    # count each holds, where its curve may peak
    plenty = Cluster(Policy(PolicyConfig(prior=tuple(LINEAR.items()))), names("n", 40))
    plenty.submit(JobView("a", 1, 16, order=0, work_left=1e9), JobView("b", 1, 16, order=1, work_left=1e9))
    plenty.step(0.0)
    ev = {j: evidence(est(plenty.count(j), 5.0 * plenty.count(j))) for j in ("a", "b")}
    starts = [e for e in plenty.step(60.0, ev).events if e.kind is EventKind.PROFILE_START]
    assert [e.detail["counts"] for e in starts] == [[16, 12, 8], [16, 12, 8]]
    # profiling off: never
    off = Cluster(Policy(PolicyConfig(prior=tuple(LINEAR.items()), profiling="never")), names("n", 6))
    off.submit(JobView("a", 1, 16, order=0, work_left=1e9), JobView("b", 1, 16, order=1, work_left=1e9))
    off.step(0.0)
    ev = {j: evidence(est(off.count(j), 5.0 * off.count(j))) for j in ("a", "b")}
    assert not off.step(60.0, ev).profiling
    # the same two jobs, long, scarce nodes, profiling gated: it pays
    long = _probing(6)
    long.submit(JobView("a", 1, 16, order=0, work_left=1e9), JobView("b", 1, 16, order=1, work_left=1e9))
    long.step(0.0)
    ev = {j: evidence(est(long.count(j), 5.0 * long.count(j))) for j in ("a", "b")}
    assert long.step(60.0, ev).profiling


def test_a_job_at_its_min_is_probed_up_on_free_nodes_only():
    sublinear = ((1, 10.0), (2, 12.0), (4, 16.0), (16, 30.0))  # the population's mean: one node is best
    c = Cluster(Policy(PolicyConfig(prior=sublinear, max_running=10)), names("n", 3))
    c.submit(*(JobView(j, 1, 16, order=k, work_left=1e9) for k, j in enumerate("abc")))
    c.step(0.0)
    assert [c.count(j) for j in "abc"] == [1, 1, 1]
    ev = {j: evidence(est(1, 10.0)) for j in "abc"}
    assert not c.step(60.0, ev).profiling  # no free node: no probe (never a lender)
    c.give("f0", "f1", "f2")
    d = c.step(120.0, ev)
    (start,) = [e for e in d.events if e.kind is EventKind.PROFILE_START]
    assert start.detail["counts"] == [4, 1] and start.detail["lender"] is None
    assert d.profiling == {start.job: 4} and c.count(start.job) == 4  # one scale-up on the free nodes
    # then down to its min again: its 4-node rate enters its curve, a shape measured at two counts
    ev[start.job] = evidence(est(4, 30.0), est(1, 10.0))
    for t in (180.0, 240.0):
        c.step(t, ev)
    assert set(c.policy.state.measured[start.job]) == {1, 4}
    assert c.count(start.job) <= 4 and not c.policy.state.profiles


def test_the_prior_spread_is_worked_out_once_per_set_of_shapes_and_again_when_they_change():
    from policy.beliefs import efficiency_spread

    pol = Policy(PolicyConfig())
    shapes = [{1: 1.0, 4: e, 16: e / 2} for e in (0.9, 0.6, 0.3)]
    pol.state.shapes.extend(dict(s) for s in shapes)
    first = pol.beliefs.spread()
    assert first.at(4) == pytest.approx((0.6 - 0.3) / 0.6) == efficiency_spread(shapes, 4)  # p90 - p10 of 3
    assert first.at(32) is None  # no shape reaches 32 nodes: the prior's own distance from linear is used
    assert pol.beliefs.spread() is first  # the same shapes: the same figures, not worked out again
    pol.state.shapes.append({1: 1.0, 4: 0.95, 16: 0.9})  # a job finished: the figures follow its shape
    assert pol.beliefs.spread().at(4) == pytest.approx(efficiency_spread(pol.state.shapes, 4))
    assert pol.beliefs.spread().at(4) != first.at(4)


def test_a_job_given_its_max_while_nodes_are_plentiful_is_probed_below_it_and_held_at_its_peak():
    # a linear belief grows the job to its max, 16; its curve peaks at 12 (falls past it, as cifar10's does
    # on some batch sizes): only a probe below the count it holds can show that
    c = Cluster(Policy(PolicyConfig(prior=tuple(LINEAR.items()), max_running=10)), names("n", 40))
    c.submit(JobView("a", 1, 16, order=0, work_left=1e9))
    c.step(0.0)
    assert c.count("a") == 16
    true = {16: 80.0, 12: 100.0, 8: 70.0}
    d = c.step(60.0, {"a": evidence(est(16, true[16]))})
    (start,) = [e for e in d.events if e.kind is EventKind.PROFILE_START]
    assert start.job == "a" and start.detail["counts"] == [16, 12, 8] and start.detail["lender"] is None
    ev = {"a": evidence(*(est(n, r) for n, r in true.items()))}
    for t in (120.0, 180.0, 240.0, 300.0):
        c.step(t, ev)
    assert not c.policy.state.profiles and set(c.policy.state.measured["a"]) == {8, 12, 16}
    assert c.count("a") == 12  # faster with fewer: held at its peak, not grown back to its max
    assert c.policy.believed_curve(JobView("a", 1, 16))[12] > c.policy.believed_curve(JobView("a", 1, 16))[16]


def test_a_job_alone_held_below_its_max_for_lack_of_nodes_is_not_probed_below():
    # a job alone is never "scarce", but held at 12 of its 16 because only 12 nodes are there, fewer
    # cannot be what it wants: a probe below would only take the nodes it has (the daemon saw a
    # recall followed at once by a probe down to half the job)
    c = Cluster(Policy(PolicyConfig(prior=tuple(LINEAR.items()), max_running=10)), names("n", 12))
    c.submit(JobView("a", 1, 16, order=0, work_left=1e9))
    c.step(0.0)
    assert c.count("a") == 12
    d = c.step(60.0, {"a": evidence(est(12, 120.0))})
    assert not [e for e in d.events if e.kind is EventKind.PROFILE_START] and c.count("a") == 12


def test_a_probe_below_only_where_nothing_measured_just_below_and_it_pays():
    c = Cluster(Policy(PolicyConfig(prior=tuple(LINEAR.items()), max_running=10)), names("n", 40))
    c.submit(JobView("a", 1, 16, order=0, work_left=1e9))
    c.step(0.0)
    c.policy.state.measured["a"] = {13: 130.0}  # measured between three quarters of its count and it
    assert not c.step(60.0, {"a": evidence(est(16, 160.0))}).profiling
    short = Cluster(Policy(PolicyConfig(prior=tuple(LINEAR.items()), max_running=10)), names("n", 40))
    short.submit(JobView("a", 1, 16, order=0, work_left=100.0))  # a few seconds left: not worth the pauses
    short.step(0.0)
    assert not short.step(60.0, {"a": evidence(est(16, 160.0))}).profiling


POLLUX_MEAN = {1: 10.0, 2: 9.2, 4: 22.1, 8: 35.0, 16: 60.0}  # about the six Pollux models' mean, 1-node rate 10


def test_a_rate_measured_at_the_first_inter_node_count_caps_nothing_above_it():
    # measured at one node and two, 25% down at two (the first inter-node allreduce): past two nodes the
    # belief is the prior corrected at two (ncf on the Pollux curves: 1.7x its 1-node rate at 4 nodes),
    # not two nodes' per-node rate (1.5x at 4), which kept such jobs at one node for good
    curve = corrected_prior(POLLUX_MEAN, {1: 10.0, 2: 7.5})
    assert curve[2] == 7.5
    assert curve[4] == pytest.approx(22.1 * 7.5 / 9.2) and curve[4] > 7.5 / 2 * 4
    # a rate measured at any other count still bounds the per-node rate above it
    assert corrected_prior(POLLUX_MEAN, {1: 10.0, 4: 12.0})[8] <= 12.0 / 4 * 8 + 1e-9


def test_a_job_at_one_node_is_not_probed_up_to_two_alone():
    sublinear = ((1, 10.0), (2, 9.0), (4, 16.0), (16, 30.0))  # the Pollux models' drop at two nodes
    c = Cluster(Policy(PolicyConfig(prior=sublinear, max_running=10)), names("n", 3))
    c.submit(*(JobView(j, 1, 16, order=k, work_left=1e9) for k, j in enumerate("abc")))
    c.step(0.0)
    ev = {j: evidence(est(1, 10.0)) for j in "abc"}
    c.step(60.0, ev)
    c.give("f0")  # one free node: a probe could only go from one node to two, where the drop is, and stop
    assert not c.step(120.0, ev).profiling
    c.give("f1")  # two: up to three, past the drop
    (start,) = [e for e in c.step(180.0, ev).events if e.kind is EventKind.PROFILE_START]
    assert start.detail["counts"] == [3, 1]


def test_a_job_measured_at_one_count_borrows_the_shape_of_the_live_job_at_the_same_rate_there():
    # two jobs at one node under the Pollux mean: "b" was measured at 1 and 12 nodes (8.4x, an imagenet),
    # "c" at 1 node only. "c" runs at b's rate (within 2.5%): it is believed b's shape at its own level,
    # not the mean's 2-node drop and 4.5x at 12 that put every unmeasured job alike
    pol = Policy(PolicyConfig(prior=tuple(POLLUX_MEAN.items()), profiling="never"))
    pol.state.measured["b"] = {1: 10.0, 12: 84.0}
    pol.state.measured["c"] = {1: 10.1}
    pop = pol.beliefs.population()
    curve = pol.believed_curve(jv("c", 1, 16), pop)
    assert curve[1] == pytest.approx(10.1) and throughput_at(curve, 12) == pytest.approx(84.0 * 1.01)
    # a job at a rate unlike any measured at two counts keeps the prior corrected by its own point
    pol.state.measured["d"] = {1: 12.0}
    pop = pol.beliefs.population()
    assert pol.believed_curve(jv("d", 1, 16), pop) == pytest.approx(corrected_prior(POLLUX_MEAN, {1: 12.0}))
    # nor does a job with a curve of its own (the user's shape says more than a rate alike), nor a policy
    # that does not learn (the FreeTrain baseline)
    own = jv("c", 1, 16, scaling={1: 10.0, 16: 40.0})
    assert throughput_at(pol.believed_curve(own, pop), 12) < 84.0
    frozen = Policy(PolicyConfig(prior=tuple(POLLUX_MEAN.items()), profiling="never", learn=False))
    frozen.state.measured.update(b={1: 10.0, 12: 84.0}, c={1: 10.1})
    assert throughput_at(frozen.believed_curve(jv("c", 1, 16), frozen.beliefs.population()), 12) < 60.0
