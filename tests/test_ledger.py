"""The policy's ledger: what a driver observed, fed with events, and the View it builds."""

from __future__ import annotations

import math
from dataclasses import fields, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy import EventKind, JobView, Ledger, LedgerError, Policy, PolicyConfig, PolicyInputError, below_min, interrupts
from policy import Loss, LossOutcome
from policy.round import check_view


def job(job_id: str, lo: int = 1, hi: int = 4, order: int = 0) -> JobView:
    return JobView(job_id, lo, hi, order=order, scaling={1: 10.0, 2: 19.0, 4: 36.0}, work_left=1e6)


def ledger_with(nodes: str, *jobs: JobView, at: float = 0.0) -> Ledger:
    led = Ledger()
    led.usable(list(nodes), at)
    for j in jobs:
        led.submitted(j)
    return led


# ------------------------------------------------------------------ the two rules


def test_below_min_is_fewer_nodes_than_the_min():
    assert below_min(0, 1) and below_min(1, 2)
    assert not below_min(2, 2) and not below_min(3, 2)


def test_an_interruption_is_a_change_of_the_node_set_not_of_its_order():
    assert interrupts((), ("a",))  # a start
    assert interrupts(("a", "b"), ("a",))  # a shrink (or a recall)
    assert interrupts(("a",), ())  # a stop
    assert interrupts(("a", "b"), ("a", "c"))  # a swap
    assert not interrupts(("a", "b"), ("b", "a"))
    assert not interrupts((), ())


# ------------------------------------------------------------------ nodes


def test_usable_nodes_are_free_in_the_order_they_came_with_their_idle_since():
    led = ledger_with("", job("j", hi=4))  # a job that could take them all (a view shows what jobs can take)
    led.usable(["c", "a"], 5.0)
    led.usable(["b", "a"], 9.0)  # a is free already: it keeps its time and its place
    assert led.free_nodes() == ("c", "a", "b")
    view = led.view(10.0)
    assert view.free_nodes == ("c", "a", "b") and view.n_free == 3
    assert view.idle_since == {"c": 5.0, "a": 5.0, "b": 9.0}


def test_ours_lists_every_node_ours_and_live_jobs_every_job_not_ended():
    led = ledger_with("ab", job("j1"), job("j2", order=1))
    led.idle(["c"], 1.0)  # a pilot starting: ours, not usable
    assert led.ours() == ("a", "b", "c") and led.live_jobs() == ("j1", "j2")
    led.lost(["a"], 2.0)
    led.ended("j1")
    assert led.ours() == ("b", "c") and led.live_jobs() == ("j2",)


def test_a_node_whose_pilot_starts_is_ours_but_not_usable_until_it_runs():
    led = ledger_with("", job("j", hi=4))
    assert led.idle(["a", "b"], 3.0) == ("a", "b")
    assert led.idle(["a"], 4.0) == ()  # already ours: its fragment goes on
    assert led.n_idle == 2 and led.n_usable == 0 and led.view(4.0).free_nodes == ()
    assert led.usable(["a"], 8.0) == 1
    assert led.view(8.0).idle_since == {"a": 3.0}  # idle since the pilot was submitted
    led.lost(["b"], 9.0)  # recalled before its pilot ran: a fragment of 6 s, no job touched
    assert led.view(9.0).ended_fragments == (6.0,) and led.n_idle == 1


def test_lost_nodes_end_fragments_that_a_delivered_view_hands_over_once():
    led = ledger_with("abc", job("j"), at=10.0)
    led.lost(["a", "zz"], 25.0)  # zz was never ours
    view = led.view(25.0)
    assert view.ended_fragments == (15.0,) and view.free_nodes == ("b", "c")
    led.lost(["b"], 30.0)  # ended after the view was made: not delivered with it
    led.delivered(view)
    assert led.view(31.0).ended_fragments == (20.0,)


def test_fragments_not_delivered_are_bounded_to_what_the_policy_learns_from():
    from policy.state import FRAGMENTS_KEEP

    led = Ledger()
    for i in range(FRAGMENTS_KEEP + 10):  # a node comes and goes while no decision is made
        led.usable(["a"], float(i))
        led.lost(["a"], i + 0.5)
    frags = led.view(1e6).ended_fragments
    assert len(frags) == FRAGMENTS_KEEP and set(frags) == {0.5}


# ------------------------------------------------------------------ jobs


def test_placing_a_job_takes_free_nodes_and_interrupts_it_only_when_its_set_changes():
    led = ledger_with("abcd", job("j"))
    assert led.placed("j", ("b", "a"), 5.0)
    assert led.nodes_of("j") == ("b", "a") and led.job("j").nodes == ("a", "b")  # sorted for the policy
    assert led.job("j").last_interrupted == 5.0 and led.holder("a") == "j"
    assert led.free_nodes() == ("c", "d")
    assert not led.placed("j", ("a", "b"), 7.0)  # the same nodes: no change, no interruption
    assert led.job("j").last_interrupted == 5.0 and led.nodes_of("j") == ("b", "a")
    assert led.placed("j", ("a",), 9.0)  # gives b back
    assert led.free_nodes() == ("c", "d", "b") and led.job("j").last_interrupted == 9.0


def test_a_shrinking_job_gives_its_nodes_back_in_its_own_order():
    led = ledger_with("abcdef", job("j", hi=6))
    led.placed("j", ("e", "a", "c", "f"), 1.0)
    led.placed("j", ("c",), 2.0)
    assert led.free_nodes() == ("b", "d", "e", "a", "f")


def test_placing_a_node_another_job_holds_or_that_is_not_ours_is_refused_and_changes_nothing():
    led = ledger_with("abc", job("j", order=0), job("k", order=1))
    led.placed("j", ("a",), 1.0)
    with pytest.raises(LedgerError, match=r"job k given node 'a', held by job j"):
        led.placed("k", ("b", "a"), 2.0)
    with pytest.raises(LedgerError, match=r"job k given node 'x', not a usable node of ours"):
        led.placed("k", ("x",), 2.0)
    with pytest.raises(LedgerError, match="twice"):
        led.placed("k", ("b", "b"), 2.0)
    with pytest.raises(LedgerError, match="job j is given 5 nodes, more than its max 4"):
        led.usable(["d", "e", "f", "g"], 2.0)
        led.placed("j", ("a", "b", "c", "d", "e"), 2.0)
    led.lost(["d", "e", "f", "g"], 2.0)
    with pytest.raises(LedgerError, match="job nope"):
        led.placed("nope", ("b",), 2.0)
    assert led.free_nodes() == ("b", "c") and led.nodes_of("k") == () and led.job("k").last_interrupted is None


def test_a_recall_shrinks_a_job_and_stops_one_it_takes_below_its_min():
    led = ledger_with("abcdef", job("big", lo=2, hi=4, order=0), job("small", lo=1, hi=2, order=1))
    led.placed("big", ("a", "b", "c"), 1.0)
    led.placed("small", ("d", "e"), 1.0)
    losses = led.lost(["d", "b"], 50.0)
    assert [(x.job, x.lost, x.stopped) for x in losses] == [("small", ("d",), False), ("big", ("b",), False)]
    assert led.nodes_of("big") == ("a", "c") and led.job("big").last_interrupted == 50.0
    (loss,) = led.lost(["a"], 60.0)
    assert loss == Loss("big", ("a",), LossOutcome.SUSPENDED, left=1, min_nodes=2)  # 1 node < its min 2
    assert led.nodes_of("big") == () and led.job("big").nodes == () and led.holder("c") is None
    assert led.free_nodes() == ("f", "c")  # its last node is free again
    assert led.job("big").last_interrupted == 60.0


def test_the_loss_says_what_a_recall_does_to_the_job_so_no_driver_works_it_out():
    """The consequence of a lost node is decided once, in the ledger: shrunk at or above the job's
    min, suspended below it (with the figures a driver words its reason with), unchanged if the job
    lost nothing; drivers carry the outcome out."""
    led = ledger_with("abcdef", job("big", lo=2, hi=4, order=0), job("small", lo=1, hi=2, order=1))
    led.placed("big", ("a", "b", "c"), 1.0)
    led.placed("small", ("d", "e"), 1.0)
    shrunk, suspended = led.lost(["d", "b", "c"], 50.0)
    assert (shrunk.job, shrunk.outcome, shrunk.left, shrunk.min_nodes) == ("small", LossOutcome.SHRUNK, 1, 1)
    assert (suspended.job, suspended.outcome, suspended.left, suspended.min_nodes) == \
        ("big", LossOutcome.SUSPENDED, 1, 2)
    assert suspended.stopped and not shrunk.stopped
    assert suspended.describe() == "below min_nodes: 1 node(s) left of the 2 it needs after losing 2"
    assert led.released("small", ["zz"], 60.0).outcome is LossOutcome.UNCHANGED  # not its node: nothing lost
    assert led.released("big", [], 60.0).outcome is LossOutcome.SUSPENDED  # on no node: below its min


def test_a_job_that_gives_up_a_node_keeps_it_ours_and_free_and_stops_below_its_min():
    led = ledger_with("abcd", job("big", lo=2, hi=4), job("q", lo=1, hi=1, order=1))
    led.placed("big", ("a", "b", "c"), 1.0)
    loss = led.released("big", ["b", "zz"], 5.0)  # its worker on b failed (zz: never its node)
    assert (loss.job, loss.lost, loss.stopped) == ("big", ("b",), False)
    assert led.nodes_of("big") == ("a", "c") and led.job("big").last_interrupted == 5.0
    assert led.idle_since("b") == 0.0 and led.free_nodes() == ("d", "b")  # still ours, its fragment goes on
    assert led.view(6.0).ended_fragments == ()
    loss = led.released("big", ["c"], 7.0)  # 1 node < its min 2: stopped, a is free too
    assert (loss.lost, loss.stopped) == (("c",), True)
    assert led.nodes_of("big") == () and led.free_nodes() == ("d", "b", "c", "a")
    assert led.job("big").last_interrupted == 7.0
    assert led.released("big", [], 8.0).stopped  # on no node: stopped, and nothing changes
    assert led.job("big").last_interrupted == 7.0
    assert led.is_live("big") and not led.is_live("zz")


def test_every_field_of_a_job_is_carried():
    """The ledger makes each job's JobView again as its nodes and progress change: every field the
    job was submitted with survives (a field JobView gains must be carried too)."""
    spec = JobView("j", 2, 3, order=7, last_interrupted=1.0, scaling={2: 5.0}, profile=True, work_left=9.0,
                   budget_node_hours=4.0, used_node_hours=0.5, deadline=99.0, user="alice", group="sweep:s")
    for f in fields(JobView):
        assert getattr(spec, f.name) != f.default or f.name == "nodes", f"set {f.name} in this test"
    led = ledger_with("abc", spec)
    led.placed("j", ("b", "a"), 2.0)
    led.progressed("j", 8.0)
    led.used("j", 0.75)
    want = replace(spec, nodes=("a", "b"), last_interrupted=2.0, work_left=8.0, used_node_hours=0.75)
    assert led.job("j") == want and led.view(3.0).jobs == (want,)


def test_a_job_moved_and_progressed_between_two_views_is_made_once(monkeypatch):
    """A placement or a loss only marks the job moved: its JobView is made when it is next read, with
    its nodes and progress as they are then (the simulator moves and progresses running jobs between
    every two decisions)."""
    import policy.ledger as ledger_module

    made: list[str] = []

    class Counted(JobView):
        def __post_init__(self) -> None:
            made.append(self.id)
            super().__post_init__()

    led = ledger_with("abcd", job("j"))
    monkeypatch.setattr(ledger_module, "JobView", Counted)
    led.placed("j", ("c", "b", "a"), 2.0)
    led.lost(["b"], 3.0)
    led.progressed("j", 500.0)
    assert made == []
    (shown,) = led.view(4.0).jobs
    assert (shown.nodes, shown.last_interrupted, shown.work_left) == (("a", "c"), 3.0, 500.0)
    assert made == ["j"]
    led.view(5.0)
    assert made == ["j"]  # nothing moved since


def test_progress_budget_use_and_ending():
    led = ledger_with("ab", job("j"))
    led.placed("j", ("a", "b"), 0.0)
    led.progressed("j", 500.0)
    led.used("j", 1.5)
    view = led.view(10.0)
    assert view.jobs[0].work_left == 500.0 and view.jobs[0].used_node_hours == 1.5
    with pytest.raises(PolicyInputError, match="job j: work_left must be a finite number"):
        led.progressed("j", math.nan)  # refused at the event that brings it, not at the next view
    with pytest.raises(PolicyInputError, match="job j: used_node_hours must be a finite number"):
        led.used("j", -1.0)
    assert led.view(10.0).jobs[0].work_left == 500.0 and led.job("j").used_node_hours == 1.5
    led.ended("j")
    assert led.view(11.0).jobs == () and led.free_nodes() == ("a", "b") and led.holder("a") is None
    led.submitted(job("k"))
    with pytest.raises(LedgerError, match="submitted twice"):
        led.submitted(job("k"))
    with pytest.raises(LedgerError, match=r"job m is submitted on nodes \['b'\]"):
        led.submitted(JobView("m", 1, 2, nodes=("b",)))


def test_the_view_shows_the_jobs_asked_for_and_the_free_nodes_they_could_take():
    led = ledger_with("abcdefgh", job("j", hi=2, order=0), job("k", hi=3, order=1), job("q", hi=8, order=2))
    led.placed("j", ("a",), 0.0)
    view = led.view(1.0, ["k", "j"])  # room: 3 + 1
    assert [j.id for j in view.jobs] == ["k", "j"]
    assert view.free_nodes == ("b", "c", "d", "e") and view.n_free == 7 and view.free_count == 7
    assert set(view.idle_since) == set(view.free_nodes)
    assert [j.id for j in led.view(1.0).jobs] == ["j", "k", "q"]  # default: all, in submission order
    led.recall_expected({"a": 99.0, "b": 90.0, "zz": 5.0})
    assert led.view(1.0).recall_at == {"a": 99.0, "b": 90.0}  # usable nodes only


# ------------------------------------------------------------------ with the policy


def test_the_policy_takes_the_slot_of_a_job_a_recall_stopped_and_the_driver_carries_it_out():
    led = ledger_with("abc", job("j", lo=2, hi=3))
    pol = Policy(PolicyConfig(allocation="greedy", profiling="never", max_running=1))
    d = pol.decide(led.view(0.0), {})
    for job_id, nodes in d.assignment.items():
        led.placed(job_id, nodes, 0.0)
    assert led.count("j") == 3
    led.lost(["a", "b"], 10.0)
    view = led.view(10.0)
    assert view.jobs[0].nodes == () and view.free_nodes == ("c",)
    d = pol.decide(view, {})
    assert EventKind.PREEMPTED in [e.kind for e in d.events]


# ------------------------------------------------------------------ properties

NODES = [f"n{i}" for i in range(8)]
JOBS = {"j0": (1, 3), "j1": (2, 4), "j2": (3, 8)}

event = st.one_of(
    st.tuples(st.just("idle"), st.lists(st.sampled_from(NODES), max_size=4)),
    st.tuples(st.just("usable"), st.lists(st.sampled_from(NODES), max_size=4)),
    st.tuples(st.just("lost"), st.lists(st.sampled_from(NODES), max_size=4)),
    st.tuples(st.just("place"), st.sampled_from(sorted(JOBS)), st.integers(0, 8)),
    st.tuples(st.just("end"), st.sampled_from(sorted(JOBS))),
    st.tuples(st.just("release"), st.sampled_from(sorted(JOBS)), st.lists(st.sampled_from(NODES), max_size=3)),
    st.tuples(st.just("submit"), st.sampled_from(sorted(JOBS))),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(event, max_size=40))
def test_any_event_sequence_keeps_the_ledger_consistent(events):
    led = Ledger()
    fragments = 0
    t = 0.0
    for ev in events:
        t += 1.0
        kind = ev[0]
        if kind == "idle":
            led.idle(ev[1], t)
        elif kind == "usable":
            led.usable(ev[1], t)
        elif kind == "lost":
            ours = {n for n in ev[1] if led.idle_since(n) is not None}
            before = {j.id: led.count(j.id) for j in led.view(t).jobs}
            losses = led.lost(ev[1], t)
            fragments += len(ours)
            for loss in losses:
                lo = JOBS[loss.job][0]
                assert loss.stopped == below_min(before[loss.job] - len(loss.lost), lo)
                assert led.count(loss.job) == (0 if loss.stopped else before[loss.job] - len(loss.lost))
                assert led.job(loss.job).last_interrupted == t
        elif kind == "submit":
            if ev[1] not in {j.id for j in led.view(t).jobs}:
                lo, hi = JOBS[ev[1]]
                led.submitted(JobView(ev[1], lo, hi))
        elif ev[1] in {j.id for j in led.view(t).jobs}:
            if kind == "end":
                led.ended(ev[1])
            elif kind == "release":
                own = led.nodes_of(ev[1])
                loss = led.released(ev[1], ev[2], t)
                left = [n for n in own if n not in ev[2]]
                assert loss.lost == tuple(n for n in own if n in ev[2])
                assert loss.stopped == below_min(len(left), JOBS[ev[1]][0])
                assert led.nodes_of(ev[1]) == (() if loss.stopped else tuple(left))
                assert all(led.idle_since(n) is not None for n in own)  # still ours
            else:  # keep some of its nodes, take free ones up to ev[2] nodes in all (at most its max)
                own, free = led.nodes_of(ev[1]), led.free_nodes()
                want = min(ev[2], JOBS[ev[1]][1])
                new = (own + free)[:want]
                before = led.job(ev[1])
                changed = led.placed(ev[1], new, t)
                assert changed == interrupts(own, new)
                assert led.job(ev[1]).last_interrupted == (t if changed else before.last_interrupted)
        # invariants: every usable node is free or held by exactly one job, and the view is one the
        # policy accepts
        view = led.view(t)
        check_view(view)
        held = [n for j in view.jobs for n in j.nodes]
        assert len(held) + led.n_free == led.n_usable <= led.n_idle
        assert all(led.holder(n) == j.id for j in view.jobs for n in j.nodes)
        assert all(j.nodes == tuple(sorted(led.nodes_of(j.id))) for j in view.jobs)
        assert all(led.is_usable(n) for n in view.free_nodes)
    assert len(led.view(t).ended_fragments) == fragments
